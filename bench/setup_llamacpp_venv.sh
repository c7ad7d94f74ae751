#!/usr/bin/env bash
# Creates bench/.venv-llamacpp with llama-cpp-python (the llama.cpp reference
# for the SmolLM2 decode benchmark). llama-cpp-python ships as an sdist and is
# compiled from source with CMake, which takes several minutes on 2 cores.
# Idempotent: reuses an existing venv and skips the build when the pinned
# version is already installed.
#
# Environment:
#   PYTHON      interpreter for the venv (default python3)
#   CMAKE_ARGS  extra CMake flags for the llama.cpp build
#               (default: -DGGML_NATIVE=ON, CPU only, no BLAS)
#   JOBS        parallel build jobs (default: nproc)
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
venv="$here/.venv-llamacpp"
python="${PYTHON:-python3}"
llama_pin="llama-cpp-python==0.3.16"

if [ ! -x "$venv/bin/python" ]; then
  echo "[setup_llamacpp_venv] creating $venv"
  if ! "$python" -m venv "$venv"; then
    echo "[setup_llamacpp_venv] ERROR: '$python -m venv' failed; install the venv module (e.g. apt-get install python3-venv) or set PYTHON=/path/to/python3" >&2
    exit 1
  fi
fi

if "$venv/bin/python" -c "import importlib.metadata as m, sys; sys.exit(0 if m.version('llama_cpp_python') == '${llama_pin#*==}' else 1)" 2>/dev/null; then
  echo "[setup_llamacpp_venv] $llama_pin already installed"
else
  # Build tools: CMake and Ninja from PyPI when the system has none.
  if ! "$venv/bin/python" -m pip install --quiet --upgrade pip "cmake>=3.21,<5" ninja scikit-build-core; then
    echo "[setup_llamacpp_venv] ERROR: pip install of cmake/ninja/scikit-build-core failed; check that PyPI is reachable" >&2
    exit 1
  fi
  export PATH="$venv/bin:$PATH"
  export CMAKE_ARGS="${CMAKE_ARGS:--DGGML_NATIVE=ON -DGGML_BLAS=OFF -DGGML_CUDA=OFF -DGGML_METAL=OFF -DGGML_VULKAN=OFF -DLLAMA_CURL=OFF}"
  export CMAKE_BUILD_PARALLEL_LEVEL="${JOBS:-$(nproc)}"
  echo "[setup_llamacpp_venv] building $llama_pin from source (CMAKE_ARGS=$CMAKE_ARGS, jobs=$CMAKE_BUILD_PARALLEL_LEVEL); this takes several minutes"
  if ! "$venv/bin/python" -m pip install --no-cache-dir --no-binary llama-cpp-python "$llama_pin"; then
    echo "[setup_llamacpp_venv] ERROR: building $llama_pin failed; see the CMake output above (a C/C++ compiler is required: apt-get install build-essential)" >&2
    exit 1
  fi
fi

"$venv/bin/python" - <<'PY'
import llama_cpp
print("[setup_llamacpp_venv] ok: llama_cpp", llama_cpp.__version__)
print(llama_cpp.llama_print_system_info().decode(errors="replace"))
PY
