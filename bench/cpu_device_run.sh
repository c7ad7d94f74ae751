#!/bin/bash
# Runs ON the GPU machine (its 16-core Intel Xeon), from the repo root: the
# CPU test binaries of a bundle made by bench/gpu_prepare.py (with the
# default, best ISA; isa_variants and the kernel unit tests compare every
# ISA the CPU has inside one run), then bench/minilm_ort.py beside ONNX
# Runtime at each thread count. `ab` times rlx alone: RLX_CPU_ISA avx2 vs
# avx512, thunks vs hybrid, MiniLM 1x128 and 32x128. Logs and results go to
# $OUT.
#
#   bash bench/cpu_device_run.sh BUNDLE_DIR [tests|bench|ab|all] [THREADS...]
set -u
BUNDLE=${1:-.gpu}
WHAT=${2:-all}
shift 2 2>/dev/null
THREADS=${*:-2 8 16}
OUT=${OUT:-/tmp/rlx-cpu-out}
mkdir -p "$OUT"
W=$(mktemp -d)
tar -xzf "$BUNDLE/bundle.tar.gz" -C "$W"
S=$W/stage
export RLX_MODELS_DIR=$S/models
M=$S/models/all-minilm-l6-v2
{ lscpu; nproc; } > "$OUT/lscpu.txt"
grep -m1 "model name" /proc/cpuinfo
"$S/rlx" bench --model "$M" --batch 1 --seq 16 --iters 1 --profile 2>&1 | grep -E "^kernels|FMA peak"
if [ "$WHAT" = tests ] || [ "$WHAT" = all ]; then
  for t in "$S"/tests/*; do
    n=$(basename "$t")
    timeout 300 "$t" --test-threads=4 > "$OUT/test_$n.log" 2>&1
    echo "$n: exit $? $(grep -E '^test result' "$OUT/test_$n.log" | tail -1)"
  done
fi
if [ "$WHAT" = ab ]; then
  for t in $THREADS; do for shape in "1 128" "32 128"; do set -- $shape
    for r in 1 2; do for isa in avx2 avx512; do for mode in thunks hybrid; do
      echo -n "t$t ${1}x$2 $isa $mode r$r: "
      RLX_CPU_ISA=$isa timeout 120 "$S/rlx" bench --model "$M" --batch $1 --seq $2 --mode $mode \
        --threads $t --iters $([ $1 = 1 ] && echo 30 || echo 5) | grep -o "median.*"
    done; done; done
  done; done
  exit 0
fi
if [ "$WHAT" = bench ] || [ "$WHAT" = all ]; then
  for t in $THREADS; do
    timeout 400 python3 bench/minilm_ort.py --model-dir "$M" --rlx-bin "$S/rlx" --threads "$t" \
      --shapes "${SHAPES:-1x128,32x128}" --rounds "${ROUNDS:-3}" --iters "${ITERS:-7}" \
      --modes "${MODES:-thunks,hybrid,hybrid-bf16}" \
      --out-dir "$OUT" --tag "_xeon_t$t" 2>&1 | grep -E "^\[bench\]|error|Error"
  done
fi
