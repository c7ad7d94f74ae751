#!/bin/bash
# Runs ON the remote CPU machine (no compiler, no network, python3 only), from
# the repo root: SmolLM2-135M Q4_1, llama.cpp's llama-bench beside rlx.
#
#   bash bench/smollm2_device.sh BUNDLE_DIR [THREADS...]     (default threads: 2 8 16)
#
# BUNDLE_DIR holds
#   llama-bench.tar.gz     the bench/.llama-bench folder (bench/build_llama_bench.sh)
#   smollm2_zero.gguf.gz   the GGUF with zeroed tensor data (bench/zero_gguf.py);
#                          speed does not depend on the weight values
#   rlx                    optional: the rlx binary (rlx columns are null without it)
#
# Per thread count, ROUNDS (default 3) interleaved rounds of
#   llama-bench -m GGUF -p 128 -n 128 -t T -r 3 -o json   (OpenMP default wait policy)
#   rlx bench-llm --model GGUF --prefill 128 --decode 128 --reps 3 --threads T --json
#   the same with --int8-activations
#   both again with RLX_CPU_QUANT_PANELS=0 (the GGUF-layout kernels instead of
#   the AVX-512 weight panels, an A/B of the same binary; same kernels on CPUs
#   without AVX512-VNNI)
# Raw outputs go to $OUT (default /tmp/smollm2-out); the summary, with the
# medians over the rounds and the ratios rlx / llama.cpp, to
# $OUT/smollm2_xeon.json. TIMEOUT (default 600) bounds each run in seconds.
# MODEL=gemma3 MODEL_DESC="Gemma-3-270M Q4_K_M" reads gemma3_zero.gguf.gz
# instead and writes gemma3_xeon.json (any GGUF rlx and llama.cpp both run).
set -u
BUNDLE=${1:?usage: bash bench/smollm2_device.sh BUNDLE_DIR [THREADS...]}
shift
THREADS=${*:-2 8 16}
ROUNDS=${ROUNDS:-3}
TIMEOUT=${TIMEOUT:-600}
OUT=${OUT:-/tmp/smollm2-out}
mkdir -p "$OUT"
W=$(mktemp -d)
trap 'rm -rf "$W"' EXIT
tar -xzf "$BUNDLE/llama-bench.tar.gz" -C "$W" || exit 1
export MODEL=${MODEL:-smollm2}
gzip -dc "$BUNDLE/${MODEL}_zero.gguf.gz" > "$W/smollm2_zero.gguf" || exit 1
LB=$W/.llama-bench/llama-bench
[ -x "$LB" ] || { echo "no .llama-bench/llama-bench in $BUNDLE/llama-bench.tar.gz" >&2; exit 1; }
# This host's libstdc++/libgcc_s first; the bundled ones (fallback/) only if
# llama-bench does not start with them.
# (rlx runs with the environment unchanged.)
LB_LIBS=system
LB_ENV=(env -u OMP_WAIT_POLICY)
if ! "${LB_ENV[@]}" "$LB" --help > "$OUT/llama_help.txt" 2>&1; then
  LB_LIBS=fallback
  LB_ENV+=("LD_LIBRARY_PATH=$W/.llama-bench/fallback${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}")
  "${LB_ENV[@]}" "$LB" --help > "$OUT/llama_help.txt" 2>&1 ||
    { echo "llama-bench does not start:" >&2; cat "$OUT/llama_help.txt" >&2; exit 1; }
fi
echo "llama-bench starts with the $LB_LIBS libstdc++; $(grep -o 'loaded CPU backend from .*' "$OUT/llama_help.txt")"
M=$W/smollm2_zero.gguf
RLX=""
if [ -f "$BUNDLE/rlx" ]; then
  cp "$BUNDLE/rlx" "$W/rlx" && chmod +x "$W/rlx" && RLX=$W/rlx
else
  echo "no $BUNDLE/rlx: llama-bench only"
fi

lscpu > "$OUT/lscpu.txt"; nproc >> "$OUT/lscpu.txt"
lscpu | grep -E 'Model name|Flags'
echo "threads: $THREADS; rounds: $ROUNDS; out: $OUT"
rm -f "$OUT"/t*_r*_*.{json,err} "$OUT/loadavg.txt"

