#!/usr/bin/env python3
"""all-MiniLM-L6-v2 on the CPU: rlx versus ONNX Runtime.

1. Builds the MiniLM sentence-embedding graph as ONNX directly from
   model.safetensors with onnx.helper (no torch): BERT embeddings
   (word + position + token_type, LayerNorm eps 1e-12), 6 encoder layers
   (12-head self-attention with an additive mask from attention_mask,
   exact-erf GELU FFN, post-LayerNorm), mean pooling over the mask and
   L2 normalization.
2. Checks its embeddings against the sentence-transformers reference in
   crates/rlx-models/tests/data/minilm_embeddings.json (reference token ids,
   each sentence alone and all 12 as one padded batch) within 1e-4, and prints
   the max error. The benchmark refuses to time a graph that fails the check.
3. Times ORT (intra_op_num_threads=2, inter_op_num_threads=1,
   ORT_ENABLE_ALL) and the rlx CLI (`rlx bench ... --json`, modes thunks,
   hybrid and hybrid with `--f16-weights`, 2 threads) at 1x16, 1x128, 8x128 and 32x128, interleaving rlx and
   ORT rounds per shape so machine noise hits both. Reports medians.
4. Writes bench/results/minilm_cpu.{json,md,png}.

Run bench/setup_venv.sh first, then:
    bench/.venv/bin/python bench/minilm_ort.py
If the rlx binary is missing or fails, rlx is recorded as null and the ORT
numbers are still written.
"""

from __future__ import annotations

import argparse
import datetime as _dt
import json
import math
import os
import platform
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper
from safetensors.numpy import load_file

REPO = Path(__file__).resolve().parent.parent
REF_JSON = REPO / "crates" / "rlx-models" / "tests" / "data" / "minilm_embeddings.json"
SHAPES = [(1, 16), (1, 128), (8, 128), (32, 128)]
MODES = ["thunks", "hybrid", "hybrid-f16w"]
# `rlx bench` flags per mode: hybrid-f16w is hybrid with the opt-in f16
# weight storage (`--f16-weights`: embeddings within 1e-4 of the fp32
# reference, see crates/rlx-models/tests/minilm_parity.rs); hybrid-bf16 runs
# the matmuls in bf16 with f32 accumulation (`--precision bf16`: cosine >=
# 0.9999 to the reference; AVX512-BF16 where the CPU has it). Not in the
# default MODES: pass `--modes thunks,hybrid,hybrid-bf16`.
MODE_FLAGS = {"thunks": ["--mode", "thunks"], "hybrid": ["--mode", "hybrid"],
              "hybrid-f16w": ["--mode", "hybrid", "--f16-weights"],
              "hybrid-bf16": ["--mode", "hybrid", "--precision", "bf16"]}
TOL = 1e-4

HIDDEN = 384
LAYERS = 6
HEADS = 12
HEAD_DIM = HIDDEN // HEADS
FFN = 1536
LN_EPS = 1e-12
VOCAB = 30522


def disp(path: Path | str) -> str:
    """A path as shown in messages and committed results: repo-relative or ~-relative."""
    p = Path(path)
    for base, label in ((REPO, ""), (Path.home(), "~/")):
        try:
            return label + str(p.resolve().relative_to(base.resolve()))
        except ValueError:
            continue
    return str(p)


def default_model_dir() -> Path:
    root = os.environ.get("RLX_MODELS_DIR")
    base = Path(root).expanduser() if root else Path.home() / ".cache" / "rlx" / "models"
    return base / "all-minilm-l6-v2"


# --------------------------------------------------------------------------
# ONNX graph construction
# --------------------------------------------------------------------------


