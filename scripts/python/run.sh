#!/usr/bin/env bash
# The Python package in CI: builds the `rlx` wheel with maturin (pinned, in
# .venv-maturin), installs it into a fresh venv (.venv-rlx-py, recreated
# every run) with pinned numpy, pytest and pyarrow, and runs
# crates/rlx-py/tests (RLX_PY_RAY=1 adds Ray and the Ray Data test). Needs the fetched models (scripts/fetch_models.py
# all) and the `rlx` binary for the CLI comparisons (default
# target/debug/rlx, as `cargo test --workspace` leaves it; RLX_BIN
# overrides).
#
# The wheel reuses what `cargo test --workspace` compiled. Cargo reuses a
# crate's artifact only when its build hash agrees: the same profile
# settings, features, RUSTFLAGS and target directory. So:
# - the wheel is built with cargo's `dev` profile raised to opt-level 2
#   (CARGO_PROFILE_DEV_OPT_LEVEL=2), exactly the settings of the
#   workspace's `test` profile (the profile name is not part of the hash;
#   maturin cannot build with `--profile test`, cargo rustc would build the
#   test harness);
# - crates/rlx-py/Cargo.toml turns on, for the few crates where the whole
#   workspace unifies more features than rlx-py alone would, the same
#   features (a wheel build selects rlx-py alone), and makes the few crates
#   the workspace shares between proc-macros and normal code (fnv, strsim)
#   normal dependencies here too. Where a workspace crate compiles again
#   anyway, this script warns and lists the features that differ;
# - no RUSTFLAGS of its own; the target directory is cargo's (target/, or
#   $CARGO_TARGET_DIR), as for cargo test.
# Only pyo3, numpy (with ndarray) and rlx-py itself compile, which cargo
# test does not build: 77 s on this 2-core machine instead of 468 s (same
# machine, other sessions' builds running; the script prints what cargo
# compiled). Run twice, the second build compiles nothing (2 s). RLX_PY_PROFILE=release builds what
# `pip install ./crates/rlx-py` builds; RLX_PY_FEATURES=cuda adds the CUDA
# backend (rlx, rlx-models and rlx-py then compile again).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
python="${PYTHON:-python3}"
profile="${RLX_PY_PROFILE:-dev}"
features="${RLX_PY_FEATURES:-}"

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

# Crates whose features differ between `cargo test --workspace` and a
# build of rlx-py alone: "name version features" lines, none when they
# agree (a diagnosis for the warning below).
feature_drift() {
  local feats='{p} {f}'
  comm -23 \
    <(cargo tree --manifest-path "$root/Cargo.toml" -p rlx-py -e features -f "$feats" --prefix none \
        | grep -v ' feature "' | sed 's/ (\*)$//; s/ *$//' | grep -v '^rlx' | sort -u) \
    <(cargo tree --manifest-path "$root/Cargo.toml" --workspace -e features -f "$feats" --prefix none \
        | grep -v ' feature "' | sed 's/ (\*)$//; s/ *$//' | sort -u)
}

echo "[rlx-py] building the wheel (profile $profile${features:+, features $features})" >&2
rm -rf "$wheel_dir"
t0=$(date +%s)
if [ "$profile" = dev ]; then
  export CARGO_PROFILE_DEV_OPT_LEVEL=2
fi
build_log="$root/target/rlx-py-wheel-build.log"
mkdir -p "$(dirname "$build_log")"
if ! "$build_venv/bin/maturin" build --strip --manifest-path "$root/crates/rlx-py/Cargo.toml" \
  --profile "$profile" ${features:+--features "$features"} --interpreter "$python" \
  --out "$wheel_dir" >"$build_log" 2>&1; then
  tail -n 60 "$build_log" >&2
  echo "[rlx-py] maturin build failed (the whole log: $build_log)" >&2
  exit 1
fi
echo "[rlx-py] wheel built in $(( $(date +%s) - t0 )) s: $(ls "$wheel_dir")" >&2
compiled="$(sed -n 's/^ *Compiling \([^ ]*\) .*/\1/p' "$build_log" | sort -u | tr '\n' ' ')"
echo "[rlx-py] cargo compiled: ${compiled:-nothing (all fresh)}" >&2
# After `cargo test --workspace`, only pyo3, numpy and their own
# dependencies should compile; a workspace crate or tokenizers compiling
# again means the build hashes drifted apart (see the notes at the top).
if [ "$profile" = dev ] && [ -z "$features" ]; then
  again="$(printf '%s\n' $compiled | grep -E '^(rlx|rlx-.*|tokenizers)$' | grep -vx rlx-py || true)"
  if [ -n "$again" ]; then
    echo "[rlx-py] warning: compiled again although \`cargo test --workspace\` built them:" \
      $again "(if cargo test ran first, align crates/rlx-py/Cargo.toml; features that differ:)" >&2
    feature_drift | sed 's/^/[rlx-py]   /' >&2 || true
  fi
fi

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
