#!/usr/bin/env python3
"""Small fuzz seeds derived from the real model files and reference data.

Writes into fuzz/seeds/<target>/ (committed; rerun to regenerate):
- gguf, gguf_tokenizer: a mini GGUF cut from SmolLM2-135M-Instruct.Q4_1.gguf
  (all scalar metadata, the tokenizer arrays cut to the first tokens and the
  merges among them, and a few real tensors of each type, F32 / Q4_1 / Q8_0,
  cut to two rows), its header prefix, and raw dequant inputs (type id byte +
  blocks) for every type that dequantizes;
- safetensors: a mini file cut from all-MiniLM-L6-v2's model.safetensors
  (a few real tensors with their data), and its header prefix;
- bert_config: the real config.json NUL sentence_bert_config.json, and the
  issue #21 mutations of them;
- reference_json: tests/data/smollm2_logits.json and a cut-down
  minilm_embeddings.json.

Seeds from the hand-built valid and corrupt files of the rlx-formats tests
come from fuzz/make_seeds.sh (which also runs this). Models: $RLX_MODELS_DIR
or ~/.cache/rlx/models (scripts/fetch_models.py all).
"""
import json
import os
import struct
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SEEDS = ROOT / "fuzz" / "seeds"
MODELS = Path(os.environ.get("RLX_MODELS_DIR", Path.home() / ".cache/rlx/models"))
GGUF = MODELS / "smollm2-135m-instruct/SmolLM2-135M-Instruct.Q4_1.gguf"
MINILM = MODELS / "all-minilm-l6-v2"

# ggml type id -> (block elems, block bytes), for the types rlx dequantizes.
BLOCKS = {
    0: (1, 4), 1: (1, 2), 30: (1, 2), 2: (32, 18), 3: (32, 20), 6: (32, 22),
    7: (32, 24), 8: (32, 34), 10: (256, 84), 11: (256, 110), 12: (256, 144),
    13: (256, 176), 14: (256, 210), 15: (256, 292),
}


def out(target, name, data):
    d = SEEDS / target
    d.mkdir(parents=True, exist_ok=True)
    (d / name).write_bytes(data)


# ---------------------------------------------------------------- GGUF
class Reader:
    def __init__(self, buf):
        self.buf, self.pos = buf, 0

    def take(self, n):
        s = self.buf[self.pos:self.pos + n]
        self.pos += n
        return s

    def u32(self):
        return struct.unpack("<I", self.take(4))[0]

    def u64(self):
        return struct.unpack("<Q", self.take(8))[0]

    def string(self):
        return self.take(self.u64())

    SIZES = {0: 1, 1: 1, 7: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 10: 8, 11: 8, 12: 8}

    def value(self, ty):
        """Returns the raw payload of a value (an array as (elem, [payloads]))."""
        if ty in self.SIZES:
            return self.take(self.SIZES[ty])
        if ty == 8:
            n = self.u64()
            return struct.pack("<Q", n) + self.take(n)
        assert ty == 9
        elem = self.u32()
        n = self.u64()
        return (elem, [self.value(elem) for _ in range(n)])


def enc_value(ty, v):
    if ty != 9:
        return v
    elem, items = v
    return struct.pack("<IQ", elem, len(items)) + b"".join(enc_value(elem, x) for x in items)


def gstr(b):
    return struct.pack("<Q", len(b)) + b


def write_gguf(kvs, tensors, alignment=32):
    """kvs: [(key, type, payload)]; tensors: [(name, dims, type, data)]."""
    o = bytearray(b"GGUF" + struct.pack("<IQQ", 3, len(tensors), len(kvs)))
    for k, ty, v in kvs:
        o += gstr(k) + struct.pack("<I", ty) + enc_value(ty, v)
    off = 0
    offs = []
    for name, dims, ty, data in tensors:
        o += gstr(name) + struct.pack("<I", len(dims))
        o += b"".join(struct.pack("<Q", d) for d in dims)
        o += struct.pack("<IQ", ty, off)
        offs.append(off)
        off = (off + len(data) + alignment - 1) // alignment * alignment
    while len(o) % alignment:
        o.append(0)
    base = len(o)
    for (name, dims, ty, data), t_off in zip(tensors, offs):
        o += b"\0" * (base + t_off - len(o)) + data
    while len(o) % alignment:
        o.append(0)
    return bytes(o)