class GraphBuilder:
    """Small helper that names nodes and initializers uniquely."""

    def __init__(self) -> None:
        self.nodes: list[onnx.NodeProto] = []
        self.inits: list[onnx.TensorProto] = []
        self._n = 0

    def init(self, name: str, arr: np.ndarray) -> str:
        self.inits.append(numpy_helper.from_array(np.ascontiguousarray(arr), name))
        return name

    def const(self, arr, dtype=np.float32) -> str:
        self._n += 1
        return self.init(f"const_{self._n}", np.asarray(arr, dtype=dtype))

    def op(self, op_type: str, inputs: list[str], **attrs) -> str:
        self._n += 1
        out = f"{op_type.lower()}_{self._n}"
        self.nodes.append(helper.make_node(op_type, inputs, [out], name=f"n{self._n}_{op_type}", **attrs))
        return out

    def linear(self, x: str, w: np.ndarray, b: np.ndarray, name: str) -> str:
        # torch Linear: y = x @ W^T + b, W is [out, in].
        wt = self.init(f"{name}.weight_t", w.T.astype(np.float32))
        bb = self.init(f"{name}.bias", b.astype(np.float32))
        return self.op("Add", [self.op("MatMul", [x, wt]), bb])

    def layer_norm(self, x: str, gamma: np.ndarray, beta: np.ndarray, name: str) -> str:
        g = self.init(f"{name}.weight", gamma.astype(np.float32))
        b = self.init(f"{name}.bias", beta.astype(np.float32))
        return self.op("LayerNormalization", [x, g, b], axis=-1, epsilon=LN_EPS)


