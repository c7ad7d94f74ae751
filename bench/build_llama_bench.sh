#!/usr/bin/env bash
# Builds llama.cpp's `llama-bench` from the llama.cpp vendored in the
# llama-cpp-python 0.3.16 sdist (the same llama.cpp as bench/.venv-llamacpp)
# as a portable folder, bench/.llama-bench/, to carry to a machine without a
# compiler (bench/smollm2_device.sh runs it there):
#
#   llama-bench                      RPATH $ORIGIN
#   libllama.so libggml.so libggml-base.so
#   libggml-cpu-{x64,sse42,sandybridge,haswell,skylakex,icelake,alderlake,
#                sapphirerapids}.so  one CPU backend per ISA level; at start
#                                    llama-bench loads the best one the CPU
#                                    supports (GGML_BACKEND_DL +
#                                    GGML_CPU_ALL_VARIANTS, GGML_NATIVE=OFF)
#   libgomp.so.1                     copied from this system
#   fallback/libstdc++.so.6 fallback/libgcc_s.so.1   the same, for hosts whose
#                                    own are older than GCC 12's
#
# All binaries are stripped. CMake and Ninja come from PyPI into
# bench/.venv-cmake; the sdist, sources and build tree live in
# bench/.llama-build. Idempotent: reuses the venv, the download and the build
# tree (Ninja rebuilds nothing when nothing changed) and recreates the output
# folder each run.
#
# Environment:
#   PYTHON  interpreter for the venv (default python3)
#   JOBS    parallel build jobs (default 2)
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
venv="$here/.venv-cmake"
work="$here/.llama-build"
out="$here/.llama-bench"
python="${PYTHON:-python3}"
jobs="${JOBS:-2}"
pin="llama-cpp-python==0.3.16"
sdist_name="llama_cpp_python-0.3.16"
log() { echo "[build_llama_bench] $*"; }

# 1. CMake + Ninja from PyPI.
if [ ! -x "$venv/bin/cmake" ] || [ ! -x "$venv/bin/ninja" ]; then
  [ -x "$venv/bin/python" ] || "$python" -m venv "$venv"
  log "installing cmake and ninja into $venv"
  "$venv/bin/python" -m pip install --quiet "cmake>=3.21,<5" ninja
fi
export PATH="$venv/bin:$PATH"
log "$(cmake --version | head -1), ninja $(ninja --version)"

# 2. The sdist. Only llama-cpp-python itself is taken as source
# (--no-binary :all: would also build pip's build dependencies, CMake
# included, from source just to read the metadata).
mkdir -p "$work"
if [ ! -f "$work/$sdist_name.tar.gz" ]; then
  log "downloading the $pin sdist"
  "$python" -m pip download --quiet --no-deps --no-binary llama-cpp-python "$pin" -d "$work"
fi
src="$work/$sdist_name/vendor/llama.cpp"
if [ ! -f "$src/CMakeLists.txt" ]; then
  tar -xzf "$work/$sdist_name.tar.gz" -C "$work"
fi
# The options below exist under these names in this llama.cpp
# (ggml/CMakeLists.txt; GGML_CPU_ALL_VARIANTS requires GGML_BACKEND_DL, which
# requires BUILD_SHARED_LIBS).
for opt in GGML_BACKEND_DL GGML_CPU_ALL_VARIANTS GGML_NATIVE GGML_OPENMP; do
  grep -q "option($opt " "$src/ggml/CMakeLists.txt" || { log "ERROR: $opt not in ggml/CMakeLists.txt"; exit 1; }
done
grep -q "option(LLAMA_CURL " "$src/CMakeLists.txt" || { log "ERROR: LLAMA_CURL not in CMakeLists.txt"; exit 1; }

