#!/usr/bin/env bash
# Creates scripts/model_refs/.venv, the pinned environment that
# scripts/gen_model_refs.py runs in: transformers, torch (run on the CPU),
# sentence-transformers and gguf. Only needed to regenerate the reference
# data under crates/*/tests/data; the Rust tests read the committed files and
# never need this venv. Idempotent.
#
# torch: the CPU-only wheel from https://download.pytorch.org/whl/cpu when
# that index is reachable, else PyPI's wheel (which pulls the CUDA runtime
# packages, ~3 GB; the references are computed on the CPU either way).
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
venv="$here/.venv"
python="${PYTHON:-python3}"

torch_pin="torch==2.15.0"
pins=(
  "numpy==2.4.6"
  "transformers==5.24.0"
  "sentence-transformers==6.2.0"
  "huggingface-hub==1.33.0"
  "tokenizers==0.23.3"
  "safetensors==0.8.0"
  "gguf==0.19.0"
  "sentencepiece==0.2.3"
  "protobuf==7.36.2"
  "accelerate==1.16.0"  # transformers needs it to load GGUF files (gguf_file=)
)

if [ ! -x "$venv/bin/python" ]; then
  echo "[model_refs] creating $venv"
  "$python" -m venv "$venv"
fi
pip=("$venv/bin/python" -m pip install --quiet)
if ! "$venv/bin/python" -c "import torch" 2>/dev/null; then
  if curl -sS --max-time 20 -o /dev/null https://download.pytorch.org/whl/cpu/torch/ 2>/dev/null; then
    "${pip[@]}" --index-url https://download.pytorch.org/whl/cpu --extra-index-url https://pypi.org/simple "$torch_pin"
  else
    echo "[model_refs] download.pytorch.org is unreachable: PyPI's torch (with CUDA runtime packages, run on the CPU)"
    "${pip[@]}" "$torch_pin"
  fi
fi
"${pip[@]}" "$torch_pin" "${pins[@]}"
"$venv/bin/python" - <<'PY'
from importlib.metadata import version
print("[model_refs] ok:", ", ".join(f"{p} {version(p)}" for p in
      ("torch", "transformers", "sentence-transformers", "gguf", "numpy")))
PY
