#!/usr/bin/env bash
# A GPU machine's check of the whole project, as a user builds it: the default configuration
# (no architecture given: this machine's GPU, and 90a for the Hopper-only code), every GPU
# test, and compute-sanitizer on the final kernels. From the repository root:
#
#   scripts/gpu_check.sh [OUT]          logs in OUT (default /tmp/gpu_check), a short table last
#
# Environment: BUILD_DIR (default build-gpu), TUTORIAL_LAB (ON: the lab's steps too), JOBS,
# CMAKE_PREFIX_PATH (where Eigen's and doctest's CMake configs are, on a machine without
# Debian's packages), SKIP_BUILD=1 (use the build as it is), SAN=0 (no sanitizers).
set -uo pipefail
OUT=${1:-/tmp/gpu_check}
BUILD_DIR=${BUILD_DIR:-build-gpu}
JOBS=${JOBS:-$(nproc)}
mkdir -p "$OUT"
S="$OUT/summary.txt"
: >"$S"
row() { printf '%-44s %s\n' "$1" "$2" | tee -a "$S"; }

row "gpu" "$(nvidia-smi --query-gpu=name,compute_cap,driver_version --format=csv,noheader | head -1)"
if [ "${SKIP_BUILD:-0}" != 1 ]; then
  t0=$(date +%s)
  cmake -S . -B "$BUILD_DIR" -G Ninja -DCMAKE_BUILD_TYPE=Release ${TUTORIAL_LAB:+-DTUTORIAL_LAB=$TUTORIAL_LAB} \
    >"$OUT/configure.log" 2>&1 && cmake --build "$BUILD_DIR" -j "$JOBS" >"$OUT/build.log" 2>&1
  row "configure + build (-j $JOBS)" "rc=$? in $(( $(date +%s) - t0 )) s"
  row "built" "$(cat "$BUILD_DIR/built_for.txt" 2>/dev/null)"
fi
t0=$(date +%s)
ctest --test-dir "$BUILD_DIR" -L gpu -j 1 --timeout 900 >"$OUT/ctest_gpu.log" 2>&1
row "ctest -L gpu" "rc=$? in $(( $(date +%s) - t0 )) s: $(grep -E 'tests passed|tests failed' "$OUT/ctest_gpu.log" | tail -1)"
grep -E '\*\*\*(Failed|Timeout|Exception)|Not Run' "$OUT/ctest_gpu.log" | head -20 | tee -a "$S"
grep -c 'Skipped' "$OUT/ctest_gpu.log" | sed 's/^/skipped entries: /' | tee -a "$S"

if [ "${SAN:-1}" != 0 ]; then
  B=$BUILD_DIR/bin
  # The final kernels at a shape with tails, empty rows (Nq > Nk, causal), GQA; each tool in one process.
  for d in 64 128 256; do
    for tool in memcheck racecheck synccheck; do
      bwd=--no-backward; [ $d != 256 ] && bwd="--backward-step final"
      timeout 300 compute-sanitizer --tool $tool --error-exitcode 9 "$B/ch05_fa3_hopper" --n 200 --nk 333 --heads 4 \
        --kv-heads 2 --causal --d $d --no-fp8-table --step final,final-fp8 $bwd >"$OUT/san_${tool}_d$d.log" 2>&1
      rc=$?
      row "sanitizer $tool, ch05 finals, d = $d" "rc=$rc $(grep -h 'ERROR SUMMARY' "$OUT/san_${tool}_d$d.log" | head -1)"
    done
  done
fi
# Everything but the summary in one archive (a device call brings back a few files only).
( cd "$OUT" && tar czf logs.tgz --exclude=summary.txt --exclude=logs.tgz ./*.log 2>/dev/null && rm -f ./*.log )
