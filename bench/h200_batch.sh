#!/usr/bin/env bash
# One call on the GPU machine: tests, sanitizers and measurements of the chapters
# named on the command line, with a short summary printed last.
#
#   bash bench/h200_batch.sh OUTDIR ch01 ch02 ch03 ch04 ...
#
# Binaries come from $BIN (default build-h200/bin). Logs go to OUTDIR.
set -uo pipefail
OUT=${1:?usage: h200_batch.sh OUTDIR chapters...}
shift
mkdir -p "$OUT"
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
B=${BIN:-build-h200/bin}
SUMMARY="$OUT/summary.txt"
: > "$SUMMARY"
note() { echo "$*" | tee -a "$SUMMARY"; }
tests() {  # tests BINARY [doctest args]: runs a GPU test binary, notes its verdict
  local bin=$1; shift
  "$B/$bin" "$@" > "$OUT/$bin.txt" 2>&1
  note "$bin: $(grep -E 'test cases' "$OUT/$bin.txt" | tail -1)"
}
sanitize() {  # sanitize TOOL NAME command...: compute-sanitizer with its error count
  local tool=$1 name=$2; shift 2
  compute-sanitizer --tool "$tool" --error-exitcode 9 "$@" > "$OUT/san_${name}_$tool.txt" 2>&1
  note "compute-sanitizer $tool $name: rc=$? $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' "$OUT/san_${name}_$tool.txt" | tail -1)"
}
note "$(nvidia-smi -L | head -1) $(date -u +%Y-%m-%dT%H:%MZ)"

for ch in "$@"; do
  case $ch in
    ch01-check)
      tests tests_ch01_gpu
      sanitize memcheck ch01 "$B/tests_ch01_gpu" -tc="both*"
      sanitize racecheck ch01 "$B/ch01_naive" --n 130 --nk 70 --heads 2 --causal --device cuda
      ;;
    ch01)
      for n in 1024 4096 16384; do "$B/ch01_naive" --n $n --heads 16 --bench > "$OUT/ch01_n$n.txt" 2>&1; done
      "$B/ch01_naive" --n 40000 --heads 16 --device cuda > "$OUT/ch01_too_big.txt" 2>&1
      note "ch01 N=40000: rc=$? $(cat "$OUT/ch01_too_big.txt")"
      ;;
    ch02)
      tests tests_ch02_gpu
      sanitize memcheck ch02 "$B/tests_ch02_gpu" -tc="every kernel*,empty rows*,exercise ch02.4*"
      sanitize racecheck ch02 "$B/tests_ch02_gpu" -tc="every kernel*,empty rows*"
      sanitize synccheck ch02 "$B/tests_ch02_gpu" -tc="every kernel*"
      timeout 150 "$B/ch02_online_softmax" --bench > "$OUT/ch02_bench.txt" 2>&1
      note "ch02 --bench: rc=$?"
      ;;
    ch03)
      tests tests_ch03_gpu
      sanitize memcheck ch03 "$B/tests_ch03_gpu" -tc="sanitizer set*"
      sanitize racecheck ch03 "$B/tests_ch03_gpu" -tc="sanitizer set*"
      "$B/ch03_fa1" > "$OUT/ch03_default.txt" 2>&1
      note "ch03 default: rc=$?"
      timeout ${CH03_BENCH_TIMEOUT:-240} "$B/ch03_fa1" --bench > "$OUT/ch03_bench.txt" 2>&1
      note "ch03 --bench: rc=$?"
      ;;
    ch04)
      tests tests_ch04_gpu
      sanitize memcheck ch04 "$B/ch04_fa2" --n 200 --nk 333 --causal --heads 2 --kv-heads 1 --no-model
      sanitize racecheck ch04 "$B/ch04_fa2" --n 150 --heads 2 --no-model
      BIN_CH04="$B/ch04_fa2" timeout 300 python3 bench/ch04_fa2.py --quick --json "$OUT/bench04.json" > "$OUT/bench04.txt" 2>&1
      note "ch04 bench: rc=$?"
      for d in 64 128; do for n in 2048 8192; do  # tile experiment: d=64 Bc 64 vs 128, d=128 Bc 64 vs 32
        h=$((2048 / d)); b=$((16384 / n))
        for alt in "" 1; do
          if [ -n "$alt" ]; then export ATTN_CH04_ALT_TILES=1; else unset ATTN_CH04_ALT_TILES; fi
          t=$("$B/ch04_fa2" --n $n --batch $b --heads $h --d $d --step 6 --no-backward --no-model --json |
              python3 -c "import json,sys; r=json.load(sys.stdin)['results'][0]; print(round(r['tflops'],1), r['pass'])")
          note "ch04 v6 d=$d N=$n alt_tiles=${alt:-0}: $t"
        done
      done; done
      unset ATTN_CH04_ALT_TILES
      ;;
    ch05)
      TEST_TIMEOUT=40 OUT=$OUT bash chapters/05_fa3_hopper/scripts/h200_check.sh "$B" tests > "$OUT/ch05_tests.txt" 2>&1
      note "ch05 tests: $(grep -c ' pass ' "$OUT/ch05_tests.txt") pass, $(grep -c 'FAIL' "$OUT/ch05_tests.txt") fail"
      grep FAIL "$OUT/ch05_tests.txt" | head -5 | tee -a "$SUMMARY"
      timeout 60 "$B/ch05_fa3_hopper" --n 8192 --batch 2 --heads 16 --causal --step 1 --no-fp8-table > "$OUT/ch05_v1_diag.txt" 2>&1
      note "ch05 v1 causal 8K: rc=$? $(grep -E '^v1' "$OUT/ch05_v1_diag.txt" | head -2)"
      ;;
    ch07)
      timeout 120 "$B/tests_ch07_gpu" > "$OUT/tests_ch07_gpu.txt" 2>&1
      note "tests_ch07_gpu: rc=$? $(grep -E 'test cases' "$OUT/tests_ch07_gpu.txt" | tail -1)"
      grep -B2 -A6 "ERROR" "$OUT/tests_ch07_gpu.txt" | head -30 >> "$SUMMARY"
      sanitize memcheck ch07 "$B/ch07_paged_radix" decode --device cuda --batch 5 --nk 300 --page-size 8 --splits 3
      sanitize racecheck ch07 "$B/ch07_paged_radix" decode --device cuda --batch 5 --nk 300 --page-size 1 --splits 3
      timeout 150 python3 bench/ch07_decode.py --binary "$B/ch07_paged_radix" --markdown > "$OUT/ch07_bench.md" 2> "$OUT/ch07_bench.err"
      note "ch07 bench: rc=$?"
      ;;
    ch04-final)
      BIN_CH04="$B/ch04_fa2" timeout 170 python3 bench/ch04_fa2.py --ns 512,2048,8192,16384 --no-backward \
        --json "$OUT/bench04_final.json" > "$OUT/bench04_final.txt" 2>&1
      note "ch04 final bench: rc=$?"
      ;;
    *) note "unknown chapter $ch" ;;
  esac
done
echo "=== summary"
cat "$SUMMARY"
