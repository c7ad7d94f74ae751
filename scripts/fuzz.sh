#!/usr/bin/env bash
# Builds the cargo-fuzz targets in fuzz/ and runs each for a bounded time.
#
#   RLX_FUZZ_SECS     seconds per target (default 60)
#   RLX_FUZZ_RSS_MB   libFuzzer -rss_limit_mb and -malloc_limit_mb (default
#                     2048): a memory blow-up fails like a crash
#   RLX_FUZZ_TARGETS  space-separated subset (default: all five)
#
# Each target starts from the committed seeds (fuzz/seeds/<target>) plus
# what earlier local runs found (fuzz/corpus/<target>, git-ignored). A
# crash, panic, per-input timeout (10 s) or memory blow-up leaves the input
# in fuzz/artifacts/<target>/ and makes this script exit non-zero after the
# other targets have run. Reproduce one with
#   (cd fuzz && cargo +nightly fuzz run <target> artifacts/<target>/<file>)
#
# Toolchain: cargo-fuzz needs nightly rustc flags. It uses the `nightly`
# rustup toolchain where installed; otherwise the stable one with
# RUSTC_BOOTSTRAP=1 (the machine's one toolchain; no other can be fetched
# there). cargo-fuzz itself is installed from crates.io when absent.
set -euo pipefail
cd "$(dirname "$0")/.."

SECS="${RLX_FUZZ_SECS:-60}"
RSS_MB="${RLX_FUZZ_RSS_MB:-2048}"
TARGETS="${RLX_FUZZ_TARGETS:-safetensors gguf gguf_tokenizer bert_config reference_json}"

if ! cargo fuzz --version >/dev/null 2>&1; then
    echo "fuzz: installing cargo-fuzz (cargo install cargo-fuzz --locked)"
    cargo install cargo-fuzz --locked
fi

FUZZ=(cargo fuzz)
if rustup run nightly rustc --version >/dev/null 2>&1; then
    FUZZ=(cargo +nightly fuzz)
else
    echo "fuzz: no nightly toolchain; using $(rustc --version) with RUSTC_BOOTSTRAP=1"
    export RUSTC_BOOTSTRAP=1
fi

cd fuzz
start=$(date +%s)
"${FUZZ[@]}" build
echo "fuzz: built all targets in $(($(date +%s) - start)) s"

failed=()
for t in $TARGETS; do
    mkdir -p "corpus/$t" "seeds/$t" "artifacts/$t"
    echo "fuzz: $t for ${SECS} s (rss limit ${RSS_MB} MB)"
    # The first corpus dir receives new inputs; the seeds stay as committed.
    if ! "${FUZZ[@]}" run "$t" "corpus/$t" "seeds/$t" -- \
        -max_total_time="$SECS" -rss_limit_mb="$RSS_MB" -malloc_limit_mb="$RSS_MB" \
        -timeout=10 -print_final_stats=1 -close_fd_mask=3 \
        -artifact_prefix="artifacts/$t/" 2>"artifacts/$t/log.txt"; then
        failed+=("$t")
        echo "fuzz: $t FAILED; last lines of fuzz/artifacts/$t/log.txt:"
        tail -n 40 "artifacts/$t/log.txt"
    fi
    grep -E '^stat::number_of_executed_units|^stat::peak_rss_mb|^#[0-9]+ *DONE' "artifacts/$t/log.txt" || true
done

if ((${#failed[@]})); then
    echo "fuzz: crashes in: ${failed[*]} (inputs in fuzz/artifacts/)"
    exit 1
fi
echo "fuzz: no crashes in: $TARGETS"
