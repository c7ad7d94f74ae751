#!/usr/bin/env bash
# Creates .venv-schemathesis (at the repository root) with schemathesis and
# its dependencies, pinned, for run.py. Idempotent: reuses an existing venv
# and only installs what is missing. Prints the venv's python.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
venv="$root/.venv-schemathesis"
python="${PYTHON:-python3}"

pins=(
  "schemathesis==4.32.5"
  "anyio==4.16.0"
  "certifi==2026.10.19.post1"
  "charset-normalizer==3.5.3"
  "click==8.5.1"
  "graphql-core==3.3.2"
  "harfile==0.6.0"
  "hypothesis==6.170.27"
  "hypothesis-graphql==0.13.5"
  "idna==3.20"
  "iniconfig==2.3.1"
  "jsonschema_rs==0.60.3"
  "markdown-it-py==4.3.0"
  "MarkupSafe==3.0.4"
  "mdurl==0.1.2"
  "packaging==26.4"
  "pluggy==1.7.0"
  "Pygments==2.21.0"
  "pyrate-limiter==4.6.0"
  "pytest==9.2.0"
  "PyYAML==6.0.4"
  "requests==2.34.2"
  "rich==15.0.0"
  "sortedcontainers==2.4.0"
  "typing_extensions==4.16.0"
  "urllib3==2.8.0"
  "Werkzeug==3.1.9"
)

if [ ! -x "$venv/bin/python" ]; then
  echo "[schemathesis venv] creating $venv" >&2
  if ! "$python" -m venv "$venv"; then
    echo "[schemathesis venv] ERROR: '$python -m venv' failed; install the venv module (e.g. apt-get install python3-venv) or set PYTHON=/path/to/python3" >&2
    exit 1
  fi
fi
if ! "$venv/bin/python" -m pip install --quiet "${pins[@]}"; then
  echo "[schemathesis venv] ERROR: pip install of ${pins[*]} failed; check that PyPI is reachable and rerun" >&2
  exit 1
fi
echo "$venv/bin/python"
