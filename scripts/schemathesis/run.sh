#!/usr/bin/env bash
# schemathesis against `rlx serve` on loopback, driven by the server's own
# /openapi.json: makes the pinned venv, then runs run.py with the `rlx`
# binary (default target/debug/rlx, as `cargo test --workspace` leaves it;
# RLX_BIN overrides). Needs the fetched models (scripts/fetch_models.py all).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
py="$(bash "$root/scripts/schemathesis/setup_venv.sh")"
export RLX_BIN="${RLX_BIN:-$root/target/debug/rlx}"
exec "$py" "$root/scripts/schemathesis/run.py"
