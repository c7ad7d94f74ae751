#!/usr/bin/env python3
"""Fetch NVRTC (the CUDA runtime compiler library) from PyPI, for tests.

No GPU and no CUDA toolkit are needed to compile CUDA C to PTX: rlx-cuda's
unit tests compile every kernel module (and a generated fused kernel) with
NVRTC wherever libnvrtc can be loaded, so a kernel that does not compile
fails on any machine, not only on a GPU one. This script downloads the
pinned ``nvidia-cuda-nvrtc`` wheel (CUDA 13.0, as on the GPU machine) with
``python3 -m pip download --no-deps``, checks its sha256, extracts the two
shared libraries to ``$RLX_NVRTC_DIR`` (default
``~/.cache/rlx/nvrtc-13.0.88``) and prints that directory, for
``LD_LIBRARY_PATH`` (scripts/test.sh does this).

Idempotent: when the libraries are already there it downloads nothing.
Standard library only.
"""

import hashlib
import os
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

VERSION = "13.0.88"
WHEEL = f"nvidia_cuda_nvrtc-{VERSION}-py3-none-manylinux2010_x86_64.manylinux_2_12_x86_64.whl"
WHEEL_SHA256 = "ad9b6d2ead2435f11cbb6868809d2adeeee302e9bb94bcf0539c7a40d80e8575"
LIBS = ["libnvrtc.so.13", "libnvrtc-builtins.so.13.0"]


def main() -> int:
    dest = Path(os.environ.get("RLX_NVRTC_DIR", Path.home() / ".cache" / "rlx" / f"nvrtc-{VERSION}"))
    if all((dest / lib).is_file() for lib in LIBS):
        print(dest)
        return 0
    if sys.platform != "linux" or os.uname().machine != "x86_64":
        print(f"fetch_nvrtc: the pinned wheel is for linux x86_64, not {sys.platform} "
              f"{os.uname().machine}; the NVRTC compile tests will say they are skipped", file=sys.stderr)
        print(dest)
        return 0
    with tempfile.TemporaryDirectory() as tmp:
        cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
               f"nvidia-cuda-nvrtc=={VERSION}", "-d", tmp]
        proc = subprocess.run(cmd, capture_output=True, text=True)
        wheel = Path(tmp) / WHEEL
        if proc.returncode != 0 or not wheel.is_file():
            tail = "\n".join((proc.stdout + proc.stderr).splitlines()[-8:])
            print(f"fetch_nvrtc: `pip download nvidia-cuda-nvrtc=={VERSION}` failed "
                  f"(exit {proc.returncode}):\n{tail}", file=sys.stderr)
            return 1
        digest = hashlib.sha256(wheel.read_bytes()).hexdigest()
        if digest != WHEEL_SHA256:
            print(f"fetch_nvrtc: {WHEEL} has sha256 {digest}, expected {WHEEL_SHA256}; "
                  "refusing to use it (delete pip's cache and retry)", file=sys.stderr)
            return 1
        dest.mkdir(parents=True, exist_ok=True)
        with zipfile.ZipFile(wheel) as z:
            for lib in LIBS:
                data = z.read(f"nvidia/cu13/lib/{lib}")
                part = dest / (lib + ".part")
                part.write_bytes(data)
                part.replace(dest / lib)
    print(dest)
    return 0


if __name__ == "__main__":
    sys.exit(main())