def gguf_seeds():
    if not GGUF.exists():
        print(f"skipped GGUF seeds: {GGUF} missing", file=sys.stderr)
        return
    buf = GGUF.read_bytes()
    out("gguf", "smollm2-header-4k.gguf", buf[:4096])
    r = Reader(buf)
    assert r.take(4) == b"GGUF"
    r.u32()
    n_t, n_kv = r.u64(), r.u64()
    kvs = []
    for _ in range(n_kv):
        k = r.string()
        ty = r.u32()
        kvs.append((k, ty, r.value(ty)))
    infos = []
    for _ in range(n_t):
        name = r.string()
        nd = r.u32()
        dims = [r.u64() for _ in range(nd)]
        ty, off = r.u32(), r.u64()
        infos.append((name, dims, ty, off))
    align = 32
    data_start = (r.pos + align - 1) // align * align

    # Tokenizer arrays cut to the first N tokens and the merges among them.
    n_tok = 400
    kv = {k: (ty, v) for k, ty, v in kvs}
    tokens = [t[8:] for t in kv[b"tokenizer.ggml.tokens"][1][1]][:n_tok]
    have = set(tokens)
    merges = []
    for m in kv[b"tokenizer.ggml.merges"][1][1]:
        parts = m[8:].split(b" ")
        if len(parts) == 2 and parts[0] in have and parts[1] in have and parts[0] + parts[1] in have:
            merges.append(m)
    small = []
    for k, ty, v in kvs:
        if k == b"tokenizer.ggml.tokens" or k == b"tokenizer.ggml.token_type":
            v = (v[0], v[1][:n_tok])
        elif k == b"tokenizer.ggml.merges":
            v = (v[0], merges)
        elif ty == 9 and len(v[1]) > 64:
            v = (v[0], v[1][:64])
        small.append((k, ty, v))

    # A few real tensors of each type, cut to two rows.
    picked, seen = [], {}
    for name, dims, ty, off in infos:
        if seen.get(ty, 0) >= 2 or ty not in BLOCKS:
            continue
        seen[ty] = seen.get(ty, 0) + 1
        be, bb = BLOCKS[ty]
        rows = 1 if len(dims) == 1 else 2
        row_bytes = dims[0] // be * bb
        cut = [dims[0]] + ([rows] if len(dims) > 1 else [])
        start = data_start + off
        picked.append((name, cut, ty, buf[start:start + rows * row_bytes]))
    full = write_gguf(small, picked)
    out("gguf", "smollm2-mini.gguf", full)
    no_tok = [x for x in small if not x[0].startswith(b"tokenizer.")]
    out("gguf", "smollm2-mini-no-tokenizer.gguf", write_gguf(no_tok, picked))
    tok_only = write_gguf([x for x in small if x[0].startswith(b"tokenizer.") or x[0] == b"general.architecture"], [])
    print(f"gguf mini {len(full)} B ({len(tokens)} tokens, {len(merges)} merges, {len(picked)} tensors)")
    for i, text in enumerate([b"Once upon a time, there was a little robot who", b"123 + 4567 = ?\n\tdone",
                 "héllo wörld 日本".encode(), b"<|im_start|>user\nhi<|im_end|>", b""]):
        out("gguf_tokenizer", f"text{i}.bin", struct.pack("<H", len(text)) + text + tok_only)
    # Raw dequantization inputs: type id byte, then real-looking blocks.
    for ty, (be, bb) in BLOCKS.items():
        blocks = bytes((i * 37 + ty) & 0xFF for i in range(bb * 2))
        out("gguf", f"raw-type{ty}.bin", bytes([ty]) + blocks)
    for name, cut, ty, data in picked[:6]:
        out("gguf", f"raw-real-type{ty}-{name.decode()}.bin", bytes([ty]) + data[:4 * BLOCKS[ty][1]])


