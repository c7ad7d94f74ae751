#!/usr/bin/env bash
# Installs what scripts/browser/test_page.py needs, only what is missing
# (idempotent, non-interactive):
# - Debian's `chromium` (apt-get; headless Chromium, driven over the Chrome
#   DevTools Protocol, so no chromedriver and no downloaded browser);
# - .venv-browser (at the repository root) with `websocket-client`, pinned.
# Prints the venv's python on stdout (everything else goes to stderr).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
venv="$root/.venv-browser"
python="${PYTHON:-python3}"

find_chromium() {
  command -v chromium || command -v chromium-browser || true
}

if [ -z "$(find_chromium)" ]; then
  echo "[browser setup] installing chromium with apt-get" >&2
  sudo_=()
  if [ "$(id -u)" != 0 ]; then
    if command -v sudo >/dev/null && sudo -n true 2>/dev/null; then
      sudo_=(sudo -n)
    else
      echo "[browser setup] ERROR: chromium is missing and installing it needs root (apt-get install chromium)" >&2
      exit 1
    fi
  fi
  export DEBIAN_FRONTEND=noninteractive
  # Try the local package lists first; refresh them only if that fails.
  if ! "${sudo_[@]}" apt-get install -y -q --no-install-recommends chromium >&2; then
    "${sudo_[@]}" apt-get update -q >&2
    "${sudo_[@]}" apt-get install -y -q --no-install-recommends chromium >&2
  fi
  if [ -z "$(find_chromium)" ]; then
    echo "[browser setup] ERROR: apt-get installed chromium but no chromium binary is on PATH" >&2
    exit 1
  fi
fi
echo "[browser setup] $("$(find_chromium)" --version 2>/dev/null || echo chromium)" >&2

pins=(
  "websocket-client==1.8.0"
)
if [ ! -x "$venv/bin/python" ]; then
  echo "[browser setup] creating $venv" >&2
  if ! "$python" -m venv "$venv"; then
    echo "[browser setup] ERROR: '$python -m venv' failed; install the venv module (e.g. apt-get install python3-venv) or set PYTHON=/path/to/python3" >&2
    exit 1
  fi
fi
if ! "$venv/bin/python" -c "import importlib.metadata as m, sys; sys.exit(m.version('websocket-client') != '1.8.0')" 2>/dev/null; then
  if ! "$venv/bin/python" -m pip install --quiet "${pins[@]}" >&2; then
    echo "[browser setup] ERROR: pip install of ${pins[*]} failed; check that PyPI is reachable and rerun" >&2
    exit 1
  fi
fi
echo "$venv/bin/python"
