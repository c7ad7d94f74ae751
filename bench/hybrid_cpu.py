#!/usr/bin/env python3
"""Thunks vs Hybrid on the CPU, in one run, for the BERT-6 graph
(hidden 384, 12 heads, FFN 1536, synthetic weights) at seq 128.

Runs `rlx bench --model bert6` for both modes, interleaved round by round so
machine noise hits both, and reports medians, dispatch counts and the
Hybrid/Thunks time ratio (< 1 means hybrid is faster).

    cargo build --release -p rlx-cli
    python3 bench/hybrid_cpu.py [--rounds 5] [--iters 20] [--threads 2]
"""
import argparse, json, os, statistics, subprocess, sys, time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RLX = os.path.join(ROOT, "target", "release", "rlx")


def run(mode, batch, seq, iters, threads, model):
    out = subprocess.run(
        [RLX, "bench", "--model", model, "--batch", str(batch), "--seq", str(seq),
         "--mode", mode, "--iters", str(iters), "--warmup", "3", "--threads", str(threads), "--json"],
        check=True, capture_output=True, text=True).stdout
    return json.loads(out.strip().splitlines()[-1])


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--model", default="bert6")
    ap.add_argument("--batches", default="1,8")
    a = ap.parse_args()
    if not os.path.exists(RLX):
        sys.exit(f"{RLX} missing: run `cargo build --release -p rlx-cli` first")
    rows = []
    for batch in [int(b) for b in a.batches.split(",")]:
        times = {"thunks": [], "hybrid": []}
        disp = {}
        for _ in range(a.rounds):
            for mode in ("thunks", "hybrid"):
                r = run(mode, batch, 128, a.iters, a.threads, a.model)
                times[mode].extend(r["times_ms"])
                disp[mode] = r["dispatches"]
        t = statistics.median(times["thunks"])
        h = statistics.median(times["hybrid"])
        rows.append({"shape": f"{batch}x128", "thunks_ms": round(t, 3), "hybrid_ms": round(h, 3),
                     "ratio_hybrid_over_thunks": round(h / t, 3), "speedup": round(t / h, 3),
                     "dispatches_thunks": disp["thunks"], "dispatches_hybrid": disp["hybrid"],
                     "runs_per_mode": len(times["thunks"])})
        print(rows[-1], flush=True)
    res = {"bench": "hybrid vs thunks, CPU, " + a.model, "threads": a.threads,
           "date": time.strftime("%Y-%m-%d %H:%M:%S"), "loadavg": os.getloadavg()[0],
           "command": "python3 bench/hybrid_cpu.py " + " ".join(sys.argv[1:]), "rows": rows}
    os.makedirs(os.path.join(ROOT, "bench", "results"), exist_ok=True)
    with open(os.path.join(ROOT, "bench", "results", "hybrid_cpu.json"), "w") as f:
        json.dump(res, f, indent=1)
    with open(os.path.join(ROOT, "bench", "results", "hybrid_cpu.md"), "w") as f:
        f.write(f"# Hybrid vs thunks, CPU ({a.model}, {a.threads} threads)\n\n")
        f.write(f"{res['date']}, load average {res['loadavg']:.2f}. Medians over {rows[0]['runs_per_mode']} runs per mode, interleaved.\n\n")
        f.write("| shape | thunks ms | hybrid ms | speedup | dispatches thunks | dispatches hybrid |\n|---|---|---|---|---|---|\n")
        for r in rows:
            f.write(f"| {r['shape']} | {r['thunks_ms']} | {r['hybrid_ms']} | {r['speedup']}x | {r['dispatches_thunks']} | {r['dispatches_hybrid']} |\n")


if __name__ == "__main__":
    main()
