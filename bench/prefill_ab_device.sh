#!/bin/bash
# Runs ON the GPU machine's CPU (no compiler, no network), from the repo root:
# an A/B of the f32 prefill kernels, then bench/smollm2_device.sh.
#
#   bash bench/prefill_ab_device.sh BUNDLE_DIR [THREADS...]   (default threads: 2 16)
#
# BUNDLE_DIR holds rlx.gz (the build under test), rlx_base.gz (the build to
# compare with), panel_decode_speed.gz (crates/rlx-cpu/examples), and what
# smollm2_device.sh reads (llama-bench.tar.gz, smollm2_zero.gguf.gz).
# Per thread count:
#   panel_decode_speed ROWS=128 HEAD=0 (SmolLM2's 210 Q4_1 projections over
#   128 rows), VIA=panels (the panel kernel) against the default (dequantized
#   panels into the f32 GEMM), 3 interleaved rounds;
#   rlx_base and rlx bench-llm --prefill 128 --decode 16, f32 activations,
#   3 interleaved rounds.
# Then smollm2_device.sh with the new rlx. Logs to $OUT (default
# /tmp/prefill-ab-out).
set -u
BUNDLE=${1:?usage: bash bench/prefill_ab_device.sh BUNDLE_DIR [THREADS...]}
shift
THREADS=${*:-2 16}
OUT=${OUT:-/tmp/prefill-ab-out}
mkdir -p "$OUT"
W=$(mktemp -d)
trap 'rm -rf "$W"' EXIT
for b in rlx rlx_base panel_decode_speed; do
  gzip -dc "$BUNDLE/$b.gz" > "$W/$b" && chmod +x "$W/$b" || exit 1
done
gzip -dc "$BUNDLE/smollm2_zero.gguf.gz" > "$W/m.gguf" || exit 1
lscpu | grep -E 'Model name|^CPU\(s\)|Thread|Flags' > "$OUT/lscpu_ab.txt"
grep -m1 "model name" /proc/cpuinfo
for t in $THREADS; do
  for r in 1 2 3; do
    for via in panels dequant; do
      echo -n "t$t r$r kernels $via: "
      THREADS=$t VIA=$via ROWS=128 HEAD=0 timeout 120 "$W/panel_decode_speed"
    done
    for b in rlx_base rlx; do
      echo -n "t$t r$r $b: "
      timeout 300 "$W/$b" bench-llm --model "$W/m.gguf" --prefill 128 --decode 16 --reps 3 \
        --threads "$t" 2>&1 | grep -oE "prefill 128 tokens: [0-9.]+ tok/s; decode 16 tokens: [0-9.]+ tok/s" | head -1
    done
  done
done 2>&1 | tee "$OUT/ab.txt"
S=$W/smollm2
mkdir -p "$S"
cp "$BUNDLE/llama-bench.tar.gz" "$BUNDLE/smollm2_zero.gguf.gz" "$S/"
cp "$W/rlx" "$S/rlx"
OUT=$OUT bash bench/smollm2_device.sh "$S" $THREADS
