#!/usr/bin/env python3
"""One picture and one table of the CPU results on the 16-core Xeon of the GPU
machine, across thread counts: MiniLM rlx / ONNX Runtime (from
bench/results/minilm_cpu_xeon_t{2,8,16}.json, written by bench/minilm_ort.py
through bench/cpu_device_run.sh) and SmolLM2 rlx / llama.cpp (from
bench/results/smollm2_xeon.json, written by bench/smollm2_device.sh).

    bench/.venv/bin/python bench/plot_cpu_xeon.py   # writes bench/results/cpu_xeon.png

It prints the table; bench/results/cpu_xeon.md keeps every session's tables
(with the commit each was measured at), so the printed one is pasted there
by hand rather than overwriting the history.
"""
import json
from pathlib import Path

RES = Path(__file__).resolve().parent / "results"


def load():
    minilm = {}
    for f in sorted(RES.glob("minilm_cpu_xeon_t*.json")):
        d = json.loads(f.read_text())
        minilm[d["threads"]] = d
    smol = json.loads((RES / "smollm2_xeon.json").read_text())
    return minilm, smol


def table(minilm, smol) -> str:
    any_run = next(iter(minilm.values()))
    lines = [
        "# CPU results on the 16-core Xeon of the GPU machine",
        "",
        f"- CPU: {any_run['machine']}",
        f"- SIMD flags: {any_run.get('cpu_flags', '')}",
        f"- rlx kernel ISA: {any_run.get('rlx_isa')} (chosen at run time)",
        "- every figure is a same-run median; rlx and its peer interleaved (see the per-run files "
        "`minilm_cpu_xeon_t*.md` and `smollm2_xeon.json` for the settings and load averages)",
        "",
        "## all-MiniLM-L6-v2 fp32 (and opt-in bf16): rlx / ONNX Runtime time (lower is better)",
        "",
        "| threads | shape | ORT ms | rlx thunks | rlx hybrid | rlx hybrid bf16 | hybrid / thunks | load avg before/after |",
        "|---:|---|---:|---:|---:|---:|---:|---|",
    ]
    for t, d in sorted(minilm.items()):
        by = {(r["shape"], r["mode"]): r for r in d["rows"]}
        for shape in dict.fromkeys(r["shape"] for r in d["rows"]):
            def cell(m):
                r = by.get((shape, m))
                return "—" if not r or r["rlx_ms"] is None else f"{r['rlx_ms']:.2f} ms ({r['ratio']:.2f}x)"
            th, hy = by.get((shape, "thunks")), by.get((shape, "hybrid"))
            hvt = f"{hy['rlx_ms'] / th['rlx_ms']:.2f}" if th and hy and th["rlx_ms"] and hy["rlx_ms"] else "—"
            ort = next(r["ort_ms"] for r in d["rows"] if r["shape"] == shape)
            lb = d["loadavg_1m_before_after"]
            lines.append(f"| {t} | {shape} | {ort:.2f} | {cell('thunks')} | {cell('hybrid')} | "
                         f"{cell('hybrid-bf16')} | {hvt} | {lb[0]} / {lb[1]} |")
    lines += [
        "",
        f"## SmolLM2-135M Q4_1: rlx / llama.cpp tok/s (higher is better); llama.cpp CPU backend "
        f"{smol['llamacpp'].get('cpu_backend_library')}",
        "",
        "| threads | llama.cpp prefill | llama.cpp decode | rlx f32 prefill | rlx f32 decode | rlx int8 prefill | rlx int8 decode |",
        "|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for row in smol["rows"]:
        ll, f, i = row["llamacpp"], row["rlx_f32"], row["rlx_int8"]
        def c(x, ref):
            return f"{x:.1f} ({x / ref:.2f}x)"
        lines.append(f"| {row['threads']} | {ll['prefill_tok_s']:.1f} | {ll['decode_tok_s']:.1f} | "
                     f"{c(f['prefill_tok_s'], ll['prefill_tok_s'])} | {c(f['decode_tok_s'], ll['decode_tok_s'])} | "
                     f"{c(i['prefill_tok_s'], ll['prefill_tok_s'])} | {c(i['decode_tok_s'], ll['decode_tok_s'])} |")
    lines += ["", f"Model file: {smol['model']}. Commands: `{smol['llamacpp']['command']}`; `{smol['rlx_command']}`.", ""]
    return "\n".join(lines)


def plot(minilm, smol, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax, bx) = plt.subplots(1, 2, figsize=(12, 4.6), dpi=120)
    threads = sorted(minilm)
    styles = {"thunks": "o-", "hybrid": "s-", "hybrid-bf16": "^--"}
    for shape, color in (("1x128", "tab:blue"), ("32x128", "tab:orange")):
        for mode, style in styles.items():
            ys = []
            for t in threads:
                r = next((r for r in minilm[t]["rows"] if r["shape"] == shape and r["mode"] == mode), None)
                ys.append(r["ratio"] if r and r["ratio"] is not None else float("nan"))
            ax.plot(threads, ys, style, color=color, label=f"{shape} {mode}")
    ax.axhline(1.0, color="gray", linestyle="--", linewidth=1)
    ax.axhline(0.8, color="green", linestyle=":", linewidth=1, label="target 0.8x")
    ax.set_xticks(threads)
    ax.set_xlabel("threads")
    ax.set_ylabel("rlx time / ONNX Runtime time (lower is better)")
    ax.set_title("MiniLM fp32 vs ONNX Runtime")
    ax.legend(fontsize=7)
    ax.grid(alpha=0.3)
    ts = [r["threads"] for r in smol["rows"]]
    for key, label, style in (("rlx_f32", "f32 act.", "o-"), ("rlx_int8", "int8 act.", "s-")):
        for phase, color in (("prefill_tok_s", "tab:purple"), ("decode_tok_s", "tab:red")):
            ys = [r[key][phase] / r["llamacpp"][phase] for r in smol["rows"]]
            bx.plot(ts, ys, style, color=color, label=f"{phase.split('_')[0]} {label}")
    bx.axhline(1.0, color="gray", linestyle="--", linewidth=1)
    bx.set_xticks(ts)
    bx.set_xlabel("threads")
    bx.set_ylabel("rlx tok/s / llama.cpp tok/s (higher is better)")
    bx.set_title("SmolLM2-135M Q4_1 vs llama.cpp (llama-bench)")
    bx.legend(fontsize=7)
    bx.grid(alpha=0.3)
    fig.suptitle(f"16-core Xeon ({minilm[threads[0]].get('rlx_isa')} kernels), same-run ratios")
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def main():
    minilm, smol = load()
    print(table(minilm, smol))
    plot(minilm, smol, RES / "cpu_xeon.png")
    print(f"wrote {RES}/cpu_xeon.png")


if __name__ == "__main__":
    main()
