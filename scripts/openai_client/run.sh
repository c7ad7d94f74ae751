#!/usr/bin/env bash
# The official OpenAI Python client against `rlx serve` on loopback: makes
# the pinned venv, then runs test_openai_client.py with the `rlx` binary
# (default target/debug/rlx, as `cargo test --workspace` leaves it; RLX_BIN
# overrides). Needs the fetched models (scripts/fetch_models.py all).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
py="$(bash "$root/scripts/openai_client/setup_venv.sh")"
export RLX_BIN="${RLX_BIN:-$root/target/debug/rlx}"
exec "$py" "$root/scripts/openai_client/test_openai_client.py"
