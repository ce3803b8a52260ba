#!/usr/bin/env bash
# Chapter 01 on the GPU machine: tests, sanitizers, and the README's measurements.
# Usage (repo root, binaries in build/bin): bash bench/h200_ch01.sh [outdir]
set -uo pipefail
OUT=${1:-${OUT:-/tmp/ch01}}
mkdir -p "$OUT"
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
B=build/bin
nvidia-smi -L | tee "$OUT/gpu.txt"
date -u +%Y-%m-%d | tee -a "$OUT/gpu.txt"
echo "--- GPU tests"
$B/tests_ch01_gpu 2>&1 | tail -4 | tee "$OUT/tests.txt"
echo "--- memcheck"
compute-sanitizer --tool memcheck --error-exitcode 9 $B/tests_ch01_gpu -tc="both pipelines*" >"$OUT/memcheck.txt" 2>&1; echo "memcheck rc=$?"; tail -3 "$OUT/memcheck.txt"
echo "--- racecheck"
compute-sanitizer --tool racecheck --error-exitcode 9 $B/tests_ch01_gpu -tc="exercise ch01.4*" >"$OUT/racecheck.txt" 2>&1; echo "racecheck rc=$?"; tail -3 "$OUT/racecheck.txt"
compute-sanitizer --tool racecheck --error-exitcode 9 $B/ch01_naive --n 130 --nk 70 --heads 2 --causal --device cuda >"$OUT/racecheck_bin.txt" 2>&1; echo "racecheck (binary) rc=$?"; tail -2 "$OUT/racecheck_bin.txt"
echo "--- measurements"
for n in 1024 4096 16384; do
  $B/ch01_naive --n $n --heads 16 --d 64 --bench > "$OUT/ch01_n${n}_d64.txt" 2>&1
  $B/ch01_naive --n $n --heads 16 --d 64 --bench --json > "$OUT/ch01_n${n}_d64.json" 2>&1
done
$B/ch01_naive --n 4096 --heads 16 --d 128 --causal --bench > "$OUT/ch01_n4096_d128_causal.txt" 2>&1
$B/ch01_naive --n 40000 --heads 16 --device cuda > "$OUT/ch01_too_big.txt" 2>&1; echo "too big rc=$?"; cat "$OUT/ch01_too_big.txt"
cat "$OUT"/ch01_n*_d64.txt "$OUT/ch01_n4096_d128_causal.txt"
