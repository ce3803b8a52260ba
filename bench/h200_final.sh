#!/usr/bin/env bash
# Last check on the GPU machine: every GPU test binary, every chapter binary at its
# default size (what ./tutorial run shows), and Nsight Compute on chapter 04's
# final forward and backward kernels. Binaries from $BIN (default build-h200/bin).
set -uo pipefail
OUT=${1:?usage: h200_final.sh OUTDIR}
mkdir -p "$OUT/logs"
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
B=${BIN:-build-h200/bin}
S="$OUT/summary.txt"
echo "$(nvidia-smi -L | head -1) $(date -u +%Y-%m-%dT%H:%MZ)" | tee "$S"
for t in tests_ch01_gpu tests_ch02_gpu tests_ch03_gpu tests_ch04_gpu tests_ch05_gpu tests_ch07_gpu; do
  timeout 200 "$B/$t" > "$OUT/logs/$t.txt" 2>&1
  echo "$t rc=$? $(grep 'test cases' "$OUT/logs/$t.txt" | tail -1)" | tee -a "$S"
done
for b in ch01_naive ch02_online_softmax ch03_fa1 ch04_fa2 ch05_fa3_hopper ch07_paged_radix; do
  timeout 90 "$B/$b" > "$OUT/logs/run_$b.txt" 2>&1
  echo "$b (default size) rc=$? $(grep -m1 '^mode' "$OUT/logs/run_$b.txt")" | tee -a "$S"
done
NCU="ncu --clock-control none -c 1 --section SpeedOfLight --section Occupancy --section WarpStateStats --section LaunchStats"
$NCU -k regex:fa2_fwd_v6 "$B/ch04_fa2" --n 2048 --batch 8 --heads 16 --d 128 --step 6 --no-backward --no-model \
  > "$OUT/ncu_fwd_d128_n2048.txt" 2>&1
echo "ncu forward rc=$?" | tee -a "$S"
$NCU -k regex:fa2_bwd_main "$B/ch04_fa2" --n 8192 --batch 2 --heads 16 --d 128 --step 6 --no-model \
  > "$OUT/ncu_bwd_d128_n8192.txt" 2>&1
echo "ncu backward rc=$?" | tee -a "$S"
tar czf "$OUT/logs.tgz" -C "$OUT" logs && rm -rf "$OUT/logs"
