"""Reference data for the GatedDeltaNet hybrids: Qwen3-Next (`qwen3_next`)
and Qwen3.5's text model (`qwen3_5_text`), random-initialized small configs
built by transformers itself.

Each family function writes, under crates/rlx-models/tests/data/families/<name>/:
- `config.json` and `model.safetensors` (float32, `save_pretrained`);
- `reference.json`: per prompt (token ids) transformers' logits at every
  prompt position, 24 greedy ids (generate, with its cache: prefill with the
  chunked gated delta rule, then one-token decode with the recurrent rule),
  and the versions used.

transformers' torch implementations of the gated delta rule and the causal
conv1d run (`torch_chunk_gated_delta_rule`, `torch_recurrent_gated_delta_rule`,
`causal_conv1d_fn`/`_update`): no fla / causal-conv1d kernels are installed
in the pinned venv, and the script checks that.
"""

import json
import os
import sys

import torch

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
OUT = os.path.join(ROOT, "crates", "rlx-models", "tests", "data", "families")

PROMPTS = [
    [5, 17, 200, 3, 99, 42, 7, 128],
    [1, 2, 3],
    [250, 11, 64, 64, 64, 9, 0, 31, 77, 150, 201, 33],
]
GREEDY_TOKENS = 24


def _no_fast_kernels():
    for mod in ("fla", "causal_conv1d"):
        try:
            __import__(mod)
        except ImportError:
            continue
        sys.exit(f"{mod} is installed: the reference must come from transformers' torch path")


def _perturb(model, seed):
    """Random-init leaves RMSNorm weights at 0 (the (1 + w) convention) and
    the gated norm at 1; give every parameter some spread so that the
    conventions (1 + w vs w, gate activations, A_log, dt_bias) are tested."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("A_log"):
                # A in (0.3, 3): decays that neither vanish nor saturate.
                p.copy_(torch.empty(p.shape).uniform_(0.3, 3.0, generator=g).log())
            elif name.endswith("dt_bias"):
                p.copy_(torch.randn(p.shape, generator=g) * 0.5)
            elif "norm" in name:
                p.add_(torch.randn(p.shape, generator=g) * 0.2)


def _write(name, model, config_dict):
    import transformers

    out = os.path.join(OUT, name)
    os.makedirs(out, exist_ok=True)
    model.save_pretrained(out, safe_serialization=True)
    model.eval()
    refs = []
    with torch.no_grad():
        for ids in PROMPTS:
            x = torch.tensor([ids])
            logits = model(x, use_cache=False).logits[0]
            # An explicit all-ones mask: generate would otherwise mask
            # every token equal to pad_token_id (prompt 3 holds id 0).
            gen = model.generate(
                x,
                attention_mask=torch.ones_like(x),
                max_new_tokens=GREEDY_TOKENS,
                min_new_tokens=GREEDY_TOKENS,
                do_sample=False,
                use_cache=True,
                pad_token_id=0,
            )[0, len(ids):].tolist()
            refs.append(
                {
                    "prompt_ids": ids,
                    "logits": [[round(float(v), 7) for v in row] for row in logits],
                    "greedy_ids": gen,
                }
            )
    data = {
        "family": name,
        "model_type": config_dict["model_type"],
        "versions": {
            "transformers": transformers.__version__,
            "torch": torch.__version__,
        },
        "dtype": "float32",
        "note": "random-init config; logits at every prompt position; greedy with the cache",
        "prompts": refs,
    }
    with open(os.path.join(out, "reference.json"), "w") as f:
        json.dump(data, f)
    size = sum(os.path.getsize(os.path.join(out, p)) for p in os.listdir(out))
    print(f"[gdn] {name}: {out} ({size} bytes)")


def qwen3_next():
    """Qwen3-Next: 3 GDN layers + 1 gated full-attention layer, MoE FFN
    (4 experts, top-2, normalized, shared expert with sigmoid gate) and one
    dense-MLP layer (mlp_only_layers)."""
    from transformers import Qwen3NextConfig, Qwen3NextForCausalLM

    _no_fast_kernels()
    torch.manual_seed(0)
    cfg = Qwen3NextConfig(
        vocab_size=256,
        hidden_size=64,
        intermediate_size=96,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=32,
        linear_conv_kernel_dim=4,
        linear_key_head_dim=16,
        linear_value_head_dim=16,
        linear_num_key_heads=2,
        linear_num_value_heads=4,
        decoder_sparse_step=1,
        moe_intermediate_size=32,
        shared_expert_intermediate_size=48,
        num_experts_per_tok=2,
        num_experts=4,
        norm_topk_prob=True,
        mlp_only_layers=[1],
        layer_types=["linear_attention", "linear_attention", "linear_attention", "full_attention"],
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.25},
        rms_norm_eps=1e-6,
        initializer_range=0.1,
        tie_word_embeddings=False,
        max_position_embeddings=256,
        attn_implementation="eager",
    )
    model = Qwen3NextForCausalLM(cfg).float()
    _perturb(model, 1)
    _write("qwen3_next", model, cfg.to_dict())


def qwen3_5():
    """Qwen3.5's text decoder (`qwen3_5_text`): separate in_proj_qkv / z / b / a,
    dense MLP, 3 GDN layers + 1 gated full-attention layer."""
    from transformers import Qwen3_5ForCausalLM, Qwen3_5TextConfig

    _no_fast_kernels()
    torch.manual_seed(0)
    cfg = Qwen3_5TextConfig(
        vocab_size=256,
        hidden_size=64,
        intermediate_size=96,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=32,
        linear_conv_kernel_dim=4,
        linear_key_head_dim=16,
        linear_value_head_dim=16,
        linear_num_key_heads=2,
        linear_num_value_heads=4,
        layer_types=["linear_attention", "linear_attention", "linear_attention", "full_attention"],
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.25},
        rms_norm_eps=1e-6,
        initializer_range=0.1,
        tie_word_embeddings=False,
        max_position_embeddings=256,
        attn_implementation="eager",
    )
    model = Qwen3_5ForCausalLM(cfg).float()
    _perturb(model, 2)
    _write("qwen3_5", model, cfg.to_dict())


FAMILIES = {"qwen3_next": qwen3_next, "qwen3_5": qwen3_5}
