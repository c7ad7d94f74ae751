"""MiniLM (all-MiniLM-L6-v2) on one GPU: PyTorch eager, PyTorch with the whole
model in one CUDA graph, torch.compile(mode="reduce-overhead"), each in fp32
and bf16, and rlx (`rlx bench --device cuda`, thunks and hybrid, in f32, bf16
and f16), side by side in one run.

Runs ON the GPU machine (PyTorch + transformers there, no network):

    python3 bench/gpu_minilm.py --model-dir DIR --rlx BIN --out OUTDIR [--shapes 1x128,32x128]

The BERT is transformers' BertModel built from DIR/config.json with the
weights of DIR/model.safetensors (no hub access), followed by the
sentence-transformers head (masked mean pooling, L2 normalization). fp32
runs with TF32 off (PyTorch's default for fp32 matmuls); bf16 runs convert
the whole module with `.to(torch.bfloat16)`. Inputs are a full sequence of
token ids, as in `rlx bench`.

Timing: each iteration is timed on the wall clock and ends with a device
synchronize; medians are reported. PyTorch's inputs already sit on the GPU
(static tensors), while each rlx run also copies its inputs host->device and
the pooled output back, so the comparison is conservative for rlx.
"""
import argparse
import copy
import json
import os
import statistics
import subprocess
import sys
import time

import torch


def build_model(model_dir):
    from safetensors.torch import load_file
    from transformers import BertConfig, BertModel

    cfg = BertConfig.from_json_file(os.path.join(model_dir, "config.json"))
    cfg._attn_implementation = "sdpa"
    bert = BertModel(cfg, add_pooling_layer=False)
    sd = load_file(os.path.join(model_dir, "model.safetensors"))
    sd = {k[5:] if k.startswith("bert.") else k: v for k, v in sd.items()}
    missing, unexpected = bert.load_state_dict(sd, strict=False)
    missing = [m for m in missing if "position_ids" not in m]
    assert not missing, f"missing weights: {missing}"

    class Embed(torch.nn.Module):
        def __init__(self, bert):
            super().__init__()
            self.bert = bert

        def forward(self, ids, tt, mask):
            h = self.bert(input_ids=ids, token_type_ids=tt, attention_mask=mask).last_hidden_state
            m = mask.unsqueeze(-1).to(h.dtype)
            s = (h * m).sum(1) / m.sum(1).clamp(min=1e-9)
            return torch.nn.functional.normalize(s, p=2, dim=1)

    return Embed(bert).cuda().eval()


def inputs(b, s):
    state = 0x2545F4914F6CDD1D
    ids = []
    for i in range(b * s):
        state ^= (state << 13) & 0xFFFFFFFFFFFFFFFF
        state ^= state >> 7
        state ^= (state << 17) & 0xFFFFFFFFFFFFFFFF
        j = i % s
        ids.append(101 if j == 0 else 102 if j == s - 1 else 1000 + state % 20000)
    ids = torch.tensor(ids, dtype=torch.long).view(b, s).cuda()
    return ids, torch.zeros_like(ids), torch.ones(b, s, dtype=torch.long).cuda()


def timed(fn, iters, warmup):
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(iters):
        t = time.perf_counter()
        fn()
        torch.cuda.synchronize()
        times.append((time.perf_counter() - t) * 1e3)
    return {"median_ms": statistics.median(times), "min_ms": min(times), "iters": iters}


def torch_runs(model, b, s, iters, log, tag):
    ids, tt, mask = inputs(b, s)
    res = {}
    tol = 1e-5 if tag == "fp32" else 2e-2
    with torch.inference_mode():
        ref = model(ids, tt, mask)
        res[f"pytorch_eager_{tag}"] = timed(lambda: model(ids, tt, mask), iters, 10)
        log(f"{b}x{s} {tag} eager {res[f'pytorch_eager_{tag}']}")
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            for _ in range(3):
                model(ids, tt, mask)
        torch.cuda.current_stream().wait_stream(stream)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            static_out = model(ids, tt, mask)
        graph.replay()
        torch.cuda.synchronize()
        assert torch.allclose(static_out.float(), ref.float(), atol=tol)
        res[f"pytorch_cuda_graph_{tag}"] = timed(graph.replay, iters, 10)
        log(f"{b}x{s} {tag} cuda graph {res[f'pytorch_cuda_graph_{tag}']}")
    try:
        compiled = torch.compile(model, mode="reduce-overhead")
        with torch.inference_mode():
            t0 = time.perf_counter()
            for _ in range(3):
                out = compiled(ids, tt, mask)
            torch.cuda.synchronize()
            compile_s = time.perf_counter() - t0
            assert torch.allclose(out.float(), ref.float(), atol=max(tol, 1e-4))
            r = timed(lambda: compiled(ids, tt, mask), iters, 10)
        r["compile_s"] = compile_s
        res[f"pytorch_compile_reduce_overhead_{tag}"] = r
        log(f"{b}x{s} {tag} torch.compile {r}")
    except Exception as e:  # report, do not hide
        res[f"pytorch_compile_reduce_overhead_{tag}"] = {"error": f"{type(e).__name__}: {e}"[:500]}
        log(f"{b}x{s} {tag} torch.compile failed: {e}")
    return res


PRECISIONS = ["f32", "bf16", "f16"]