for t in $THREADS; do
  for r in $(seq 1 "$ROUNDS"); do
    echo "t$t r$r load $(cut -d' ' -f1-3 /proc/loadavg)" | tee -a "$OUT/loadavg.txt"
    p=$OUT/t${t}_r${r}
    "${LB_ENV[@]}" timeout "$TIMEOUT" "$LB" -m "$M" -p 128 -n 128 -t "$t" -r 3 -o json \
      > "${p}_llama.json" 2> "${p}_llama.err"
    echo "  llama-bench: exit $? $(grep -o 'loaded CPU backend from .*' "${p}_llama.err" | head -1)"
    if [ -n "$RLX" ]; then
      timeout "$TIMEOUT" "$RLX" bench-llm --model "$M" --prefill 128 --decode 128 --reps 3 \
        --threads "$t" --json > "${p}_rlx_f32.json" 2> "${p}_rlx_f32.err"
      echo "  rlx f32: exit $? $(tail -1 "${p}_rlx_f32.json")"
      timeout "$TIMEOUT" "$RLX" bench-llm --model "$M" --prefill 128 --decode 128 --reps 3 \
        --threads "$t" --json --int8-activations > "${p}_rlx_int8.json" 2> "${p}_rlx_int8.err"
      echo "  rlx int8: exit $? $(tail -1 "${p}_rlx_int8.json")"
      RLX_CPU_QUANT_PANELS=0 timeout "$TIMEOUT" "$RLX" bench-llm --model "$M" --prefill 128 --decode 128 \
        --reps 3 --threads "$t" --json > "${p}_rlx_f32gguf.json" 2> "${p}_rlx_f32gguf.err"
      echo "  rlx f32 (no panels): exit $? $(tail -1 "${p}_rlx_f32gguf.json")"
      RLX_CPU_QUANT_PANELS=0 timeout "$TIMEOUT" "$RLX" bench-llm --model "$M" --prefill 128 --decode 128 \
        --reps 3 --threads "$t" --json --int8-activations > "${p}_rlx_int8gguf.json" 2> "${p}_rlx_int8gguf.err"
      echo "  rlx int8 (no panels): exit $? $(tail -1 "${p}_rlx_int8gguf.json")"
    fi
  done
done
echo "end load $(cut -d' ' -f1-3 /proc/loadavg)" >> "$OUT/loadavg.txt"

OUT=$OUT THREADS=$THREADS ROUNDS=$ROUNDS HAVE_RLX=${RLX:+1} LB_LIBS=$LB_LIBS python3 - <<'PY'
import json, os, re, statistics, datetime
out = os.environ["OUT"]
threads = [int(t) for t in os.environ["THREADS"].split()]
rounds = int(os.environ["ROUNDS"])
have_rlx = bool(os.environ.get("HAVE_RLX"))

def read(path):
    try:
        with open(path) as f:
            return f.read()
    except OSError:
        return ""

lscpu = read(os.path.join(out, "lscpu.txt"))
def lscpu_field(name):
    m = re.search(r"^%s:\s*(.*)$" % re.escape(name), lscpu, re.M)
    return m.group(1).strip() if m else None

def med(xs):
    xs = [x for x in xs if x is not None]
    return statistics.median(xs) if xs else None

def llama_round(t, r):
    """(prefill tok/s, decode tok/s, info) of one llama-bench run: the median of its repetitions."""
    p = os.path.join(out, f"t{t}_r{r}_llama")
    info = {}
    m = re.search(r"loaded CPU backend from (\S+)", read(p + ".err"))
    if m:
        info["cpu_backend_library"] = os.path.basename(m.group(1))
    try:
        rows = json.loads(read(p + ".json"))
    except ValueError:
        return None, None, info
    pp = tg = None
    for row in rows:
        ts = med(row.get("samples_ts") or []) or row.get("avg_ts")
        if row.get("n_prompt") and not row.get("n_gen"):
            pp = ts
        elif row.get("n_gen") and not row.get("n_prompt"):
            tg = ts
        for k in ("cpu_info", "backends", "build_commit", "build_number", "model_type", "type_k", "n_batch", "n_ubatch", "flash_attn"):
            if k in row:
                info[k] = row[k]
    return pp, tg, info

def rlx_round(t, r, mode):
    for line in reversed(read(os.path.join(out, f"t{t}_r{r}_rlx_{mode}.json")).splitlines()):
        try:
            d = json.loads(line)
        except ValueError:
            continue
        if isinstance(d, dict) and "prefill_tok_s" in d:
            return d.get("prefill_tok_s"), d.get("decode_tok_s")
    return None, None

