#!/usr/bin/env bash
# Ring attention across GPUs (chapter 06, the NCCL backend): equivalence and scaling.
#
#   bench/ch06_ring_scaling.sh                    every P in 1 2 4 8 that the machine has GPUs for
#   GPUS=1 N_STRONG=32768 N_WEAK=8192 bench/ch06_ring_scaling.sh     a quick run on one GPU
#
# The launcher is the binary itself: `ch06_variants ring --backend nccl --ranks P` is one
# process that drives P GPUs with one host thread each (chapters/06_variants/ring/SECTION.md
# says why). For each P it runs
#   1. equivalence: causal zigzag and non-causal, forward and backward, against the fp64
#      reference (the binary exits 1 if any check fails);
#   2. strong scaling: a fixed total N (N_STRONG, default 131072);
#   3. weak scaling: a fixed N per GPU (N_WEAK, default 16384), total N = P * N_WEAK;
# and prints one CSV line per run (`scaling,...`) and a Markdown table. The one-GPU
# baseline is the row "one device: chapter 04's kernel on the whole problem" of the same
# run (chapter 04's kernel on the whole N, when it fits one GPU), so the parallel
# efficiency is T_one / (P * T_ring). The ring's own per-step compute and copy times,
# and the share of the copies hidden behind compute, come from its timeline.
#
# Environment: BIN (default build/bin/ch06_variants), GPUS (default: nvidia-smi -L count),
# HEADS (8), D (128), N_STRONG, N_WEAK, N_EQ (2053), TIMEOUT per run in s (120), OUT (a folder for the JSON).
set -u
export NCCL_NVLS_ENABLE=0   # NVLink multicast stays off; never unset it
ROOT=$(cd "$(dirname "$0")/.." && pwd)
BIN=${BIN:-$ROOT/build/bin/ch06_variants}
GPUS=${GPUS:-$(nvidia-smi -L 2>/dev/null | wc -l)}
HEADS=${HEADS:-8}
D=${D:-128}
N_STRONG=${N_STRONG:-131072}
N_WEAK=${N_WEAK:-16384}
N_EQ=${N_EQ:-2053}     # equivalence runs: small enough for the fp64 backward check
TIMEOUT=${TIMEOUT:-120}
OUT=${OUT:-/tmp/ch06_ring_scaling}
mkdir -p "$OUT"
[ -x "$BIN" ] || { echo "ch06_ring_scaling: no binary $BIN (build ch06_variants, or set BIN)" >&2; exit 2; }
[ "$GPUS" -ge 1 ] 2>/dev/null || { echo "ch06_ring_scaling: no GPU" >&2; exit 2; }
PS=""
for p in 1 2 4 8; do [ "$p" -le "$GPUS" ] && PS="$PS $p"; done
echo "ch06 ring scaling: $(date -u '+%Y-%m-%d %H:%M UTC'), $(nvidia-smi --query-gpu=name --format=csv,noheader | head -1) x $GPUS, P in$PS"
status=0

# field(json, row-prefix, key): one number from the report's JSON
field() {
  python3 - "$1" "$2" "$3" <<'PY'
import json, sys
doc = json.load(open(sys.argv[1]))
for r in doc["results"]:
    if r["impl"].startswith(sys.argv[2]):
        v = r.get(sys.argv[3])
        print("" if v is None else v)
        break
else:
    print("")
PY
}
note() {  # the note line that starts with $2 (the timeline's copy and compute sums)
  python3 - "$1" "$2" <<'PY'
import json, sys
doc = json.load(open(sys.argv[1]))
notes = doc.get("notes", [])
print(next((n for n in notes if n.startswith(sys.argv[2])), ""))
PY
}

echo "== equivalence (causal zigzag and non-causal, forward and backward, N = $N_EQ)"
for p in $PS; do
  for mask in "--layout zigzag" "--no-causal --layout contiguous"; do
    cmd="$BIN ring --backend nccl --ranks $p --n $N_EQ --heads 4 --kv-heads 2 --d 128 $mask --no-decode --json"
    timeout "$TIMEOUT" $cmd > "$OUT/eq_${p}_${mask// /_}.json" 2>"$OUT/eq.err"; rc=$?
    echo "P=$p $mask: rc=$rc $( [ $rc = 0 ] && echo pass || { echo FAIL; head -2 "$OUT/eq.err"; } )"
    [ $rc = 0 ] || status=1
  done
done

run_scaling() {  # kind, p, n
  local kind=$1 p=$2 n=$3
  local json="$OUT/${kind}_${p}.json"
  local cmd="$BIN ring --backend nccl --ranks $p --layout zigzag --n $n --heads $HEADS --d $D --bench --no-decode --json"
  timeout "$TIMEOUT" $cmd > "$json" 2>"$OUT/run.err"; local rc=$?
  if [ $rc != 0 ]; then echo "scaling,$kind,$p,$n,FAILED rc=$rc: $(head -1 "$OUT/run.err")"; status=1; return; fi
  local fwd bwd one_f one_b
  fwd=$(field "$json" "ring forward" time_ms); bwd=$(field "$json" "ring backward" time_ms)
  one_f=$(field "$json" "one device: chapter 04's kernel" time_ms); one_b=$(field "$json" "one device: chapter 04's backward" time_ms)
  local tl; tl=$(note "$json" "ring forward: sum of compute")
  echo "scaling,$kind,$p,$n,$fwd,$bwd,$one_f,$one_b,\"$tl\""
}

echo "== strong scaling: N = $N_STRONG, heads $HEADS, d $D, causal zigzag"
echo "csv: kind,P,N,ring fwd ms,ring bwd ms,one-GPU fwd ms,one-GPU bwd ms,timeline"
for p in $PS; do run_scaling strong "$p" "$N_STRONG"; done | tee "$OUT/strong.csv"
echo "== weak scaling: N = P x $N_WEAK"
for p in $PS; do run_scaling weak "$p" $((p * N_WEAK)); done | tee "$OUT/weak.csv"

echo "== table (efficiency = one-GPU time / (P x ring time))"
python3 - "$OUT/strong.csv" "$OUT/weak.csv" <<'PY'
import csv, sys
print("| scaling | P | N | ring fwd ms | ring bwd ms | one GPU fwd ms | one GPU bwd ms | fwd efficiency | bwd efficiency |")
print("|---|---:|---:|---:|---:|---:|---:|---:|---:|")
for path in sys.argv[1:]:
    for row in csv.reader(open(path)):
        if not row or row[0] != "scaling" or len(row) < 8 or row[4].startswith("FAILED"):
            continue
        kind, p, n, f, b, of, ob = row[1], int(row[2]), int(row[3]), *row[4:8]
        def eff(one, ring):
            try:
                return "%.0f%%" % (100.0 * float(one) / (p * float(ring)))
            except ValueError:
                return "-"
        print("| %s | %d | %d | %s | %s | %s | %s | %s | %s |" % (kind, p, n, f, b, of, ob, eff(of, f), eff(ob, b)))
PY
echo "== done: status $status (JSON in $OUT)"
exit $status
