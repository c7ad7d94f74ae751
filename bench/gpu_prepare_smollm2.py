"""Pack SmolLM2-135M-Instruct (Q4_1 GGUF) for the GPU machine, in two parts.

The device tool carries at most 64 MiB per call and the GGUF is 94 MiB, of
which 29 MiB is the Q8_0 token embedding (tied to the output head) and
63 MiB Q4_1 layer weights that hardly compress (xz: about 95%). So:

- every row of `token_embd.weight` that the reference cases of
  crates/rlx-models/tests/data/smollm2_logits.json do not use (prompt ids,
  greedy ids, top-10 ids, and ids 0-2) is zeroed. Rows of kept tokens, the
  hidden states and every logit of a kept token are exact; a zeroed token's
  logit is exactly 0, below every reference top-1 logit (> 12), so greedy
  ids are unchanged. Timings do not depend on the values;
- the file is xz-compressed (Python's lzma, present on both machines) and
  split into two parts of about 31 MiB, carried by two runs (the first
  stashes its part on the machine).

Usage (repo root): python3 bench/gpu_prepare_smollm2.py OUT_DIR
writes OUT_DIR/smollm2.gguf.xz.part0 and .part1 and prints the sha256 of
the trimmed GGUF (checked on the device after reassembly).
"""
import hashlib
import json
import lzma
import os
import struct
import sys

SRC = os.path.expanduser(
    os.path.join(os.environ.get("RLX_MODELS_DIR", "~/.cache/rlx/models"),
                 "smollm2-135m-instruct/SmolLM2-135M-Instruct.Q4_1.gguf"))

# ggml type -> (block elements, block bytes)
BLOCKS = {0: (1, 4), 1: (1, 2), 2: (32, 18), 3: (32, 20), 8: (32, 34)}


def tensor_infos(data):
    """(name, dims, type, offset) of every tensor and the data start."""
    at = 0

    def take(n):
        nonlocal at
        b = data[at:at + n]
        at += n
        return b

    def u32():
        return struct.unpack("<I", take(4))[0]

    def u64():
        return struct.unpack("<Q", take(8))[0]

    def string():
        return take(u64()).decode("utf-8", "replace")

    sizes = {0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8}
    alignment = 32

    def value(t):
        if t == 8:
            return string()
        if t == 9:
            et, n = u32(), u64()
            if et in (8, 9):
                return [value(et) for _ in range(n)]
            take(sizes[et] * n)
            return None
        return take(sizes[t])

    assert take(4) == b"GGUF"
    u32()
    n_tensors, n_kv = u64(), u64()
    for _ in range(n_kv):
        key, t = string(), u32()
        v = value(t)
        if key == "general.alignment":
            alignment = struct.unpack("<I", v)[0]
    infos = []
    for _ in range(n_tensors):
        name = string()
        dims = [u64() for _ in range(u32())]
        t, off = u32(), u64()
        infos.append((name, dims, t, off))
    start = (at + alignment - 1) // alignment * alignment
    return infos, start


def main():
    out = sys.argv[1]
    os.makedirs(out, exist_ok=True)
    data = bytearray(open(SRC, "rb").read())
    infos, start = tensor_infos(data)
    ref = json.load(open("crates/rlx-models/tests/data/smollm2_logits.json"))
    keep = {0, 1, 2}
    for c in ref["cases"]:
        keep.update(c["prompt_ids"])
        keep.update(c["greedy_ids"])
        keep.update(i for i, _ in c["top10_next"])
    name, dims, t, off = next(i for i in infos if i[0] == "token_embd.weight")
    be, bb = BLOCKS[t]
    row = dims[0] // be * bb
    base = start + off
    for r in range(dims[1]):
        if r not in keep:
            data[base + r * row: base + (r + 1) * row] = bytes(row)
    trimmed = os.path.join(out, "smollm2.gguf")
    digest = hashlib.sha256(data).hexdigest()
    z = lzma.compress(bytes(data), preset=6)
    half = len(z) // 2
    for i, part in enumerate([z[:half], z[half:]]):
        open(f"{trimmed}.xz.part{i}", "wb").write(part)
    open(os.path.join(out, "smollm2.sha256"), "w").write(digest + "\n")
    print(f"{len(keep)} embedding rows kept; xz {len(z) / 2**20:.1f} MiB in 2 parts; sha256 {digest}")


if __name__ == "__main__":
    main()
