"""Plot bench/results/gpu_h200.json (the H200 runs of bench/gpu_minilm.py and
bench/gpu_smollm2.py) to bench/results/gpu_h200.png.

    bench/.venv/bin/python bench/plot_gpu.py [results/gpu_h200.json] [out.png]

Left: MiniLM median time per forward for each shape, rlx hybrid / thunks and
PyTorch (one CUDA graph, torch.compile reduce-overhead), bf16 and fp32, log
scale. Right: SmolLM2 decode tok/s at batch 1. Ratios to PyTorch's one CUDA
graph are printed on the rlx hybrid bars.
"""
import json
import sys
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import matplotlib.ticker  # noqa: E402

HERE = Path(__file__).resolve().parent


def main():
    src = Path(sys.argv[1]) if len(sys.argv) > 1 else HERE / "results" / "gpu_h200.json"
    out = Path(sys.argv[2]) if len(sys.argv) > 2 else src.with_suffix(".png")
    r = json.loads(src.read_text())
    shapes = list(r["shapes"])
    series = [
        ("rlx_hybrid_bf16", "rlx hybrid bf16", "tab:orange"),
        ("rlx_thunks_bf16", "rlx thunks bf16", "tab:blue"),
        ("pytorch_cuda_graph_bf16", "PyTorch one CUDA graph bf16", "tab:gray"),
        ("pytorch_compile_reduce_overhead_bf16", "torch.compile bf16", "silver"),
        ("rlx_hybrid_f32", "rlx hybrid fp32", "peachpuff"),
        ("pytorch_cuda_graph_fp32", "PyTorch one CUDA graph fp32", "gainsboro"),
    ]
    fig, (ax, axd) = plt.subplots(1, 2, figsize=(12, 4.8), dpi=120, gridspec_kw={"width_ratios": [2, 1]})
    width = 0.8 / len(series)
    for i, (key, label, color) in enumerate(series):
        xs, vals = [], []
        for j, s in enumerate(shapes):
            v = r["shapes"][s].get(key, {}).get("median_ms")
            if v is not None:
                xs.append(j - 0.4 + width * (i + 0.5))
                vals.append(v)
        ax.bar(xs, vals, width, color=color, label=label, edgecolor="black", linewidth=0.3)
        for x, v, s in zip(xs, vals, shapes):
            note = f"{v:.3f}"
            ref_key = "pytorch_cuda_graph_bf16" if key.endswith("bf16") else "pytorch_cuda_graph_fp32"
            ref = r["shapes"][s].get(ref_key, {}).get("median_ms")
            if key.startswith("rlx_hybrid") and ref:
                note += f" ({v / ref:.2f}x)"
            ax.annotate(note, (x, v), textcoords="offset points", xytext=(0, 2), ha="center",
                        fontsize=6, rotation=90)
    ax.set_yscale("log")
    fmt = matplotlib.ticker.FuncFormatter(lambda v, _: f"{v:g}")
    ax.yaxis.set_major_formatter(fmt)
    ax.yaxis.set_minor_formatter(fmt)
    lo, hi = ax.get_ylim()
    ax.set_ylim(lo, hi * 1.8)
    ax.set_xticks(range(len(shapes)), shapes)
    ax.set_xlabel("MiniLM batch x sequence length")
    ax.set_ylabel("median ms per forward (log scale)")
    ax.set_title(f"MiniLM on {r['device']} (ratio: rlx hybrid / PyTorch one graph)")
    ax.legend(fontsize=7, loc="upper left")
    ax.grid(axis="y", which="both", alpha=0.3)
    d = r.get("smollm2_decode")
    if d:
        bars = [
            ("rlx hybrid", d["rlx_hybrid_tok_s"], "tab:orange"),
            ("rlx thunks", d["rlx_thunks_tok_s"], "tab:blue"),
            ("PyTorch static\ncache + graph", d["torch_static_cache_cudagraph_bf16_tok_s"], "tab:gray"),
            ("torch.compile", d["torch_compile_reduce_overhead_bf16_tok_s"], "silver"),
        ]
        axd.bar([b[0] for b in bars], [b[1] for b in bars], color=[b[2] for b in bars],
                edgecolor="black", linewidth=0.3)
        for i, (_, v, _) in enumerate(bars):
            axd.annotate(f"{v:.0f}", (i, v), textcoords="offset points", xytext=(0, 2), ha="center", fontsize=8)
        axd.set_ylabel("decode tok/s (batch 1, higher is better)")
        axd.set_title("SmolLM2-135M Q4_1 decode")
        axd.tick_params(axis="x", labelsize=7)
        axd.grid(axis="y", alpha=0.3)
    else:
        axd.set_axis_off()
    fig.tight_layout()
    fig.savefig(out)
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
