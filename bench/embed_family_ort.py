#!/usr/bin/env python3
"""A sentence-transformers model on the CPU: rlx versus ONNX Runtime, for the
real embedders other than MiniLM (MiniLM has bench/minilm_ort.py).

    bench/.venv-serve/bin/optimum-cli export onnx --model ~/.cache/rlx/models/all-mpnet-base-v2 \\
        --task feature-extraction --opset 17 target/onnx-mpnet
    bench/.venv/bin/python bench/embed_family_ort.py --name mpnet \\
        --model-dir ~/.cache/rlx/models/all-mpnet-base-v2 --onnx target/onnx-mpnet/model.onnx \\
        --reference crates/rlx-models/tests/data/mpnet_reference.json

ORT runs the optimum export (token states out); mean pooling over the mask
and L2 normalization follow in numpy inside the timed call, as
sentence-transformers' modules do (the script refuses other poolings). Before
timing, ORT's embeddings of the reference token ids are checked against the
sentence-transformers reference (cosine >= 0.99999), so both engines compute
the same model. rlx runs `rlx bench --model DIR --json` (thunks and hybrid),
interleaved with ORT per round and shape; medians over rounds x runs.
Writes bench/results/<name>_cpu.{json,md}.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import onnxruntime as ort

sys.path.insert(0, str(Path(__file__).resolve().parent))
from minilm_ort import RlxRunner, cpu_flags, machine_info, median  # noqa: E402

REPO = Path(__file__).resolve().parent.parent
MODES = ["thunks", "hybrid"]


def session(path: Path, threads: int) -> ort.InferenceSession:
    so = ort.SessionOptions()
    so.intra_op_num_threads = threads
    so.inter_op_num_threads = 1
    so.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    return ort.InferenceSession(str(path), so, providers=["CPUExecutionProvider"])


def embed(sess: ort.InferenceSession, ids: np.ndarray, mask: np.ndarray) -> np.ndarray:
    feeds = {"input_ids": ids, "attention_mask": mask}
    names = {i.name for i in sess.get_inputs()}
    if "token_type_ids" in names:
        feeds["token_type_ids"] = np.zeros_like(ids)
    tokens = sess.run(None, feeds)[0]
    m = mask[:, :, None].astype(np.float32)
    pooled = (tokens * m).sum(1) / np.maximum(m.sum(1), 1e-9)
    return pooled / np.maximum(np.linalg.norm(pooled, axis=1, keepdims=True), 1e-12)


def check(sess: ort.InferenceSession, reference: Path) -> float:
    ref = json.loads(reference.read_text())
    worst = 1.0
    for case in ref["cases"]:
        ids = np.asarray([case["ids"]], dtype=np.int64)
        got = embed(sess, ids, np.ones_like(ids))[0]
        want = np.asarray(case["embedding"], dtype=np.float64)
        cos = float(got @ want / (np.linalg.norm(got) * np.linalg.norm(want)))
        worst = min(worst, cos)
    if worst < 0.99999:
        raise SystemExit(f"ORT export disagrees with the reference: worst cosine {worst}")
    return worst


def time_ort(sess, ids, mask, iters, warmup) -> list[float]:
    for _ in range(warmup):
        embed(sess, ids, mask)
    out = []
    for _ in range(iters):
        t0 = time.perf_counter()
        embed(sess, ids, mask)
        out.append((time.perf_counter() - t0) * 1e3)
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--name", required=True, help="result file stem, e.g. mpnet")
    ap.add_argument("--model-dir", type=Path, required=True)
    ap.add_argument("--onnx", type=Path, required=True)
    ap.add_argument("--reference", type=Path, required=True)
    ap.add_argument("--rlx-bin", type=Path, default=REPO / "target" / "release" / "rlx")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--iters", type=int, default=5)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--shapes", default="1x128,8x128")
    ap.add_argument("--out-dir", type=Path, default=REPO / "bench" / "results")
    args = ap.parse_args()

    pooling = json.loads((args.model_dir / "1_Pooling" / "config.json").read_text())
    if not pooling.get("pooling_mode_mean_tokens") or any(
        pooling.get(k) for k in ("pooling_mode_cls_token", "pooling_mode_max_tokens", "pooling_mode_mean_sqrt_len_tokens")
    ):
        raise SystemExit(f"{args.model_dir}: only mean pooling is timed here; found {pooling}")
    sess = session(args.onnx, args.threads)
    worst = check(sess, args.reference)
    print(f"[ort] {args.onnx}: worst cosine vs reference {worst:.7f}", flush=True)
    rlx = RlxRunner(args.rlx_bin, args.model_dir, args.threads, 900.0)
    rng = np.random.default_rng(0)
    load_before = os.getloadavg()
    rows = []
    for shape in args.shapes.split(","):
        b, s = (int(v) for v in shape.split("x"))
        ids = rng.integers(1000, 20000, size=(b, s), dtype=np.int64)
        mask = np.ones((b, s), dtype=np.int64)
        ort_t: list[float] = []
        rlx_t: dict[str, list[float]] = {m: [] for m in MODES}
        for r in range(args.rounds):
            order = ["ort", *MODES] if r % 2 == 0 else [*MODES, "ort"]
            for who in order:
                if who == "ort":
                    ort_t += time_ort(sess, ids, mask, args.iters, args.warmup)
                else:
                    out = rlx.run(b, s, who, args.iters, args.warmup)
                    if out:
                        rlx_t[who] += out["times_ms"]
            print(f"[{shape}] round {r}: ort {median(ort_t):.2f} ms, "
                  + ", ".join(f"rlx {m} {median(v):.2f}" for m, v in rlx_t.items() if v), flush=True)
        for m in MODES:
            rows.append({"shape": shape, "mode": m, "rlx_ms": median(rlx_t[m]) if rlx_t[m] else None,
                         "ort_ms": median(ort_t), "rlx_times_ms": rlx_t[m], "ort_times_ms": ort_t})
    load_after = os.getloadavg()
    commit = subprocess.run(["git", "-C", str(REPO), "rev-parse", "--short", "HEAD"],
                            capture_output=True, text=True).stdout.strip()
    meta = {"name": args.name, "model_dir": str(args.model_dir), "onnx": str(args.onnx),
            "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "machine": machine_info(), "cpu_flags": cpu_flags(), "rlx_isa": rlx.isa, "threads": args.threads,
            "rlx_commit": commit, "rounds": args.rounds, "iters": args.iters,
            "ort_worst_cosine_vs_reference": worst,
            "load_before": load_before, "load_after": load_after}
    args.out_dir.mkdir(parents=True, exist_ok=True)
    (args.out_dir / f"{args.name}_cpu.json").write_text(json.dumps({"meta": meta, "rows": rows}, indent=1) + "\n")
    lines = [f"# {args.name} on the CPU: rlx vs ONNX Runtime", "",
             f"- machine: {meta['machine']}; flags: {meta['cpu_flags']}; rlx ISA {meta['rlx_isa']}; "
             f"{args.threads} threads; rlx at {commit}; {meta['date']}",
             f"- ORT: the optimum export ({args.onnx.name}), ORT_ENABLE_ALL, mean pooling + L2 norm in numpy "
             f"inside the timed call; worst cosine vs the sentence-transformers reference {worst:.7f}",
             f"- medians over {args.rounds} interleaved rounds x {args.iters} runs; load average before / after "
             f"{load_before[0]:.2f} / {load_after[0]:.2f} (above the core count: other work shared the CPUs)", "",
             "| shape | rlx mode | rlx ms | ORT ms | rlx / ORT |", "|---|---|---:|---:|---:|"]
    for r in rows:
        ratio = f"{r['rlx_ms'] / r['ort_ms']:.2f}" if r["rlx_ms"] else "-"
        rlx_ms = f"{r['rlx_ms']:.2f}" if r["rlx_ms"] else "-"
        lines.append(f"| {r['shape']} | {r['mode']} | {rlx_ms} | {r['ort_ms']:.2f} | {ratio} |")
    lines += ["", "Lower is better; a ratio below 1 means rlx is faster."]
    (args.out_dir / f"{args.name}_cpu.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