def build_minilm_onnx(weights: dict[str, np.ndarray]) -> onnx.ModelProto:
    """The sentence-transformers all-MiniLM-L6-v2 forward pass as an ONNX model.

    Inputs: input_ids int64 [B,S], attention_mask float32 [B,S] (1 keep, 0 pad),
    token_type_ids int64 [B,S]. Output: embeddings float32 [B,384], L2-normalized.
    """
    g = GraphBuilder()
    w = weights

    # Embeddings.
    word = g.op("Gather", [g.init("word_embeddings", w["embeddings.word_embeddings.weight"]), "input_ids"], axis=0)
    # Positions 0..S-1: the first S rows of the position table.
    seq_len = g.op("Shape", ["input_ids"], start=1, end=2)  # [S], 1-D
    pos = g.op("Slice", [g.init("position_embeddings", w["embeddings.position_embeddings.weight"]),
                         g.const([0], np.int64), seq_len, g.const([0], np.int64)])
    tt = g.op("Gather", [g.init("token_type_embeddings", w["embeddings.token_type_embeddings.weight"]), "token_type_ids"], axis=0)
    x = g.op("Add", [g.op("Add", [word, pos]), tt])
    x = g.layer_norm(x, w["embeddings.LayerNorm.weight"], w["embeddings.LayerNorm.bias"], "embeddings.LayerNorm")

    # Additive attention mask [B,1,1,S]: 0 keep, float32 lowest for pads (as HF BERT).
    neg = float(np.finfo(np.float32).min)
    inv = g.op("Sub", [g.const(1.0), "attention_mask"])
    add_mask = g.op("Unsqueeze", [g.op("Mul", [inv, g.const(neg)]), g.const([1, 2], np.int64)])

    heads_shape = g.const([0, 0, HEADS, HEAD_DIM], np.int64)
    merge_shape = g.const([0, 0, HIDDEN], np.int64)
    scale = g.const(1.0 / math.sqrt(HEAD_DIM))
    sqrt2 = g.const(math.sqrt(2.0))
    one = g.const(1.0)
    half = g.const(0.5)

    for i in range(LAYERS):
        p = f"encoder.layer.{i}."
        q = g.linear(x, w[p + "attention.self.query.weight"], w[p + "attention.self.query.bias"], p + "q")
        k = g.linear(x, w[p + "attention.self.key.weight"], w[p + "attention.self.key.bias"], p + "k")
        v = g.linear(x, w[p + "attention.self.value.weight"], w[p + "attention.self.value.bias"], p + "v")
        qh = g.op("Transpose", [g.op("Reshape", [q, heads_shape])], perm=[0, 2, 1, 3])  # [B,H,S,D]
        kt = g.op("Transpose", [g.op("Reshape", [k, heads_shape])], perm=[0, 2, 3, 1])  # [B,H,D,S]
        vh = g.op("Transpose", [g.op("Reshape", [v, heads_shape])], perm=[0, 2, 1, 3])  # [B,H,S,D]
        scores = g.op("Add", [g.op("Mul", [g.op("MatMul", [qh, kt]), scale]), add_mask])
        probs = g.op("Softmax", [scores], axis=-1)
        ctx = g.op("MatMul", [probs, vh])
        ctx = g.op("Reshape", [g.op("Transpose", [ctx], perm=[0, 2, 1, 3]), merge_shape])
        attn = g.linear(ctx, w[p + "attention.output.dense.weight"], w[p + "attention.output.dense.bias"], p + "attn_out")
        x = g.layer_norm(g.op("Add", [attn, x]), w[p + "attention.output.LayerNorm.weight"],
                         w[p + "attention.output.LayerNorm.bias"], p + "attn_ln")
        h = g.linear(x, w[p + "intermediate.dense.weight"], w[p + "intermediate.dense.bias"], p + "ffn_in")
        # Exact GELU, spelled as torch exports it: ((erf(h / sqrt(2)) + 1) * h) * 0.5.
        gelu = g.op("Mul", [g.op("Mul", [h, g.op("Add", [g.op("Erf", [g.op("Div", [h, sqrt2])]), one])]), half])
        out = g.linear(gelu, w[p + "output.dense.weight"], w[p + "output.dense.bias"], p + "ffn_out")
        x = g.layer_norm(g.op("Add", [out, x]), w[p + "output.LayerNorm.weight"], w[p + "output.LayerNorm.bias"],
                         p + "ffn_ln")

    # Mean pooling over the mask, then L2 normalize (torch F.normalize eps 1e-12).
    m3 = g.op("Unsqueeze", ["attention_mask", g.const([2], np.int64)])  # [B,S,1]
    summed = g.op("ReduceSum", [g.op("Mul", [x, m3]), g.const([1], np.int64)], keepdims=0)  # [B,384]
    count = g.op("Max", [g.op("ReduceSum", [m3, g.const([1], np.int64)], keepdims=0), g.const(1e-9)])  # [B,1]
    mean = g.op("Div", [summed, count])
    norm = g.op("Sqrt", [g.op("ReduceSum", [g.op("Mul", [mean, mean]), g.const([1], np.int64)], keepdims=1)])
    emb = g.op("Div", [mean, g.op("Max", [norm, g.const(1e-12)])])
    g.nodes.append(helper.make_node("Identity", [emb], ["embeddings"], name="output"))

    graph = helper.make_graph(
        g.nodes,
        "all-MiniLM-L6-v2",
        [
            helper.make_tensor_value_info("input_ids", TensorProto.INT64, ["batch", "seq"]),
            helper.make_tensor_value_info("attention_mask", TensorProto.FLOAT, ["batch", "seq"]),
            helper.make_tensor_value_info("token_type_ids", TensorProto.INT64, ["batch", "seq"]),
        ],
        [helper.make_tensor_value_info("embeddings", TensorProto.FLOAT, ["batch", HIDDEN])],
        initializer=g.inits,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], producer_name="rlx-bench")
    model.ir_version = 8
    onnx.checker.check_model(model)
    return model


def make_session(model: onnx.ModelProto, threads: int) -> ort.InferenceSession:
    so = ort.SessionOptions()
    so.intra_op_num_threads = threads
    so.inter_op_num_threads = 1
    so.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    return ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])


def feeds(ids: np.ndarray, mask: np.ndarray) -> dict[str, np.ndarray]:
    return {
        "input_ids": ids.astype(np.int64),
        "attention_mask": mask.astype(np.float32),
        "token_type_ids": np.zeros_like(ids, dtype=np.int64),
    }


# --------------------------------------------------------------------------
# Parity check
# --------------------------------------------------------------------------