def rlx_runs(rlx, model_dir, b, s, iters, log):
    res = {}
    for precision in PRECISIONS:
        for mode in ["thunks", "hybrid"]:
            name = f"rlx_{mode}_{precision}"
            cmd = [rlx, "bench", "--model", model_dir, "--batch", str(b), "--seq", str(s),
                   "--mode", mode, "--device", "cuda", "--precision", precision, "--json",
                   "--iters", str(iters), "--warmup", "10"]
            p = subprocess.run(cmd, capture_output=True, text=True)
            if p.returncode != 0:
                res[name] = {"error": (p.stderr or p.stdout)[-800:]}
                log(f"{b}x{s} {name} FAILED: {p.stderr[-800:]}")
                continue
            line = [l for l in p.stdout.splitlines() if l.startswith("{")][-1]
            r = json.loads(line)
            r.pop("times_ms", None)
            res[name] = r
            log(f"{b}x{s} {name} {r}")
    return res


def ratio(r, a, b):
    """r[a] / r[b] on medians, or None."""
    x, y = r.get(a, {}), r.get(b, {})
    if "median_ms" not in x or "median_ms" not in y:
        return None
    return x["median_ms"] / y["median_ms"]


def targets(result):
    """The issue's targets, checked on this run's medians."""
    out = []
    sh = result["shapes"]

    def line(what, num, den, shape, limit):
        r = ratio(sh.get(shape, {}), num, den)
        if r is None:
            out.append(f"- {what}: not measured")
            return
        met = "**met**" if r <= limit else "**not met**"
        a, b = sh[shape][num]["median_ms"], sh[shape][den]["median_ms"]
        out.append(f"- {what}: {met}, {a:.3f} / {b:.3f} ms = {r:.2f}x (target <= {limit}x)")

    line("1x128 fp32, rlx hybrid <= 1.0x PyTorch one CUDA graph fp32",
         "rlx_hybrid_f32", "pytorch_cuda_graph_fp32", "1x128", 1.0)
    line("1x128 bf16, rlx hybrid bf16 <= 0.5x PyTorch one CUDA graph bf16",
         "rlx_hybrid_bf16", "pytorch_cuda_graph_bf16", "1x128", 0.5)
    line("1x128 f16, rlx hybrid f16 <= 0.5x PyTorch one CUDA graph bf16",
         "rlx_hybrid_f16", "pytorch_cuda_graph_bf16", "1x128", 0.5)
    line("32x128 fp32, rlx hybrid <= 0.8x PyTorch one CUDA graph fp32",
         "rlx_hybrid_f32", "pytorch_cuda_graph_fp32", "32x128", 0.8)
    line("32x128 bf16, rlx hybrid bf16 <= 0.8x PyTorch one CUDA graph bf16",
         "rlx_hybrid_bf16", "pytorch_cuda_graph_bf16", "32x128", 0.8)
    for shape in sh:
        for p in PRECISIONS:
            t, h = sh[shape].get(f"rlx_thunks_{p}", {}), sh[shape].get(f"rlx_hybrid_{p}", {})
            if "median_ms" in t and "median_ms" in h:
                out.append(f"- Hybrid vs Thunks {shape} {p}: {h['dispatches']} vs {t['dispatches']} "
                           f"dispatches, {h['median_ms']:.3f} vs {t['median_ms']:.3f} ms")
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model-dir", required=True)
    ap.add_argument("--rlx", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--shapes", default="1x128,32x128")
    ap.add_argument("--iters", type=int, default=200)
    args = ap.parse_args()
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    os.makedirs(args.out, exist_ok=True)
    logf = open(os.path.join(args.out, "gpu_bench.log"), "w")

    def log(msg):
        print(msg, flush=True)
        logf.write(msg + "\n")
        logf.flush()

    result = {
        "device": torch.cuda.get_device_name(0),
        "torch": torch.__version__,
        "dtype": "PyTorch fp32 (TF32 off) and bf16; rlx f32, bf16, f16",
        "note": "per-iteration wall time with device sync, median; PyTorch inputs resident on the GPU, "
                "rlx runs include host->device input and device->host output copies",
        "shapes": {},
    }
    import transformers
    result["transformers"] = transformers.__version__
    model = build_model(args.model_dir)
    models = {"fp32": model, "bf16": copy.deepcopy(model).to(torch.bfloat16)}
    for shape in args.shapes.split(","):
        b, s = map(int, shape.split("x"))
        r = rlx_runs(args.rlx, args.model_dir, b, s, args.iters, log)
        for tag, m in models.items():
            r.update(torch_runs(m, b, s, args.iters, log, tag))
        result["shapes"][shape] = r
        json.dump(result, open(os.path.join(args.out, "gpu_h200.json"), "w"), indent=1)
    result["targets"] = targets(result)
    json.dump(result, open(os.path.join(args.out, "gpu_h200.json"), "w"), indent=1)
    rows = ["| shape | system | median ms | min ms | dispatches |", "|---|---|---|---|---|"]
    for shape, r in result["shapes"].items():
        for name, v in r.items():
            if "error" in v:
                rows.append(f"| {shape} | {name} | error | | |")
            else:
                rows.append(f"| {shape} | {name} | {v['median_ms']:.3f} | {v['min_ms']:.3f} | {v.get('dispatches', '')} |")
    md = (f"# MiniLM on {result['device']}\n\n{result['note']}.\n\n" + "\n".join(rows)
          + "\n\nTargets:\n" + "\n".join(result["targets"]) + "\n")
    open(os.path.join(args.out, "gpu_h200.md"), "w").write(md)
    log(md)


if __name__ == "__main__":
    sys.exit(main())
