#!/usr/bin/env bash
# bench/gpu_session.sh's plumbing on device 0 (lavapipe in CI), as it is checked before a GPU window opens:
# SHAPE=tiny, the bench rows, the PyTorch reference (on the CPU here; the tests stage is left out: the test
# binaries run on their own) and the serving stage (serve --device vulkan under 1 and 4 streams, dual cache and
# --fast: the 16 and 64 of a GPU run take minutes on lavapipe), and the table they make — every run exits 0 with
# a step in one submission, each run's per-shader profile is there, the reference's time reaches the uncached
# row, every serving level answered every request, and no row of a plumbing run is called met.
# Usage: gpu_session_plumbing_test.sh SOURCE_DIR BUILD_DIR PYTHON
set -u
SRC=$1 BUILD=$2 PY=$3
OUT=$(mktemp -d); trap 'rm -rf "$OUT"' EXIT
fail() { echo "FAIL: $1"; cat "$OUT/table.md" 2>/dev/null; exit 1; }
SHAPE=tiny PYTHON=$PY SERVE_MODEL_DIR=$OUT/serve_model "$SRC/bench/gpu_session.sh" "$BUILD" "$OUT" torch,dual,none,q4,serve \
  > "$OUT/log" 2>&1 ||
  { cat "$OUT/log"; fail "gpu_session.sh exited $?"; }
[[ -s $OUT/table.md ]] || { cat "$OUT/log"; fail "no table.md"; }
for run in dual none q4; do
  grep -q "^| $run | 1.0 | [^|]* | [^|]* | 0 |$" "$OUT/table.md" || { tail -5 "$OUT/bench_$run.err"; fail "run $run: failed, or not one submission per step"; }
  grep -q "^| shader |" "$OUT/bench_$run.err" || fail "run $run: no DC_VULKAN_PROFILE table"
done
grep -q "^| tiny bf16 uncached step | [^|]* | [^|]* | [0-9.]* |" "$OUT/table.md" || { cat "$OUT/torch.err"; fail "no reference time"; }
for mode in dual fast; do
  for streams in 1 4; do
    grep -q "^| $mode | $streams | [0-9.e+]* | [1-9][0-9]* | 0 | [0-9.e+]* | [0-9.e+]* | 0 |$" "$OUT/table.md" ||
      { cat "$OUT/serve_$mode.err"; fail "serve $mode: $streams streams failed or were not measured"; }
  done
done
grep -q "^| serving 16 concurrent streams, tiny bf16 dual | .* | open (not measured) |$" "$OUT/table.md" ||
  fail "the serving row (no 16-stream level in a plumbing run) is not left open"
[[ $(grep -c "open (plumbing run)" "$OUT/table.md") == 3 ]] || fail "the three measured rows are not left open"
grep -q "| met |" "$OUT/table.md" && fail "a plumbing row was called met"
echo "ok: $(grep -c '' "$OUT/table.md") lines of table"
