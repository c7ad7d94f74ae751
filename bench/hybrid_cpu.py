#!/usr/bin/env python3
"""Thunks vs Hybrid on the CPU, in one run, for the BERT-6 graph
(hidden 384, 12 heads, FFN 1536, synthetic weights) at seq 128.

Runs `rlx bench --model bert6` for both modes, interleaved round by round so
machine noise hits both, and reports medians, dispatch counts and the
Hybrid/Thunks time ratio (< 1 means hybrid is faster).

    cargo build --release -p rlx-cli
    python3 bench/hybrid_cpu.py [--rounds 5] [--iters 20] [--threads 2,8,16] [--model minilm]
"""
import argparse, json, os, platform, statistics, subprocess, sys, time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RLX = os.path.join(ROOT, "target", "release", "rlx")


def run(rlx, mode, batch, seq, iters, threads, model):
    out = subprocess.run(
        [rlx, "bench", "--model", model, "--batch", str(batch), "--seq", str(seq),
         "--mode", mode, "--iters", str(iters), "--warmup", "3", "--threads", str(threads), "--json"],
        check=True, capture_output=True, text=True).stdout
    return json.loads(out.strip().splitlines()[-1])


def cpu_model():
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--threads", default="2", help="comma-separated thread counts, e.g. 2,8,16")
    ap.add_argument("--model", default="bert6", help="bert6, minilm or a BERT directory")
    ap.add_argument("--batches", default="1,8")
    ap.add_argument("--rlx-bin", default=RLX)
    ap.add_argument("--out-dir", default=os.path.join(ROOT, "bench", "results"))
    ap.add_argument("--tag", default="", help="suffix of the result files")
    a = ap.parse_args()
    if not os.path.exists(a.rlx_bin):
        sys.exit(f"{a.rlx_bin} missing: run `cargo build --release -p rlx-cli` first")
    rows, isa = [], None
    load0 = os.getloadavg()[0]
    for threads in [int(t) for t in a.threads.split(",")]:
        for batch in [int(b) for b in a.batches.split(",")]:
            times = {"thunks": [], "hybrid": []}
            disp = {}
            iters = a.iters if batch < 8 else max(3, a.iters // 4)
            for _ in range(a.rounds):
                for mode in ("thunks", "hybrid"):
                    r = run(a.rlx_bin, mode, batch, 128, iters, threads, a.model)
                    times[mode].extend(r["times_ms"])
                    disp[mode] = r["dispatches"]
                    isa = r.get("isa", isa)
            t = statistics.median(times["thunks"])
            h = statistics.median(times["hybrid"])
            rows.append({"threads": threads, "shape": f"{batch}x128", "thunks_ms": round(t, 3),
                         "hybrid_ms": round(h, 3), "ratio_hybrid_over_thunks": round(h / t, 3),
                         "dispatches_thunks": disp["thunks"], "dispatches_hybrid": disp["hybrid"],
                         "runs_per_mode": len(times["thunks"])})
            print("[bench]", rows[-1], flush=True)
    res = {"bench": "hybrid vs thunks, CPU, " + a.model, "cpu": cpu_model(), "isa": isa,
           "date": time.strftime("%Y-%m-%d %H:%M:%S"), "loadavg_before_after": [load0, os.getloadavg()[0]],
           "command": "python3 bench/hybrid_cpu.py " + " ".join(sys.argv[1:]), "rows": rows}
    os.makedirs(a.out_dir, exist_ok=True)
    with open(os.path.join(a.out_dir, f"hybrid_cpu{a.tag}.json"), "w") as f:
        json.dump(res, f, indent=1)
    with open(os.path.join(a.out_dir, f"hybrid_cpu{a.tag}.md"), "w") as f:
        f.write(f"# Hybrid vs thunks, CPU ({a.model})\n\n")
        f.write(f"CPU: {res['cpu']}, rlx kernels: {isa}. {res['date']}, load average before/after "
                f"{load0:.2f} / {res['loadavg_before_after'][1]:.2f}. Medians over the runs of "
                f"{a.rounds} interleaved rounds per mode. Command: `{res['command']}`\n\n")
        f.write("| threads | shape | thunks ms | hybrid ms | hybrid / thunks | dispatches thunks | dispatches hybrid |\n"
                "|---:|---|---:|---:|---:|---:|---:|\n")
        for r in rows:
            f.write(f"| {r['threads']} | {r['shape']} | {r['thunks_ms']} | {r['hybrid_ms']} | "
                    f"{r['ratio_hybrid_over_thunks']} | {r['dispatches_thunks']} | {r['dispatches_hybrid']} |\n")


if __name__ == "__main__":
    main()
