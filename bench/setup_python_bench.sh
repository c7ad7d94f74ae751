#!/usr/bin/env bash
# Creates bench/.venv-pybench for bench/python_embed.py: the rlx wheel
# (built here with maturin, release profile, as `pip install
# ./crates/rlx-py` builds it), sentence-transformers on torch (CPU), and
# fastembed, and Ray Data for bench/python_ray.py, every version pinned. Idempotent: reuses the venv and only
# installs what is missing; RLX_PYBENCH_REBUILD=1 rebuilds the rlx wheel.
# Also writes target/fastembed-minilm (bench/minilm_fastembed_dir.py), the
# local model directory fastembed runs from. Needs the fetched MiniLM
# (python3 scripts/fetch_models.py minilm).
#
# torch: the CPU-only wheel from https://download.pytorch.org/whl/cpu when
# that index is reachable. Otherwise PyPI's torch, whose Linux wheel depends
# on the CUDA runtime packages (nvidia-*, ~3 GB); they are installed (torch
# does not import without them) but the benchmark runs torch on the CPU
# only (device="cpu").
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(cd "$here/.." && pwd)"
venv="$here/.venv-pybench"
python="${PYTHON:-python3}"

torch_pin="torch==2.15.0"
pins=(
  "numpy==2.4.6"
  "sentence-transformers==6.2.0"
  "transformers==5.24.0"
  "huggingface-hub==1.33.0"
  "onnxruntime==1.32.0"
  "tokenizers==0.23.3"
  "safetensors==0.8.0"
  "fastembed==0.9.1"
  "onnx==1.23.2"
  "ray[data]==2.60.0"
  "pyarrow==26.0.1"
)

if [ ! -x "$venv/bin/python" ]; then
  echo "[setup_python_bench] creating $venv"
  "$python" -m venv "$venv"
fi
pip=("$venv/bin/python" -m pip install --quiet)

if ! "$venv/bin/python" -c "import torch" 2>/dev/null; then
  if curl -sS --max-time 20 -o /dev/null https://download.pytorch.org/whl/cpu/torch/ 2>/dev/null; then
    echo "[setup_python_bench] torch: the CPU wheel from download.pytorch.org"
    "${pip[@]}" --index-url https://download.pytorch.org/whl/cpu --extra-index-url https://pypi.org/simple "$torch_pin"
  else
    echo "[setup_python_bench] torch: download.pytorch.org is unreachable; PyPI's wheel (with the CUDA runtime packages, run on the CPU)"
    "${pip[@]}" "$torch_pin"
  fi
fi
"${pip[@]}" "$torch_pin" "${pins[@]}"

if [ "${RLX_PYBENCH_REBUILD:-0}" = 1 ] || ! "$venv/bin/python" -c "import rlx" 2>/dev/null; then
  echo "[setup_python_bench] building the rlx wheel (release)"
  "$venv/bin/python" -m pip install --quiet "maturin==1.16.0"
  rm -rf "$root/target/wheels-bench"
  "$venv/bin/maturin" build --quiet --release --manifest-path "$root/crates/rlx-py/Cargo.toml" \
    --interpreter "$venv/bin/python" --out "$root/target/wheels-bench"
  "${pip[@]}" --force-reinstall --no-deps "$root"/target/wheels-bench/rlx-*.whl
fi

# fastembed's model from the same safetensors (its own download needs the
# Hugging Face hub): target/fastembed-minilm.
"$venv/bin/python" "$here/minilm_fastembed_dir.py" >/dev/null

"$venv/bin/python" - <<'PY'
import numpy, torch, sentence_transformers, transformers, rlx
try:
    import fastembed
    fe = fastembed.__version__
except Exception as e:  # recorded by the benchmark too
    fe = f"unavailable ({e})"
print("[setup_python_bench] ok: rlx", rlx.__version__, "torch", torch.__version__,
      "sentence-transformers", sentence_transformers.__version__,
      "transformers", transformers.__version__, "numpy", numpy.__version__, "fastembed", fe)
PY
