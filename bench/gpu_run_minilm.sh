#!/bin/bash
# Runs ON the GPU machine, from the repo root: the CUDA test binaries of the
# bundle made by bench/gpu_prepare.py, a per-kernel profile, then the MiniLM
# benchmark (bench/gpu_minilm.py). Logs and results go to $OUT.
#
#   bash bench/gpu_run_minilm.sh BUNDLE_DIR [bench|tests|all|ab|vs OLD_RLX]
#
# `vs` compares the bundle's rlx with another build (OLD_RLX: a binary, or
# a .gz of one, carried beside the bundle) in the same run: three rounds of
# MiniLM bf16 hybrid at 1x128 and 32x128 and a SmolLM2-shaped decode
# (synthetic weights, hybrid), the two builds alternating.
#
# `ab` runs only the A/B rounds of the CUDA switches with one binary:
# programmatic dependent launch (RLX_CUDA_PDL) and rlx's small-matmul kernel
# (RLX_CUDA_SMALL_GEMM) on MiniLM 1x128 bf16 hybrid, and programmatic launch
# on a SmolLM2-shaped decode with synthetic weights (hybrid and thunks).
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
if [ "$WHAT" = vs ]; then
  OLD=${3:?usage: gpu_run_minilm.sh BUNDLE_DIR vs OLD_RLX}
  case "$OLD" in
    *.gz) gunzip -c "$OLD" > "$W/rlx_old" ;;
    *) cp "$OLD" "$W/rlx_old" ;;
  esac
  chmod +x "$W/rlx_old"
  for r in 1 2 3; do for v in old new; do
    B=$S/rlx; [ $v = old ] && B=$W/rlx_old
    for b in 1 32; do
      echo -n "round $r MiniLM ${b}x128 bf16 hybrid $v: "
      timeout 60 "$B" bench --model "$M" --device cuda --mode hybrid --precision bf16 --batch $b \
        --seq 128 --iters 300 --warmup 20 2>&1 | grep -o "median.*"
    done
    echo -n "round $r SmolLM2-shaped decode hybrid $v: "
    timeout 120 "$B" bench-llm --device cuda --synthetic --prefill 16 --decode 128 --reps 5 \
      --mode hybrid --json 2>&1 | tail -1
  done; done 2>&1 | tee "$OUT/vs.log"
  exit 0
fi
if [ "$WHAT" = ab ]; then
  for r in 1 2; do
    for sg in 0 1; do for pdl in 0 1; do
      echo -n "round $r MiniLM 1x128 bf16 hybrid small_gemm=$sg pdl=$pdl: "
      RLX_CUDA_SMALL_GEMM=$sg RLX_CUDA_PDL=$pdl timeout 60 "$S/rlx" bench --model "$M" --device cuda \
        --mode hybrid --precision bf16 --batch 1 --seq 128 --iters 300 --warmup 30 2>&1 | grep -o "median.*"
    done; done
    for mode in hybrid thunks; do for pdl in 0 1; do
      echo -n "round $r SmolLM2-shaped decode $mode pdl=$pdl: "
      RLX_CUDA_PDL=$pdl timeout 120 "$S/rlx" bench-llm --device cuda --synthetic --prefill 16 --decode 128 \
        --reps 5 --mode $mode --json 2>&1 | tail -1
    done; done
  done 2>&1 | tee "$OUT/ab.log"
  exit 0
fi
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
