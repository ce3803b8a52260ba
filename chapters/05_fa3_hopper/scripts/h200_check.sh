#!/usr/bin/env bash
# Chapter 05 on an sm_90 GPU, from the repository root, with binaries built elsewhere:
#
#   chapters/05_fa3_hopper/scripts/h200_check.sh [BIN_DIR] [tests|sass|sanitize|bench|all]
#
# tests     every GPU test case under its own time limit (a hang shows as a timeout)
# sass      HGMMA / QGMMA counts and local-memory (LDL/STL) instructions per kernel
# sanitize  compute-sanitizer memcheck, racecheck and synccheck on every step, small sizes
# bench     bench/ch05_fa3.py: the paper's shapes, every step next to SDPA's cuDNN and flash
# Logs go to ${OUT:-/tmp}/ch05_* (eight files at most), scratch to ${TMPDIR:-/tmp}.
set -uo pipefail
BIN=${1:-build-ch05/bin}
WHAT=${2:-all}
LOG=${OUT:-/tmp}
TMP=${TMPDIR:-/tmp}
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}

if [[ $WHAT == tests || $WHAT == all ]]; then
  "$BIN/tests_ch05_gpu" --list-test-cases 2>/dev/null | grep -v '^\[' | grep -v '^=' |
    while IFS= read -r tc; do
      [ -z "$tc" ] && continue
      # doctest splits -tc on commas: match them with '*'
      if timeout ${TEST_TIMEOUT:-30} "$BIN/tests_ch05_gpu" -tc="${tc//,/*}" >"$TMP/ch05_test.tmp" 2>&1; then r=pass; else r="FAIL($?)"; fi
      { echo "=== $tc: $r"; cat "$TMP/ch05_test.tmp"; } >>"$LOG/ch05_tests.log"
      echo "test  $r  $tc"
    done | tee "$LOG/ch05_tests_summary.txt"
fi

if [[ $WHAT == sass || $WHAT == all ]]; then
  cuobjdump --dump-sass "$BIN/ch05_fa3_hopper" >"$TMP/ch05_sass.txt" 2>&1
  awk '/Function :/ { if (name) printf "%-8s HGMMA %4d  QGMMA %4d  LDL %3d  STL %3d  %s\n", "sass", h, q, l, s, name;
                      name = $3; h = q = l = s = 0 }
       /HGMMA/ { h++ } /QGMMA/ { q++ } /LDL/ { l++ } /STL/ { s++ }
       END { if (name) printf "%-8s HGMMA %4d  QGMMA %4d  LDL %3d  STL %3d  %s\n", "sass", h, q, l, s, name }' \
    "$TMP/ch05_sass.txt" | grep -E "kernel|probe" | sed -E "s/_ZN4attn4ch05([0-9]v[0-9]+)?[0-9]*_GLOBAL__N__[0-9a-f]+_[0-9]+_([a-z0-9_]+)_cu_[0-9a-f]+/\\2:/" |
    tee "$LOG/ch05_sass_summary.txt"
fi

if [[ $WHAT == sanitize || $WHAT == all ]]; then
  # Every step in one process per tool (--step all), at a size with tails, empty rows and GQA.
  for tool in memcheck racecheck synccheck; do
    timeout ${SAN_TIMEOUT:-60} compute-sanitizer --tool $tool --error-exitcode 9 "$BIN/ch05_fa3_hopper" \
      --n 200 --nk 333 --heads 2 --kv-heads 1 --causal --no-fp8-table >"$TMP/ch05_$tool.log" 2>&1
    rc=$?
    { echo "=== $tool rc=$rc"; head -c 200000 "$TMP/ch05_$tool.log"; } >>"$LOG/ch05_sanitize.log"
    echo "sanitize $tool rc=$rc $(grep -h 'SUMMARY' "$TMP/ch05_$tool.log" | tr '\n' ' ')"
  done | tee "$LOG/ch05_sanitize_summary.txt"
fi

if [[ $WHAT == bench || $WHAT == all ]]; then
  # The paper's shapes with PyTorch SDPA's cuDNN and flash backends, in this one run.
  timeout ${BENCH_TIMEOUT:-150} python3 bench/ch05_fa3.py --bin "$BIN/ch05_fa3_hopper" --json "$LOG/ch05_bench.json" \
    2>"$LOG/ch05_bench.err" | tee "$LOG/ch05_bench.md"
  echo "bench rc=${PIPESTATUS[0]}"
fi
