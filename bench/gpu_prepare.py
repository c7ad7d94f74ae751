"""Pack what the GPU machine needs into .gpu/ (git-excluded), under 64 MiB.

The GPU machine has no network and the device tool carries at most 64 MiB,
while all-MiniLM-L6-v2's fp32 safetensors is 87 MiB. The word-embedding table
(47 MiB) is therefore shipped with only the rows that the reference sentences
(crates/rlx-models/tests/data/minilm_embeddings.json) and the special tokens
use; every other row is zero. Parity checks read only kept rows; the
benchmark's timing does not depend on the values. Everything else is exact.

Usage (from the repo root, after the builds):
    python3 bench/gpu_prepare.py <rlx binary> <test binary>...

The bundle goes to $RLX_GPU_OUT (default .gpu)/bundle.tar.gz, with the test
binaries under stage/tests/ named without cargo's hash suffix
(bench/gpu_run_minilm.sh runs them all, then the benchmark).
"""
import gzip
import json
import os
import shutil
import struct
import subprocess
import sys
import tarfile

SRC = os.path.expanduser(os.environ.get("RLX_MODELS_DIR", "~/.cache/rlx/models"))
MODEL = "all-minilm-l6-v2"


def trimmed_safetensors(src, dst, keep):
    with open(src, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        header_bytes = f.read(n)
        data = bytearray(f.read())
    header = json.loads(header_bytes)
    t = header["embeddings.word_embeddings.weight"]
    assert t["dtype"] == "F32"
    vocab, hidden = t["shape"]
    lo, _ = t["data_offsets"]
    row = hidden * 4
    for r in range(vocab):
        if r not in keep:
            data[lo + r * row: lo + (r + 1) * row] = bytes(row)
    with open(dst, "wb") as f:
        f.write(struct.pack("<Q", n))
        f.write(header_bytes)
        f.write(data)


def main():
    rlx_bin, test_bins = sys.argv[1], sys.argv[2:]
    out = os.environ.get("RLX_GPU_OUT", ".gpu")
    stage = os.path.join(out, "stage")
    shutil.rmtree(stage, ignore_errors=True)
    os.makedirs(os.path.join(stage, "models", MODEL), exist_ok=True)
    ref = json.load(open("crates/rlx-models/tests/data/minilm_embeddings.json"))
    keep = {0, 100, 101, 102, 103}
    for ids in ref["token_ids"]:
        keep.update(ids)
    src_dir = os.path.join(SRC, MODEL)
    for name in os.listdir(src_dir):
        p = os.path.join(src_dir, name)
        if name == "model.safetensors":
            trimmed_safetensors(p, os.path.join(stage, "models", MODEL, name), keep)
        elif os.path.isdir(p):
            shutil.copytree(p, os.path.join(stage, "models", MODEL, name))
        else:
            shutil.copy(p, os.path.join(stage, "models", MODEL, name))
    shutil.copy(rlx_bin, os.path.join(stage, "rlx"))
    os.makedirs(os.path.join(stage, "tests"), exist_ok=True)
    bins = [os.path.join(stage, "rlx")]
    for t in test_bins:
        name = os.path.basename(t).rsplit("-", 1)[0]
        bins.append(os.path.join(stage, "tests", name))
        shutil.copy(t, bins[-1])
    subprocess.run(["strip", *bins], check=True)
    bundle = os.path.join(out, "bundle.tar.gz")
    with tarfile.open(bundle, "w:gz", compresslevel=6) as tar:
        tar.add(stage, arcname="stage")
    shutil.rmtree(stage)
    print(f"{bundle}: {os.path.getsize(bundle) / 2**20:.1f} MiB, {len(keep)} word rows kept")


if __name__ == "__main__":
    main()
