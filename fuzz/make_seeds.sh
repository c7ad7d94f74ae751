#!/usr/bin/env bash
# Regenerates the committed seeds in fuzz/seeds/: the hand-built valid and
# corrupt files of the rlx-formats tests (saved through RLX_FUZZ_SEED_DIR by
# tests/common::tmp_file), and the slices of the real model files and
# reference data that make_seeds.py cuts (models fetched by
# scripts/fetch_models.py all).
set -euo pipefail
cd "$(dirname "$0")/.."
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
# The exhaustive truncation / byte-flip loops would add thousands of
# near-duplicates: the fuzzer makes those itself.
RLX_FUZZ_SEED_DIR="$tmp" cargo test -q -p rlx-formats --test gguf --test safetensors -- \
    --skip every_truncation --skip byte_flips --skip truncated_files
rm -rf fuzz/seeds
mkdir -p fuzz/seeds/gguf fuzz/seeds/safetensors
for f in "$tmp"/*; do
    case "$f" in
        *.gguf) cp "$f" "fuzz/seeds/gguf/test-$(basename "$f")" ;;
        *.safetensors) cp "$f" "fuzz/seeds/safetensors/test-$(basename "$f")" ;;
    esac
done
python3 fuzz/make_seeds.py
du -sh fuzz/seeds/*
