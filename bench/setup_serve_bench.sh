#!/usr/bin/env bash
# Creates bench/.venv-serve for the HTTP serving benchmarks
# (bench/serve_embed.py, bench/serve_llm.py), every version pinned:
#   - infinity-emb[server,optimum] (Infinity, the embedding server peer) on
#     its ONNX Runtime backend (optimum / optimum-onnx); optimum-onnx pulls
#     torch, whose PyPI Linux wheel depends on the CUDA runtime packages
#     (~3 GB; download.pytorch.org's CPU wheels are used when reachable);
#     Infinity runs on the CPU only;
#   - llama-cpp-python[server]==0.3.16 (llama_cpp.server, the generation
#     peer), compiled from the sdist with CMake as bench/setup_llamacpp_venv.sh
#     does (CPU only, GGML_NATIVE; several minutes on 2 cores; JOBS sets the
#     parallel build jobs, default nproc);
#   - aiohttp (the load generator) and matplotlib (the plots).
# Also writes target/fastembed-minilm (bench/minilm_fastembed_dir.py): the
# ONNX export of the local all-MiniLM-L6-v2 that Infinity's optimum engine
# loads offline (the Hugging Face hub is not needed). Needs the fetched
# models: python3 scripts/fetch_models.py minilm smollm2.
#
# Idempotent: reuses the venv, skips the llama.cpp build when the pinned
# version is installed, and re-runs pip only to check the pins. Prints the
# installed versions at the end.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(cd "$here/.." && pwd)"
venv="$here/.venv-serve"
python="${PYTHON:-python3}"

llama_pin="llama-cpp-python==0.3.16"
torch_pin="torch==2.15.0"
pins=(
  "infinity-emb[server,optimum]==0.0.78"
  "optimum==2.1.0"
  "optimum-onnx==0.1.0"
  "onnxruntime==1.32.0"
  "onnx==1.23.2"
  "transformers==4.57.6"
  "tokenizers==0.22.2"
  "huggingface-hub==0.36.2"
  "safetensors==0.8.0"
  "numpy==1.26.4"          # infinity-emb 0.0.78 needs numpy < 2
  "uvicorn==0.32.1"        # infinity-emb 0.0.78 needs uvicorn < 0.33
  "fastapi==0.165.0"
  "aiohttp==3.14.5"
  "matplotlib==3.11.2"
)

if [ ! -x "$venv/bin/python" ]; then
  echo "[setup_serve_bench] creating $venv"
  "$python" -m venv "$venv"
fi
pip=("$venv/bin/python" -m pip install --quiet)
"${pip[@]}" --upgrade pip "cmake>=3.21,<5" ninja scikit-build-core

# 1. llama-cpp-python[server], built from source (the slow part).
if "$venv/bin/python" -c "import importlib.metadata as m, sys; sys.exit(0 if m.version('llama_cpp_python') == '${llama_pin#*==}' else 1)" 2>/dev/null; then
  echo "[setup_serve_bench] $llama_pin already installed"
else
  export PATH="$venv/bin:$PATH"
  export CMAKE_ARGS="${CMAKE_ARGS:--DGGML_NATIVE=ON -DGGML_BLAS=OFF -DGGML_CUDA=OFF -DGGML_METAL=OFF -DGGML_VULKAN=OFF -DLLAMA_CURL=OFF}"
  export CMAKE_BUILD_PARALLEL_LEVEL="${JOBS:-$(nproc)}"
  echo "[setup_serve_bench] building $llama_pin from source (CMAKE_ARGS=$CMAKE_ARGS, jobs=$CMAKE_BUILD_PARALLEL_LEVEL)"
  if ! "$venv/bin/python" -m pip install --no-binary llama-cpp-python "${llama_pin/==/[server]==}"; then
    echo "[setup_serve_bench] ERROR: building $llama_pin failed (see the CMake output above); serve_llm.py will record llama_cpp as unavailable" >&2
  fi
fi

# 2. torch: the CPU wheel when download.pytorch.org is reachable, else PyPI's.
if ! "$venv/bin/python" -c "import torch" 2>/dev/null; then
  if curl -sS --max-time 20 -o /dev/null https://download.pytorch.org/whl/cpu/torch/ 2>/dev/null; then
    "${pip[@]}" --index-url https://download.pytorch.org/whl/cpu --extra-index-url https://pypi.org/simple "$torch_pin"
  else
    echo "[setup_serve_bench] torch: download.pytorch.org is unreachable; PyPI's wheel (with the CUDA runtime packages; run on the CPU)"
  fi
fi

# 3. Infinity, the load generator and the plots, resolved together with the
#    llama-cpp-python server's dependencies (already installed, not rebuilt).
"${pip[@]}" "$torch_pin" "${pins[@]}" "${llama_pin/==/[server]==}"

# 4. The ONNX export Infinity loads (same weights as rlx's model.safetensors).
"$venv/bin/python" "$here/minilm_fastembed_dir.py" >/dev/null
echo "[setup_serve_bench] ONNX MiniLM for Infinity: $root/target/fastembed-minilm"

"$venv/bin/python" - <<'PY'
import importlib.metadata as m
names = ["infinity_emb", "optimum", "optimum-onnx", "onnxruntime", "transformers", "torch",
         "numpy", "fastapi", "uvicorn", "llama_cpp_python", "aiohttp", "matplotlib"]
out = []
for n in names:
    try:
        out.append(f"{n}=={m.version(n)}")
    except m.PackageNotFoundError:
        out.append(f"{n}: MISSING")
print("[setup_serve_bench] versions:", " ".join(out))
PY
