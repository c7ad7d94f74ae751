#!/bin/bash
# Runs ON the GPU machine: per-kernel device times of one hybrid MiniLM run
# (every node of the CUDA graph), with Nsight Compute, warm caches and
# unlocked clocks, then a summary by kernel of the last run's launches.
#
#   bash bench/gpu_ncu.sh BUNDLE_DIR [BATCH] [PRECISION]      (defaults: 1 bf16)
#
# cuBLASLt's algorithm timing at compile time launches hundreds of matmuls
# before the model runs, so only rlx's own kernels are profiled (-k): the
# summary covers the last run's non-matmul kernels; a matmul's time is the
# graph's total minus theirs (or profile with -k regex:nvjet and take the
# last 24 launches). Output: $OUT/ncu_B.csv and the summary on stdout.
set -u
BUNDLE=${1:-.gpu}
B=${2:-1}
P=${3:-bf16}
OUT=${OUT:-/tmp/rlx-gpu-out}
mkdir -p "$OUT"
W=$(mktemp -d)
tar -xzf "$BUNDLE/bundle.tar.gz" -C "$W"
S=$W/stage
export RLX_MODELS_DIR=$S/models
M=$S/models/all-minilm-l6-v2
NCU=${NCU:-/usr/local/cuda/bin/ncu}
# One run with --iters 1 --warmup 0: the launches of the last graph replay
# are the last N of the CSV (N = the graph's non-matmul kernels).
"$NCU" --graph-profiling node --cache-control none --clock-control none \
  -k regex:"^(attention|norm|reduce|gather|binary|rlx_|activation|softmax|bias_act)" \
  --metrics gpu__time_duration.sum --csv \
  "$S/rlx" bench --model "$M" --device cuda --mode hybrid --precision "$P" \
  --batch "$B" --seq 128 --iters 1 --warmup 0 > "$OUT/ncu_$B.csv" 2> "$OUT/ncu_$B.err"
echo "ncu rc=$?"
python3 "$(dirname "$0")/gpu_ncu_summary.py" "$OUT/ncu_$B.csv"
