#!/usr/bin/env bash
# Creates bench/.venv with the pinned Python packages the benchmarks need
# (ONNX Runtime CPU, onnx for building the graph, numpy, safetensors for the
# weights, matplotlib for the plot). Idempotent: reuses an existing venv and
# only installs what is missing.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
venv="$here/.venv"
python="${PYTHON:-python3}"

pins=(
  "onnxruntime==1.32.0"
  "onnx==1.23.2"
  "numpy==2.4.6"
  "safetensors==0.8.0"
  "matplotlib==3.11.2"
)

if [ ! -x "$venv/bin/python" ]; then
  echo "[setup_venv] creating $venv"
  if ! "$python" -m venv "$venv"; then
    echo "[setup_venv] ERROR: '$python -m venv' failed; install the venv module (e.g. apt-get install python3-venv) or set PYTHON=/path/to/python3" >&2
    exit 1
  fi
fi

if ! "$venv/bin/python" -m pip install --quiet "${pins[@]}"; then
  echo "[setup_venv] ERROR: pip install of ${pins[*]} failed; check that PyPI is reachable (network / PIP_INDEX_URL) and rerun" >&2
  exit 1
fi
"$venv/bin/python" - <<'PY'
import onnxruntime, onnx, numpy, safetensors, matplotlib
print("[setup_venv] ok: onnxruntime", onnxruntime.__version__, "onnx", onnx.__version__,
      "numpy", numpy.__version__, "safetensors", safetensors.__version__, "matplotlib", matplotlib.__version__)
PY
