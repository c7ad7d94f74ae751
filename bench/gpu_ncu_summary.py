"""Summarize an `ncu --csv --metrics gpu__time_duration.sum` file by kernel.

    python3 bench/gpu_ncu_summary.py NCU.csv [LAST_N]

With LAST_N, only the last N launches count (one graph replay's kernels).
Prints launches, total microseconds, then per kernel: count, mean, sum.
"""
import collections
import csv
import sys


def main():
    rows = list(csv.reader(open(sys.argv[1])))
    header = next((r for r in rows if "Kernel Name" in r), None)
    if header is None:
        sys.exit(f"{sys.argv[1]}: no ncu CSV header (did ncu fail? see the .err file)")
    recs = [dict(zip(header, r)) for r in rows if len(r) == len(header) and r != header]
    if len(sys.argv) > 2:
        recs = recs[-int(sys.argv[2]):]
    by = collections.defaultdict(list)
    for r in recs:
        by[r["Kernel Name"][:40]].append(float(r["Metric Value"].replace(",", "")) / 1000.0)
    total = sum(sum(v) for v in by.values())
    print(f"launches {len(recs)}, total {total:.1f} us")
    for name, v in sorted(by.items(), key=lambda kv: -sum(kv[1])):
        print(f"{name:42s} n={len(v):4d} mean={sum(v) / len(v):7.2f} us sum={sum(v):8.1f} us")


if __name__ == "__main__":
    main()