# ---------------------------------------------------------------- safetensors
def safetensors_seeds():
    path = MINILM / "model.safetensors"
    if not path.exists():
        print(f"skipped safetensors seeds: {path} missing", file=sys.stderr)
        return
    buf = path.read_bytes()
    (hlen,) = struct.unpack("<Q", buf[:8])
    header = json.loads(buf[8:8 + hlen])
    out("safetensors", "minilm-header-prefix.safetensors", buf[:8 + min(hlen, 2048)])
    keep = ["embeddings.position_ids", "embeddings.LayerNorm.weight",
            "encoder.layer.0.attention.self.query.bias", "pooler.dense.bias"]
    new_header, data, off = {}, b"", 0
    for name in keep:
        if name not in header:
            continue
        info = header[name]
        s, e = info["data_offsets"]
        chunk = buf[8 + hlen + s:8 + hlen + e]
        new_header[name] = {"dtype": info["dtype"], "shape": info["shape"], "data_offsets": [off, off + len(chunk)]}
        data += chunk
        off += len(chunk)
    new_header["__metadata__"] = header.get("__metadata__", {"format": "pt"})
    h = json.dumps(new_header).encode()
    h += b" " * (-len(h) % 8)
    out("safetensors", "minilm-mini.safetensors", struct.pack("<Q", len(h)) + h + data)


# ---------------------------------------------------------------- configs
def bert_config_seeds():
    cfg_p, st_p = MINILM / "config.json", MINILM / "sentence_bert_config.json"
    if cfg_p.exists():
        cfg, st = json.loads(cfg_p.read_text()), json.loads(st_p.read_text())
    else:  # the values the reference README lists
        cfg = {"architectures": ["BertModel"], "hidden_act": "gelu", "hidden_size": 384,
               "intermediate_size": 1536, "layer_norm_eps": 1e-12, "max_position_embeddings": 512,
               "model_type": "bert", "num_attention_heads": 12, "num_hidden_layers": 6,
               "type_vocab_size": 2, "vocab_size": 30522}
        st = {"max_seq_length": 256, "do_lower_case": False}

    def seed(name, c, s):
        body = json.dumps(c, indent=1).encode()
        if s is not None:
            body += b"\0" + (s if isinstance(s, bytes) else json.dumps(s).encode())
        out("bert_config", name, body)

    seed("minilm.json", cfg, st)
    seed("minilm-no-st.json", cfg, None)
    for key, val in [("num_attention_heads", 0), ("num_hidden_layers", 10000000),
                     ("layer_norm_eps", -1), ("hidden_size", 0), ("vocab_size", 2**64 - 1),
                     ("hidden_act", "swish"), ("model_type", "gpt2")]:
        seed(f"{key}-{val}.json", {**cfg, key: val}, st)
    seed("st-max_seq_length-abc.json", cfg, {**st, "max_seq_length": "abc"})
    seed("st-max_seq_length--5.json", cfg, {**st, "max_seq_length": -5})
    seed("st-not-json.json", cfg, b"{not json")


def reference_seeds():
    data = ROOT / "crates/rlx-models/tests/data"
    out("reference_json", "smollm2_logits.json", (data / "smollm2_logits.json").read_bytes())
    m = json.loads((data / "minilm_embeddings.json").read_text())
    small = {k: v for k, v in m.items() if not isinstance(v, list)}
    small["sentences"] = m["sentences"][:2]
    small["token_ids"] = m["token_ids"][:2]
    small["embeddings"] = [e[:8] for e in m["embeddings"][:2]]
    out("reference_json", "minilm_embeddings-cut.json", json.dumps(small).encode())


if __name__ == "__main__":
    gguf_seeds()
    safetensors_seeds()
    bert_config_seeds()
    reference_seeds()
