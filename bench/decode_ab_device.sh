#!/bin/bash
# Runs ON the GPU machine's CPU (or here), from the repo root: an
# interleaved A/B of SmolLM2 decode and prefill between two rlx builds and
# the thread-team switch, on the zeroed GGUF of bench/smollm2_device.sh's
# bundle:
#
#   bash bench/decode_ab_device.sh BUNDLE_DIR [THREADS...]   (default 2 16)
#
# BUNDLE_DIR holds smollm2_zero.gguf.gz, rlx and rlx_base (the build to
# compare against). Per thread count and round (ROUNDS, default 3), each of
#   base        rlx_base
#   team        rlx                       (RLX_CPU_TEAM unset: the team)
#   no-team     rlx with RLX_CPU_TEAM=0   (rayon fork-joins)
# runs `bench-llm --prefill 128 --decode 128 --reps 3 --json`, with f32 and
# with int8 activations. One JSON line per run goes to stdout and to
# $OUT/decode_ab.jsonl (default /tmp/decode-ab).
set -u
BUNDLE=${1:?usage: bash bench/decode_ab_device.sh BUNDLE_DIR [THREADS...]}
shift
THREADS=${*:-2 16}
ROUNDS=${ROUNDS:-3}
OUT=${OUT:-/tmp/decode-ab}
mkdir -p "$OUT"
W=$(mktemp -d)
trap 'rm -rf "$W"' EXIT
gzip -dc "$BUNDLE/smollm2_zero.gguf.gz" > "$W/m.gguf" || exit 1
for b in rlx rlx_base; do
  cp "$BUNDLE/$b" "$W/$b" && chmod +x "$W/$b" || exit 1
done
for t in $THREADS; do
  for r in $(seq "$ROUNDS"); do
    for act in f32 int8; do
      flag=$([ "$act" = int8 ] && echo --int8-activations)
      for v in base team no-team; do
        case $v in
          base) cmd=("$W/rlx_base") ;;
          team) cmd=(env -u RLX_CPU_TEAM "$W/rlx") ;;
          no-team) cmd=(env RLX_CPU_TEAM=0 "$W/rlx") ;;
        esac
        line=$(timeout 300 "${cmd[@]}" bench-llm --model "$W/m.gguf" --prefill 128 --decode 128 \
          --reps 3 --threads "$t" $flag --json 2>/dev/null | tail -1)
        echo "{\"threads\":$t,\"round\":$r,\"variant\":\"$v\",\"act\":\"$act\",\"run\":${line:-null}}" |
          tee -a "$OUT/decode_ab.jsonl"
      done
    done
  done
done