def check_parity(sess: ort.InferenceSession) -> float:
    ref = json.loads(REF_JSON.read_text())
    token_ids = ref["token_ids"]
    want = np.asarray(ref["embeddings"], dtype=np.float64)
    # Each sentence alone (no padding).
    worst = 0.0
    for i, ids in enumerate(token_ids):
        a = np.asarray([ids], dtype=np.int64)
        got = sess.run(["embeddings"], feeds(a, np.ones_like(a, dtype=np.float32)))[0][0]
        err = float(np.max(np.abs(got - want[i])))
        worst = max(worst, err)
    # All sentences as one right-padded batch (exercises the mask).
    seq = max(len(t) for t in token_ids)
    ids = np.zeros((len(token_ids), seq), dtype=np.int64)
    mask = np.zeros((len(token_ids), seq), dtype=np.float32)
    for i, t in enumerate(token_ids):
        ids[i, : len(t)] = t
        mask[i, : len(t)] = 1.0
    got = sess.run(["embeddings"], feeds(ids, mask))[0]
    batch_err = float(np.max(np.abs(got - want)))
    print(f"[parity] ORT graph vs sentence-transformers reference ({len(token_ids)} sentences): "
          f"max |err| one-by-one {worst:.3e}, padded batch {batch_err:.3e} (tolerance {TOL:g})", flush=True)
    return max(worst, batch_err)


# --------------------------------------------------------------------------
# Timing
# --------------------------------------------------------------------------


