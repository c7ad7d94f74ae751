#!/usr/bin/env python3
"""Generate dequantization test vectors for rlx-formats.

For each ggml block type this writes crates/rlx-formats/tests/data/quant/<TYPE>.json:

    {"type": "Q4_K", "type_id": 12, "n_elems": 2048, "producer": "...",
     "bytes": "<hex of the raw blocks>", "values": "<hex of little-endian f32 results>"}

Raw blocks come from the PyPI `gguf` package's `gguf.quants.quantize` where it
supports the type (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, BF16), followed by random blocks
whose f16 scale fields hold valid (finite) f16 values, so every bit pattern of
the quant fields is exercised. The expected values are `gguf.quants.dequantize`
of those bytes (numpy's float16/float32 arithmetic, which mirrors ggml's
reference `dequantize_row_*`).

Q8_K has no implementation in `gguf.quants`; its values are computed here with
numpy from ggml's layout (`d: f32, qs: i8[256], bsums: i16[16]`, x = d * q).

Usage: python3 scripts/gen_quant_vectors.py   (creates/uses .venv-tools)
"""

import json
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
VENV = os.path.join(ROOT, ".venv-tools")
VENV_PY = os.path.join(VENV, "bin", "python")
OUT_DIR = os.path.join(ROOT, "crates", "rlx-formats", "tests", "data", "quant")


def ensure_venv():
    """Re-executes this script inside .venv-tools with numpy and gguf installed."""
    if os.path.abspath(sys.prefix) == os.path.abspath(VENV):
        return
    if not os.path.exists(VENV_PY):
        subprocess.check_call([sys.executable, "-m", "venv", VENV])
    subprocess.check_call([VENV_PY, "-m", "pip", "install", "-q", "numpy", "gguf"])
    os.execv(VENV_PY, [VENV_PY, os.path.abspath(__file__)] + sys.argv[1:])


ensure_venv()

import numpy as np  # noqa: E402
import gguf  # noqa: E402
from gguf import GGMLQuantizationType as T  # noqa: E402
from gguf.constants import GGML_QUANT_SIZES  # noqa: E402
import gguf.quants as Q  # noqa: E402

try:
    from importlib.metadata import version

    GGUF_VERSION = version("gguf")
except Exception:  # pragma: no cover
    GGUF_VERSION = "unknown"

RNG = np.random.default_rng(20240611)

# Byte offsets of f16 scale fields inside one block.
F16_FIELDS = {
    T.Q4_0: [0],
    T.Q4_1: [0, 2],
    T.Q5_0: [0],
    T.Q5_1: [0, 2],
    T.Q8_0: [0],
    T.Q2_K: [80, 82],
    T.Q3_K: [108],
    T.Q4_K: [0, 2],
    T.Q5_K: [0, 2],
    T.Q6_K: [208],
}

QUANTIZABLE = [T.Q4_0, T.Q4_1, T.Q5_0, T.Q5_1, T.Q8_0]
RANDOM_ONLY = [T.Q2_K, T.Q3_K, T.Q4_K, T.Q5_K, T.Q6_K]


def scale_values(n):
    """n f16 scales: mostly normal magnitudes, plus negative, zero and subnormal."""
    v = (RNG.standard_normal(n) * 0.05).astype(np.float16)
    special = np.array([0.0, -0.0, 6e-8, -3e-6, 1.0, -2.5, 65504.0], dtype=np.float16)
    k = min(n, len(special))
    v[:k] = special[:k]
    RNG.shuffle(v)
    return v


def random_blocks(qtype, n_blocks):
    """Random block bytes with finite f16 values in every scale field."""
    _, type_size = GGML_QUANT_SIZES[qtype]
    b = RNG.integers(0, 256, size=(n_blocks, type_size), dtype=np.uint8)
    fields = F16_FIELDS[qtype]
    scales = scale_values(n_blocks * len(fields)).reshape(n_blocks, len(fields))
    for j, off in enumerate(fields):
        b[:, off : off + 2] = scales[:, j : j + 1].view(np.uint8)
    return b


def quantized_blocks(qtype, n_blocks):
    block_size, _ = GGML_QUANT_SIZES[qtype]
    x = (RNG.standard_normal((n_blocks, block_size)) * RNG.uniform(0.01, 3.0, (n_blocks, 1))).astype(np.float32)
    x[0, :] = 0.0  # an all-zero block (d = 0)
    return Q.quantize(x, qtype).reshape(n_blocks, -1)


