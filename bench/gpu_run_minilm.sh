#!/bin/bash
# Runs ON the GPU machine, from the repo root: the CUDA test binaries of the
# bundle made by bench/gpu_prepare.py, a per-kernel profile, then the MiniLM
# benchmark (bench/gpu_minilm.py). Logs and results go to $OUT.
#
#   bash bench/gpu_run_minilm.sh BUNDLE_DIR [bench|tests|all]
set -u
BUNDLE=${1:-.gpu}
WHAT=${2:-all}
OUT=${OUT:-/tmp/rlx-gpu-out}
mkdir -p "$OUT"
W=$(mktemp -d)
tar -xzf "$BUNDLE/bundle.tar.gz" -C "$W"
S=$W/stage
export RLX_MODELS_DIR=$S/models
M=$S/models/all-minilm-l6-v2
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee "$OUT/gpu.txt"
if [ "$WHAT" != bench ]; then
  for t in "$S"/tests/*; do
    n=$(basename "$t")
    timeout 300 "$t" --test-threads=1 --nocapture > "$OUT/test_$n.log" 2>&1
    echo "test $n: rc=$?"
    grep -E "^test |test result|MiniLM|bucket|panicked" "$OUT/test_$n.log" | tail -25
  done
fi
if [ "$WHAT" != tests ]; then
  for p in f32 bf16; do
    for shape in "1 128" "32 128"; do
      set -- $shape
      RLX_CUDA_PROFILE=1 timeout 120 "$S/rlx" bench --model "$M" --device cuda --mode thunks \
        --precision $p --batch $1 --seq $2 --iters 10 --warmup 2 > "$OUT/profile_${p}_$1x$2.log" 2>&1
      echo "profile $p $1x$2: rc=$?"; head -14 "$OUT/profile_${p}_$1x$2.log"
    done
  done
  timeout 420 python3 bench/gpu_minilm.py --model-dir "$M" --rlx "$S/rlx" --out "$OUT" --iters 200 \
    2>&1 | tail -60
fi