# 3. Configure and build. With GGML_BACKEND_DL every ggml-cpu-<variant>
# MODULE is a dependency of ggml (add_dependencies in ggml/src/CMakeLists.txt),
# so the llama-bench target builds all of them too.
build="$work/build"
if [ ! -f "$build/build.ninja" ]; then
  log "configuring $build"
  cmake -S "$src" -B "$build" -G Ninja \
    -DCMAKE_BUILD_TYPE=Release \
    -DGGML_NATIVE=OFF -DGGML_BACKEND_DL=ON -DGGML_CPU_ALL_VARIANTS=ON \
    -DBUILD_SHARED_LIBS=ON -DLLAMA_CURL=OFF -DGGML_OPENMP=ON \
    -DGGML_BLAS=OFF -DGGML_CUDA=OFF -DGGML_VULKAN=OFF -DGGML_METAL=OFF \
    -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_SERVER=OFF \
    -DCMAKE_BUILD_WITH_INSTALL_RPATH=ON '-DCMAKE_INSTALL_RPATH=$ORIGIN'
fi
log "building llama-bench and the CPU variants with $jobs jobs"
cmake --build "$build" --target llama-bench -j "$jobs"

# 4. The portable folder.
bin="$build/bin"
variants=(x64 sse42 sandybridge haswell skylakex icelake alderlake sapphirerapids)
for v in "${variants[@]}"; do
  [ -f "$bin/libggml-cpu-$v.so" ] || { log "ERROR: $bin/libggml-cpu-$v.so was not built"; exit 1; }
done
rm -rf "$out"
mkdir -p "$out"
cp "$bin/llama-bench" "$out/"
# cp -a keeps the soname symlinks (if any) as links.
for f in "$bin"/lib*.so*; do cp -a "$f" "$out/"; done
# GCC runtime libraries. libgomp is not installed on every host: copied next
# to the binaries, where RUNPATH $ORIGIN finds it first. libstdc++ and libgcc_s
# are on every host but may be older than GCC 12's (llama-bench needs
# GLIBCXX_3.4.30); this system's copies need glibc 2.36, newer than the
# binaries themselves, so they go to fallback/, which bench/smollm2_device.sh
# puts on LD_LIBRARY_PATH only when llama-bench does not start without it.
mkdir -p "$out/fallback"
for lib in libgomp.so.1 libstdc++.so.6 libgcc_s.so.1; do
  p="$(ldd "$out/llama-bench" "$out"/libggml-cpu-x64.so | awk -v l="$lib" '$1 == l { print $3; exit }')"
  [ -n "$p" ] || p="$(gcc -print-file-name="$lib")"
  if [ "$lib" = libgomp.so.1 ]; then cp -L "$p" "$out/$lib"; else cp -L "$p" "$out/fallback/$lib"; fi
done
find "$out" -type f -exec strip --strip-unneeded {} +
for f in "$out"/llama-bench "$out"/libllama.so "$out"/libggml*.so; do
  rp="$(readelf -d "$f" | sed -n 's/.*R\(UN\)\?PATH.*\[\(.*\)\]/\2/p')"
  [ "$rp" = '$ORIGIN' ] || { log "ERROR: $f has RPATH '$rp', not \$ORIGIN"; exit 1; }
done
missing="$(cd /tmp && env -u LD_LIBRARY_PATH ldd "$out/llama-bench" "$out"/lib*.so* 2>/dev/null | grep 'not found' || true)"
[ -z "$missing" ] || { log "ERROR: unresolved libraries: $missing"; exit 1; }
maxver() { objdump -T "$@" | grep -o 'GLIBC_[0-9.]*' | sort -uV | tail -1 | sed 's/GLIBC_//'; }
"$out/llama-bench" --help > /dev/null
log "done: $out ($(du -sh "$out" | cut -f1), $(tar -czf - -C "$here" .llama-bench | wc -c) bytes as tar.gz)"
log "needs glibc >= $(maxver "$out"/llama-bench "$out"/lib*.so*) (fallback/: $(maxver "$out"/fallback/*))"
ls -lR "$out"
