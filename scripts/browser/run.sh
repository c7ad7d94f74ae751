#!/usr/bin/env bash
# The page at `/` in headless Chromium, against `rlx serve --embed-model
# minilm --llm smollm2 --ctx 128` on a free loopback port: installs
# chromium and the pinned venv when missing (setup.sh), then runs
# test_page.py with the `rlx` binary (default target/debug/rlx, as `cargo
# test --workspace` leaves it; RLX_BIN overrides). The screenshot goes to
# target/browser/page.png (RLX_SCREENSHOT overrides). Needs the fetched
# models (scripts/fetch_models.py all).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
py="$(bash "$root/scripts/browser/setup.sh")"
export RLX_BIN="${RLX_BIN:-$root/target/debug/rlx}"
export RLX_SCREENSHOT="${RLX_SCREENSHOT:-$root/target/browser/page.png}"
exec "$py" "$root/scripts/browser/test_page.py"
