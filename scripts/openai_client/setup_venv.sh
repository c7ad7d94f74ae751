#!/usr/bin/env bash
# Creates .venv-openai (at the repository root) with the official `openai`
# Python client and its dependencies, pinned, for test_openai_client.py.
# Idempotent: reuses an existing venv and only installs what is missing.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
venv="$root/.venv-openai"
python="${PYTHON:-python3}"

pins=(
  "openai==3.60.0"
  "annotated-types==0.8.0"
  "anyio==4.16.0"
  "h11==0.16.0"
  "httpcore2==2.16.2"
  "httpx2==2.16.2"
  "idna==3.20"
  "jiter==0.19.0"
  "pydantic==2.14.4"
  "pydantic_core==2.50.5"
  "sniffio==1.3.1"
  "truststore==0.10.5"
  "typing-inspection==0.4.5"
  "typing_extensions==4.16.0"
)

if [ ! -x "$venv/bin/python" ]; then
  echo "[openai venv] creating $venv" >&2
  if ! "$python" -m venv "$venv"; then
    echo "[openai venv] ERROR: '$python -m venv' failed; install the venv module (e.g. apt-get install python3-venv) or set PYTHON=/path/to/python3" >&2
    exit 1
  fi
fi
if ! "$venv/bin/python" -m pip install --quiet "${pins[@]}"; then
  echo "[openai venv] ERROR: pip install of ${pins[*]} failed; check that PyPI is reachable and rerun" >&2
  exit 1
fi
echo "$venv/bin/python"