def write(name, type_id, raw, values, producer):
    raw = np.ascontiguousarray(raw, dtype=np.uint8)
    values = np.ascontiguousarray(values, dtype="<f4").reshape(-1)
    doc = {
        "type": name,
        "type_id": int(type_id),
        "n_elems": int(values.size),
        "producer": producer,
        "bytes": raw.tobytes().hex(),
        "values": values.tobytes().hex(),
    }
    path = os.path.join(OUT_DIR, f"{name}.json")
    with open(path, "w") as f:
        json.dump(doc, f, indent=0)
        f.write("\n")
    print(f"{name:5s} {values.size:5d} elems {raw.size:6d} bytes -> {os.path.relpath(path, ROOT)}")


def main():
    os.makedirs(OUT_DIR, exist_ok=True)
    pkg = f"gguf {GGUF_VERSION} (PyPI), numpy {np.__version__}"

    for qtype in QUANTIZABLE:
        raw = np.concatenate([quantized_blocks(qtype, 8), random_blocks(qtype, 8)], axis=0)
        vals = Q.dequantize(raw, qtype)
        write(qtype.name, qtype.value, raw, vals,
              f"{pkg}: gguf.quants.quantize (8 blocks) + random blocks (8); values from gguf.quants.dequantize")

    for qtype in RANDOM_ONLY:
        raw = random_blocks(qtype, 8)
        vals = Q.dequantize(raw, qtype)
        write(qtype.name, qtype.value, raw, vals,
              f"{pkg}: random blocks with finite f16 scales; values from gguf.quants.dequantize")

    # Q8_K: no gguf.quants implementation; ggml layout computed with numpy.
    n_blocks = 4
    d = (RNG.standard_normal(n_blocks) * 0.01).astype(np.float32)
    d[0] = np.float32(1.5e-40)  # f32 subnormal scale
    qs = RNG.integers(-128, 128, size=(n_blocks, 256), dtype=np.int8)
    bsums = qs.reshape(n_blocks, 16, 16).astype(np.int16).sum(axis=-1, dtype=np.int16)
    raw = np.concatenate(
        [d.reshape(n_blocks, 1).view(np.uint8), qs.view(np.uint8), bsums.astype("<i2").view(np.uint8)], axis=1
    )
    assert raw.shape[1] == GGML_QUANT_SIZES[T.Q8_K][1]
    vals = d.reshape(n_blocks, 1) * qs.astype(np.float32)
    write("Q8_K", T.Q8_K.value, raw, vals, f"numpy {np.__version__}: ggml block_q8_K layout, x = d * q")

    # BF16: quantize (round-to-nearest-even) plus random finite bit patterns.
    x = (RNG.standard_normal(64) * 10).astype(np.float32)
    raw_q = Q.quantize(x, T.BF16).view(np.uint8).reshape(1, -1)
    bits = RNG.integers(0, 1 << 16, size=64, dtype=np.uint16)
    bits = bits[(bits & 0x7F80) != 0x7F80][:48]  # drop inf/nan
    raw_r = bits.astype("<u2").view(np.uint8).reshape(1, -1)
    raw = np.concatenate([raw_q, raw_r], axis=1)
    vals = Q.dequantize(raw, T.BF16)
    write("BF16", T.BF16.value, raw, vals, f"{pkg}: gguf.quants.quantize + random finite bit patterns; gguf.quants.dequantize")

    # F16: random values incl. subnormals, via numpy float16.
    h = np.concatenate([(RNG.standard_normal(60) * 100).astype(np.float16),
                        np.array([6e-8, -6e-8, 65504.0, -0.0], dtype=np.float16)])
    raw = h.astype("<f2").view(np.uint8).reshape(1, -1)
    vals = Q.dequantize(raw, T.F16)
    write("F16", T.F16.value, raw, vals, f"{pkg}: gguf.quants.dequantize (numpy float16 -> float32)")

    # F32: identity.
    f = (RNG.standard_normal(32) * 1e3).astype("<f4")
    raw = f.view(np.uint8).reshape(1, -1)
    vals = Q.dequantize(raw, T.F32)
    write("F32", T.F32.value, raw, vals, f"{pkg}: gguf.quants.dequantize (identity)")


if __name__ == "__main__":
    main()