def random_batch(batch: int, seq: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    ids = rng.integers(1000, VOCAB, size=(batch, seq), dtype=np.int64)
    ids[:, 0] = 101  # [CLS]
    ids[:, -1] = 102  # [SEP]
    return ids, np.ones((batch, seq), dtype=np.float32)


def time_ort(sess: ort.InferenceSession, f: dict[str, np.ndarray], iters: int, warmup: int) -> list[float]:
    for _ in range(warmup):
        sess.run(["embeddings"], f)
    times = []
    for _ in range(iters):
        t0 = time.perf_counter()
        sess.run(["embeddings"], f)
        times.append((time.perf_counter() - t0) * 1e3)
    return times


class RlxRunner:
    """Invokes `rlx bench ... --json`; disables itself (with a message) on failure."""

    def __init__(self, binary: Path, model_dir: Path, threads: int, timeout_s: float) -> None:
        self.binary = binary
        self.model_dir = model_dir
        self.threads = threads
        self.timeout_s = timeout_s
        self.broken: dict[str, str] = {}  # mode -> reason
        self.isa: str | None = None  # the kernel ISA rlx reported
        if not binary.is_file():
            reason = f"{disp(binary)} not found (build it with `cargo build --release -p rlx-cli`)"
            for m in MODES:
                self.broken[m] = reason
            print(f"[rlx] {reason}; rlx results will be null", flush=True)

    def run(self, batch: int, seq: int, mode: str, iters: int, warmup: int) -> dict | None:
        if mode in self.broken:
            return None
        cmd = [str(self.binary), "bench", "--model", str(self.model_dir), "--batch", str(batch), "--seq", str(seq),
               *MODE_FLAGS[mode], "--iters", str(iters), "--warmup", str(warmup), "--threads", str(self.threads), "--json"]
        try:
            proc = subprocess.run(cmd, capture_output=True, text=True, timeout=self.timeout_s)
        except (OSError, subprocess.TimeoutExpired) as e:
            self._fail(mode, f"{self._show(cmd)}: {e}")
            return None
        if proc.returncode != 0:
            tail = (proc.stderr or proc.stdout).strip().splitlines()[-5:]
            self._fail(mode, f"{self._show(cmd)} exited {proc.returncode}: {' | '.join(tail)}")
            return None
        lines = [ln for ln in proc.stdout.splitlines() if ln.strip().startswith("{")]
        try:
            out = json.loads(lines[-1])
            times = [float(t) for t in out["times_ms"]]
            if not times:
                raise ValueError("empty times_ms")
            self.isa = out.get("isa", self.isa)
            return {"times_ms": times, "median_ms": float(out["median_ms"]), "dispatches": out.get("dispatches")}
        except (IndexError, KeyError, ValueError, TypeError) as e:
            self._fail(mode, f"{self._show(cmd)} printed no valid JSON line ({e}): {proc.stdout.strip()[:300]!r}")
            return None

    def _show(self, cmd: list[str]) -> str:
        return " ".join([disp(cmd[0]), *cmd[1:3], disp(cmd[3]), *cmd[4:]])

    def _fail(self, mode: str, reason: str) -> None:
        self.broken[mode] = reason
        print(f"[rlx] mode {mode} disabled: {reason}", flush=True)


def machine_info() -> str:
    model = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return f"{model}, {os.cpu_count()} logical CPUs, {platform.system()} {platform.release()}, " \
           f"onnxruntime {ort.__version__}, python {platform.python_version()}"


def cpu_flags() -> str:
    """The SIMD-relevant flags of /proc/cpuinfo (avx*, fma, f16c, amx*)."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("flags"):
                flags = line.split(":", 1)[1].split()
                return " ".join(f for f in flags if f.startswith(("avx", "amx")) or f in ("fma", "f16c"))
    except OSError:
        pass
    return ""


def median(xs: list[float]) -> float:
    return float(np.median(np.asarray(xs)))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model-dir", type=Path, default=default_model_dir())
    ap.add_argument("--rlx-bin", type=Path, default=REPO / "target" / "release" / "rlx")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=4, help="interleaved rounds per shape")
    ap.add_argument("--iters", type=int, default=6, help="timed runs per round and engine (>= 20 in total)")
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--shapes", default=",".join(f"{b}x{s}" for b, s in SHAPES))
    ap.add_argument("--skip-rlx", action="store_true")
    ap.add_argument("--out-dir", type=Path, default=REPO / "bench" / "results")
    ap.add_argument("--rlx-timeout", type=float, default=600.0)
    ap.add_argument("--tag", default="", help="suffix of the result files (e.g. _xeon_t16)")
    ap.add_argument("--modes", default=",".join(MODES), help="rlx modes to run (%s)" % ",".join(MODES))
    args = ap.parse_args()

    if args.rounds * args.iters < 20:
        ap.error("rounds * iters must be >= 20")
    st = args.model_dir / "model.safetensors"
    if not st.is_file():
        print(f"error: {st} not found; run `python3 scripts/fetch_models.py minilm`", file=sys.stderr)
        return 1
    shapes = []
    for s in args.shapes.split(","):
        b, _, n = s.partition("x")
        shapes.append((int(b), int(n)))

    t0 = time.perf_counter()
    model = build_minilm_onnx(load_file(str(st)))
    sess = make_session(model, args.threads)
    print(f"[ort] onnxruntime {ort.__version__}: graph with {len(model.graph.node)} nodes built and loaded "
          f"in {time.perf_counter() - t0:.2f} s", flush=True)
    err = check_parity(sess)
    if not err <= TOL:
        print(f"error: ORT graph differs from the reference by {err:.3e} > {TOL:g}; not timing it", file=sys.stderr)
        return 1

    MODES[:] = [m for m in args.modes.split(",") if m in MODE_FLAGS]
    rlx = RlxRunner(args.rlx_bin, args.model_dir, args.threads, args.rlx_timeout)
    if args.skip_rlx:
        for m in MODES:
            rlx.broken[m] = "--skip-rlx"
    load_before = os.getloadavg()
    rng = np.random.default_rng(0)
    rows = []
    for batch, seq in shapes:
        f = feeds(*random_batch(batch, seq, rng))
        ort_times: list[float] = []
        rlx_times: dict[str, list[float]] = {m: [] for m in MODES}
        dispatches: dict[str, object] = {m: None for m in MODES}
        for r in range(args.rounds):
            # Warm up ORT only on the first round; rlx warms up inside each process.
            ort_times += time_ort(sess, f, args.iters, args.warmup if r == 0 else 1)
            for m in MODES:
                res = rlx.run(batch, seq, m, args.iters, args.warmup)
                if res is not None:
                    rlx_times[m] += res["times_ms"]
                    dispatches[m] = res["dispatches"]
        ort_ms = median(ort_times)
        shape = f"{batch}x{seq}"
        msg = [f"ORT {ort_ms:8.2f} ms"]
        for m in MODES:
            ok = m not in rlx.broken and rlx_times[m]
            rlx_ms = median(rlx_times[m]) if ok else None
            rows.append({
                "shape": shape,
                "mode": m,
                "rlx_ms": rlx_ms,
                "ort_ms": ort_ms,
                "ratio": (rlx_ms / ort_ms) if rlx_ms is not None else None,
                "rlx_runs": len(rlx_times[m]) if ok else 0,
                "ort_runs": len(ort_times),
                "rlx_dispatches": dispatches[m] if ok else None,
            })
            msg.append(f"rlx {m} " + (f"{rlx_ms:8.2f} ms" if rlx_ms is not None else "    null"))
        print(f"[bench] {shape:>7}: " + " | ".join(msg), flush=True)

    result = {
        "machine": machine_info(),
        "date": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "threads": args.threads,
        "ort_settings": "intra_op_num_threads=%d, inter_op_num_threads=1, ORT_SEQUENTIAL, ORT_ENABLE_ALL, fp32"
                        % args.threads,
        "ort_parity_max_abs_err": err,
        "method": f"median over {args.rounds} interleaved rounds x {args.iters} runs per engine per shape, "
                  "after warm-up; random valid token ids, full attention mask",
        "loadavg_1m_before_after": [round(load_before[0], 2), round(os.getloadavg()[0], 2)],
        "rlx_unavailable": {m: reason for m, reason in rlx.broken.items()},
        "rlx_isa": rlx.isa,
        "cpu_flags": cpu_flags(),
        "rows": rows,
    }
    args.out_dir.mkdir(parents=True, exist_ok=True)
    stem = f"minilm_cpu{args.tag}"
    (args.out_dir / f"{stem}.json").write_text(json.dumps(result, indent=1) + "\n")
    (args.out_dir / f"{stem}.md").write_text(markdown(result))
    plot(result, args.out_dir / f"{stem}.png")
    print(f"[bench] wrote {args.out_dir}/{stem}.{{json,md,png}}")
    return 0


def fmt(x: float | None, spec: str = ".2f") -> str:
    return "—" if x is None else format(x, spec)


def markdown(result: dict) -> str:
    lines = [
        "# all-MiniLM-L6-v2 on the CPU: rlx vs ONNX Runtime",
        "",
        f"- machine: {result['machine']}",
        f"- CPU SIMD flags: {result.get('cpu_flags', '')}",
        f"- rlx kernel ISA: {result.get('rlx_isa')}; threads: {result['threads']}",
        f"- date: {result['date']}",
        f"- ORT: {result['ort_settings']}; graph parity vs sentence-transformers max |err| "
        f"{result['ort_parity_max_abs_err']:.2e}",
        f"- method: {result['method']}",
        f"- machine load average (1 min) before / after: {result['loadavg_1m_before_after'][0]} / "
        f"{result['loadavg_1m_before_after'][1]} (a value above the core count means other work competed for "
        "the CPUs and inflated both engines' times)",
        "",
        "| shape (BxS) | rlx mode | rlx ms | ORT ms | rlx / ORT | rlx dispatches |",
        "|---|---|---:|---:|---:|---:|",
    ]
    for r in result["rows"]:
        lines.append(f"| {r['shape']} | {r['mode']} | {fmt(r['rlx_ms'])} | {fmt(r['ort_ms'])} | "
                     f"{fmt(r['ratio'], '.2f')} | {'—' if r['rlx_dispatches'] is None else r['rlx_dispatches']} |")
    if result["rlx_unavailable"]:
        lines += ["", "rlx not measured (— in the table):", ""]
        lines += [f"- {m}: {why}" for m, why in result["rlx_unavailable"].items()]
    lines += ["", "Lower is better; ratio < 1 means rlx is faster. Reproduce: `bench/.venv/bin/python bench/minilm_ort.py`.", ""]
    return "\n".join(lines)


def plot(result: dict, path: Path) -> None:
    """Left: median time per shape, grouped bars (log scale), ORT and every
    rlx mode. Right: rlx / ORT per shape and mode, with the 1.0 line."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import matplotlib.ticker

    shapes = list(dict.fromkeys(r["shape"] for r in result["rows"]))
    modes = list(dict.fromkeys(r["mode"] for r in result["rows"]))
    by = {(r["shape"], r["mode"]): r for r in result["rows"]}
    names = {"thunks": "rlx thunks", "hybrid": "rlx hybrid", "hybrid-f16w": "rlx hybrid, f16 weights",
             "hybrid-bf16": "rlx hybrid, bf16 matmuls"}
    colors = {"ONNX Runtime": "tab:gray", "thunks": "tab:blue", "hybrid": "tab:orange", "hybrid-f16w": "tab:green",
              "hybrid-bf16": "tab:purple"}
    x = np.arange(len(shapes))
    fig, (ax, axr) = plt.subplots(1, 2, figsize=(12, 4.8), dpi=120)

    series = [("ONNX Runtime", [by[(s, modes[0])]["ort_ms"] if (s, modes[0]) in by else None for s in shapes])]
    series += [(m, [by.get((s, m), {}).get("rlx_ms") for s in shapes]) for m in modes]
    width = 0.8 / len(series)
    for i, (key, vals) in enumerate(series):
        xs = x - 0.4 + width * (i + 0.5)
        label = names.get(key, key)
        present = [(xi, v) for xi, v in zip(xs, vals) if v is not None]
        if not present:
            label += " (not measured)"
        ax.bar([p[0] for p in present], [p[1] for p in present], width, color=colors.get(key), label=label)
        for xi, v in present:
            ax.annotate(f"{v:.3g}", (xi, v), textcoords="offset points", xytext=(0, 2), ha="center",
                        fontsize=6, rotation=90)
    ax.set_yscale("log")
    ax.yaxis.set_major_formatter(matplotlib.ticker.FuncFormatter(lambda v, _: f"{v:g}"))
    ax.set_xticks(x, shapes)
    ax.set_xlabel("batch x sequence length")
    ax.set_ylabel("median time per forward (ms, log scale)")
    ax.set_title("time per shape")
    ax.legend(fontsize=8)
    ax.grid(axis="y", which="both", alpha=0.3)

    width = 0.8 / max(len(modes), 1)
    for i, m in enumerate(modes):
        xs = x - 0.4 + width * (i + 0.5)
        vals = [by.get((s, m), {}).get("ratio") for s in shapes]
        present = [(xi, v) for xi, v in zip(xs, vals) if v is not None]
        axr.bar([p[0] for p in present], [p[1] for p in present], width, color=colors.get(m), label=names.get(m, m))
        for xi, v in present:
            axr.annotate(f"{v:.2f}", (xi, v), textcoords="offset points", xytext=(0, 2), ha="center", fontsize=7)
    axr.axhline(1.0, color="tab:gray", linestyle="--", linewidth=1, label="ONNX Runtime = 1")
    axr.set_xticks(x, shapes)
    axr.set_ylim(0, max([1.2] + [r["ratio"] * 1.1 for r in result["rows"] if r["ratio"] is not None]))
    axr.set_xlabel("batch x sequence length")
    axr.set_ylabel("rlx time / ONNX Runtime time (lower is better)")
    axr.set_title("rlx relative to ONNX Runtime")
    axr.legend(fontsize=8, loc="lower right")
    axr.grid(axis="y", alpha=0.3)
    fig.suptitle(f"all-MiniLM-L6-v2 fp32, CPU, {result['threads']} threads, same run ({result['date'][:10]})")
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


if __name__ == "__main__":
    sys.exit(main())
