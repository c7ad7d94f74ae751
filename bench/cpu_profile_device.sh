#!/bin/bash
# Runs ON the GPU machine's 16-core Xeon (no compiler, no network), from the
# repo root: the profiles and hybrid/thunks ratios that issue #20's notes
# quote. Inputs (made here with bench/gpu_prepare.py and
# bench/build_llama_bench.sh / bench/zero_gguf.py):
#   $1/m/bundle.tar.gz        rlx + the trimmed MiniLM (bench/gpu_prepare.py)
#   $1/s/llama-bench.tar.gz   llama-bench (bench/build_llama_bench.sh; optional: without it percore.txt has rlx only)
#   $1/s/smollm2_zero.gguf.gz SmolLM2 Q4_1 with zeroed tensor data
#   $1/s/bench_recurrent.gz   `cargo build --release -p rlx --example bench_recurrent`, gzipped
# Everything lands in $OUT/results.tgz:
#   prof_llm_t{2,16}_{f32,int8}.txt  rlx bench-llm --profile (prefill of $PREFILL, default 128, and decode step profiles)
#   percore.txt                  llama-bench vs rlx decode at 1 and 2 threads
#   prof_minilm_*.txt            rlx bench --profile, MiniLM hybrid and thunks
#   hybrid_cpu_xeon.{md,json}    bench/hybrid_cpu.py at $HYBRID_THREADS
#   rec_t{2,8,16}/               the GDN block benchmark per thread count
#   plan_*.txt                   rlx plan (segment layouts and cost figures)
# HYBRID_THREADS (default 2,8,16): the thread counts of bench/hybrid_cpu.py
set -u
B=${1:-.gpu}
T0=$(date +%s)
R=$(mktemp -d)
el() { echo "[t+$(( $(date +%s) - T0 ))s] $*"; }
S=$(mktemp -d); tar -xzf "$B/m/bundle.tar.gz" -C "$S"
RLX=$S/stage/rlx; M=$S/stage/models/all-minilm-l6-v2
W=$(mktemp -d); [ -f "$B/s/llama-bench.tar.gz" ] && tar -xzf "$B/s/llama-bench.tar.gz" -C "$W"
gzip -dc "$B/s/smollm2_zero.gguf.gz" > "$W/z.gguf"
gzip -dc "$B/s/bench_recurrent.gz" > "$W/br"; chmod +x "$W/br"
{ lscpu; lscpu -e; nproc; grep . /sys/devices/system/cpu/cpu0/cache/index*/{level,size}; } > "$R/lscpu.txt" 2>&1
LB=$W/.llama-bench/llama-bench
LBE=(env -u OMP_WAIT_POLICY)
"${LBE[@]}" "$LB" --help > /dev/null 2>&1 || LBE+=("LD_LIBRARY_PATH=$W/.llama-bench/fallback")

el "decode profiles"
for t in 2 16; do for act in f32 int8; do
  flag=""; [ $act = int8 ] && flag=--int8-activations
  timeout 60 "$RLX" bench-llm --model "$W/z.gguf" --prefill ${PREFILL:-128} --decode 64 --reps 1 --threads $t $flag --profile \
    > "$R/prof_llm_t${t}_$act.txt" 2>&1
done; done
el "per core"
for t in 1 2; do
  [ -x "$LB" ] && echo "t$t llama: $("${LBE[@]}" timeout 90 "$LB" -m "$W/z.gguf" -p 64 -n 64 -t $t -r 2 2>&1 | grep -E '(pp|tg)64' | tr -s ' ' | tr '\n' ' ')" >> "$R/percore.txt"
  for act in f32 int8; do
    flag=""; [ $act = int8 ] && flag=--int8-activations
    echo "t$t rlx $act: $(timeout 60 "$RLX" bench-llm --model "$W/z.gguf" --prefill 64 --decode 64 --reps 2 --threads $t $flag 2>&1 | tail -1)" >> "$R/percore.txt"
  done
done
cat "$R/percore.txt"
el "minilm profiles"
for mode in hybrid thunks; do
  timeout 60 "$RLX" bench --model "$M" --batch 1 --seq 128 --threads 2 --mode $mode --iters 20 --profile > "$R/prof_minilm_t2_1x128_$mode.txt" 2>&1
  timeout 60 "$RLX" bench --model "$M" --batch 32 --seq 128 --threads 16 --mode $mode --iters 5 --profile > "$R/prof_minilm_t16_32x128_$mode.txt" 2>&1
done
timeout 60 "$RLX" bench --model "$M" --batch 32 --seq 128 --threads 2 --mode hybrid --iters 3 --profile > "$R/prof_minilm_t2_32x128_hybrid.txt" 2>&1
timeout 60 "$RLX" bench --model "$M" --batch 1 --seq 128 --threads 16 --mode hybrid --iters 20 --profile > "$R/prof_minilm_t16_1x128_hybrid.txt" 2>&1
timeout 60 "$RLX" bench --model "$M" --batch 1 --seq 128 --threads 16 --mode hybrid --precision bf16 --iters 20 --profile > "$R/prof_minilm_t16_1x128_bf16.txt" 2>&1
timeout 60 "$RLX" bench --model "$M" --batch 1 --seq 128 --threads 2 --mode hybrid --precision bf16 --iters 20 --profile > "$R/prof_minilm_t2_1x128_bf16.txt" 2>&1
for t in 2 16; do "$RLX" plan --model "$M" --batch 32 --seq 128 --threads $t > "$R/plan_minilm_32x128_t$t.txt" 2>&1; done
el "hybrid vs thunks"
timeout 240 python3 bench/hybrid_cpu.py --rlx-bin "$RLX" --model "$M" --threads ${HYBRID_THREADS:-2,8,16} --batches 1,32 \
  --rounds 3 --iters 10 --out-dir "$R" --tag _xeon 2>&1 | grep "^\[bench\]"
el "recurrent"
for t in 2 8 16; do
  RAYON_NUM_THREADS=$t timeout 90 "$W/br" --runs 5 --out "$R/rec_t$t" > "$R/rec_t$t.log" 2>&1
  grep -E "prefill|decode" "$R/rec_t$t.log" | sed "s/^/t$t /"
done
el done
tar -czf "${OUT:-/tmp}/results.tgz" -C "$R" .