def ratio(a, b):
    return round(a / b, 3) if a is not None and b else None

rows, llama_info = [], {}
for t in threads:
    lb = [llama_round(t, r) for r in range(1, rounds + 1)]
    for _, _, info in lb:
        llama_info.update(info)
    row = {"threads": t,
           "llamacpp": {"prefill_tok_s": med([x[0] for x in lb]), "decode_tok_s": med([x[1] for x in lb]),
                        "prefill_runs": [x[0] for x in lb], "decode_runs": [x[1] for x in lb]}}
    for mode in ("f32", "int8", "f32gguf", "int8gguf"):
        rr = [rlx_round(t, r, mode) for r in range(1, rounds + 1)] if have_rlx else []
        e = {"prefill_tok_s": med([x[0] for x in rr]), "decode_tok_s": med([x[1] for x in rr]),
             "prefill_runs": [x[0] for x in rr], "decode_runs": [x[1] for x in rr]}
        e["prefill_ratio"] = ratio(e["prefill_tok_s"], row["llamacpp"]["prefill_tok_s"])
        e["decode_ratio"] = ratio(e["decode_tok_s"], row["llamacpp"]["decode_tok_s"])
        row["rlx_" + mode] = e
    rows.append(row)

summary = {
    "date": datetime.datetime.now().isoformat(timespec="seconds"),
    "cpu_model": lscpu_field("Model name"),
    "cpu_flags": lscpu_field("Flags"),
    "nproc": int(lscpu.split()[-1]) if lscpu.split() and lscpu.split()[-1].isdigit() else None,
    "model": os.environ.get("MODEL_DESC", "SmolLM2-135M-Instruct Q4_1") + ", tensor data zeroed (bench/zero_gguf.py)",
    "llamacpp": dict(llama_info, libstdcxx=os.environ.get("LB_LIBS"), command="llama-bench -m GGUF -p 128 -n 128 -t T -r 3 -o json (OMP_WAIT_POLICY unset)"),
    "rlx": None if have_rlx else "no rlx binary in the bundle",
    "rlx_command": "rlx bench-llm --model GGUF --prefill 128 --decode 128 --reps 3 --threads T --json [--int8-activations]; f32gguf/int8gguf: RLX_CPU_QUANT_PANELS=0 (GGUF-layout kernels instead of the AVX-512 weight panels)",
    "rounds": rounds,
    "ratio": "rlx / llama.cpp tok/s (higher is better for rlx); medians over the rounds",
    "loadavg": read(os.path.join(out, "loadavg.txt")).splitlines(),
    "rows": rows,
}
if have_rlx:
    del summary["rlx"]
with open(os.path.join(out, os.environ["MODEL"] + "_xeon.json"), "w") as f:
    json.dump(summary, f, indent=1)
    f.write("\n")

fmt = lambda x: "-" if x is None else (f"{x:.3f}" if x < 10 else f"{x:.1f}")
print(f"{summary['cpu_model']}; llama.cpp CPU backend: {llama_info.get('cpu_backend_library')}")
print("threads | llama pp | llama tg | rlx f32 pp (ratio) | rlx f32 tg (ratio) | rlx int8 pp (ratio) | rlx int8 tg (ratio) | no panels: f32 pp | f32 tg | int8 pp | int8 tg")
for row in rows:
    l, a, b = row["llamacpp"], row["rlx_f32"], row["rlx_int8"]
    c, e = row["rlx_f32gguf"], row["rlx_int8gguf"]
    print(f"{row['threads']:7d} | {fmt(l['prefill_tok_s'])} | {fmt(l['decode_tok_s'])} | "
          f"{fmt(a['prefill_tok_s'])} ({fmt(a['prefill_ratio'])}) | {fmt(a['decode_tok_s'])} ({fmt(a['decode_ratio'])}) | "
          f"{fmt(b['prefill_tok_s'])} ({fmt(b['prefill_ratio'])}) | {fmt(b['decode_tok_s'])} ({fmt(b['decode_ratio'])}) | "
          f"{fmt(c['prefill_tok_s'])} | {fmt(c['decode_tok_s'])} | {fmt(e['prefill_tok_s'])} | {fmt(e['decode_tok_s'])}")
print("wrote", os.path.join(out, os.environ["MODEL"] + "_xeon.json"))
PY
