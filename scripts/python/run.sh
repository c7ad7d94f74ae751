#!/usr/bin/env bash
# The Python package in CI: builds the `rlx` wheel with maturin (pinned, in
# .venv-maturin), installs it into a fresh venv (.venv-rlx-py, recreated
# every run) with pinned numpy, pytest and pyarrow, and runs
# crates/rlx-py/tests (RLX_PY_RAY=1 adds Ray and the Ray Data test). Needs the fetched models (scripts/fetch_models.py
# all) and the `rlx` binary for the CLI comparisons (default
# target/debug/rlx, as `cargo test --workspace` leaves it; RLX_BIN
# overrides).
#
# The wheel is built with cargo's `dev` profile raised to opt-level 2
# (CARGO_PROFILE_DEV_OPT_LEVEL=2): those are exactly the settings of the
# workspace's `test` profile, so cargo can reuse the artifacts `cargo test
# --workspace` built wherever the feature sets agree (a crate whose features
# differ between the whole workspace and rlx-py alone is compiled again);
# pyo3 and rlx-py itself always compile. (maturin cannot build with `--profile test`: cargo
# rustc builds the test harness under that profile.) RLX_PY_PROFILE=release
# builds what `pip install ./crates/rlx-py` builds.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
python="${PYTHON:-python3}"
profile="${RLX_PY_PROFILE:-dev}"

build_venv="$root/.venv-maturin"
test_venv="$root/.venv-rlx-py"
wheel_dir="$root/target/wheels-ci"

pins=(
  "numpy==2.4.6"
  "pytest==9.2.0"
  "iniconfig==2.3.1"
  "packaging==26.4"
  "pluggy==1.7.0"
  "pygments==2.21.0"
  "pyarrow==26.0.1"
)

# Opt-in (RLX_PY_RAY=1): Ray Data for tests/test_ray.py (a large download and
# a minute of test time, so CI leaves it out).
ray_pins=(
  "ray[data]==2.60.0"
)

if [ ! -x "$build_venv/bin/maturin" ]; then
  echo "[rlx-py] creating $build_venv (maturin)" >&2
  "$python" -m venv "$build_venv"
  "$build_venv/bin/python" -m pip install --quiet "maturin==1.16.0"
fi

echo "[rlx-py] building the wheel (profile $profile)" >&2
rm -rf "$wheel_dir"
t0=$(date +%s)
if [ "$profile" = dev ]; then
  export CARGO_PROFILE_DEV_OPT_LEVEL=2
fi
"$build_venv/bin/maturin" build --quiet --strip --manifest-path "$root/crates/rlx-py/Cargo.toml" \
  --profile "$profile" --interpreter "$python" --out "$wheel_dir" >&2
echo "[rlx-py] wheel built in $(( $(date +%s) - t0 )) s: $(ls "$wheel_dir")" >&2

echo "[rlx-py] installing into a fresh $test_venv" >&2
rm -rf "$test_venv"
"$python" -m venv "$test_venv"
"$test_venv/bin/python" -m pip install --quiet "${pins[@]}"
if [ "${RLX_PY_RAY:-0}" = 1 ]; then
  # The Ray Data recipe's test (tests/test_ray.py; skipped without ray).
  "$test_venv/bin/python" -m pip install --quiet "${ray_pins[@]}"
fi
"$test_venv/bin/python" -m pip install --quiet --no-deps "$wheel_dir"/rlx-*.whl

export RLX_BIN="${RLX_BIN:-$root/target/debug/rlx}"
cd "$root/crates/rlx-py"
exec "$test_venv/bin/python" -m pytest -q tests "$@"
