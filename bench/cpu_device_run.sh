#!/bin/bash
# Runs ON the GPU machine (its 16-core Intel Xeon), from the repo root: the
# CPU test binaries of a bundle made by bench/gpu_prepare.py under every
# RLX_CPU_ISA the CPU supports, then bench/minilm_ort.py beside ONNX Runtime
# at each thread count. Logs and results go to $OUT.
#
#   bash bench/cpu_device_run.sh BUNDLE_DIR [tests|bench|all] [THREADS...]
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
if [ "$WHAT" != bench ]; then
  for isa in portable avx2 avx512; do
    for t in "$S"/tests/*; do
      n=$(basename "$t")
      RLX_CPU_ISA=$isa timeout 300 "$t" --test-threads=4 > "$OUT/test_${isa}_$n.log" 2>&1
      echo "RLX_CPU_ISA=$isa $n: exit $? $(grep -E '^test result' "$OUT/test_${isa}_$n.log" | tail -1)"
    done
  done
fi
if [ "$WHAT" != tests ]; then
  for t in $THREADS; do
    timeout 400 python3 bench/minilm_ort.py --model-dir "$M" --rlx-bin "$S/rlx" --threads "$t" \
      --shapes "${SHAPES:-1x128,32x128}" --rounds "${ROUNDS:-3}" --iters "${ITERS:-7}" \
      --out-dir "$OUT" --tag "_xeon_t$t" 2>&1 | grep -E "^\[bench\]|error|Error" 
  done
fi
