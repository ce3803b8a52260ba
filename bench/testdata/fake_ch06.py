#!/usr/bin/env python3
"""A stand-in for `ch06_variants mask --model NAME` in bench/test_bench.py: prints a --json report of
the model case's rows with made-up times, as the contract of the model cases says: `NAME: final
sm90a forward` (built for d = 64 and 128), `NAME: sm80 forward` and `NAME: final backward` (d = 128
only); a kernel without the head dim is a row whose note says "not built for d = ..." and has no
time. packed-docs names its documents in a note. FAKE_LOG appends each command line; FAKE_FAIL
names a case whose sm90a row fails its check; --help lists --model. `--mask strided|fixed|longformer|
bigbird` prints the pattern's two forwards and its description (bench/ch06_masks.py --variants)."""
import json
import os
import random
import sys

a = sys.argv[1:]
if os.environ.get("FAKE_LOG"):
    with open(os.environ["FAKE_LOG"], "a") as f:
        f.write(" ".join(a) + "\n")
if "--help" in a:
    print("usage: ch06_variants [mask | gqa | mla | ring] [options]\n  --model NAME  gpt-oss | gemma2 | mistral | "
          "packed-docs\n  --no-backward\n  --no-model\n  --json")
    sys.exit(0)


def opt(name, default=None):
    return a[a.index(name) + 1] if name in a else default


CASES = {"gpt-oss": (64, 64, 8, 128), "gemma2": (256, 16, 8, 4096), "mistral": (128, 32, 8, 4096),
         "packed-docs": (128, 32, 8, None)}
SPARSE = {"strided": lambda: "strided (Sparse Transformer, merged), stride %s, causal" % opt("--stride", 64),
          "fixed": lambda: "fixed (Sparse Transformer), blocks of %s, %s summary columns, causal" % (
              opt("--block", 64), opt("--summary", 8)),
          "longformer": lambda: "longformer, window %s each side, %s global tokens" % (opt("--window", 64),
                                                                                      opt("--globals", 1)),
          "bigbird": lambda: "bigbird (ITC), blocks of %s, 3-block window, %s global blocks, %s random blocks "
                             "(seed 7)" % (opt("--block", 64), opt("--globals", 2), opt("--random", 3))}
mask = opt("--mask")
if a[:1] == ["mask"] and mask in SPARSE and "--model" not in a:
    # `--mask PATTERN` (bench/ch06_masks.py --variants): the forwards with made-up times; FAKE_FAIL
    # names a pattern whose sm90a row fails its check
    n, h = int(opt("--n", 8192)), int(opt("--heads", 16))
    flops = 4.0 * h * (n * n // 4) * 128
    rows = []
    for impl, tf in (("final sm90a forward", 400.0), ("sm80 forward", 200.0)):
        fail = os.environ.get("FAKE_FAIL") == mask and "sm90a" in impl
        rows.append({"impl": "%s: %s" % (mask, impl), "device": "cuda", "flops": flops, "time_ms": flops / (tf * 1e12) * 1e3,
                     "tflops": tf, "pass": not fail, "max_abs_err": 0.3 if fail else 0.002,
                     "note": "128 x 128 tiles; 10 tiles visited"})
    print(json.dumps({"problem": {"batch": 1, "heads": h, "kv_heads": h, "nq": n, "nk": n, "d": 128, "causal": False,
                                  "dtype": "bf16"}, "results": rows,
                      "notes": ["%s: %s; 10 of 20 tiles kept" % (mask, SPARSE[mask]())]}))
    sys.exit(1 if os.environ.get("FAKE_FAIL") == mask else 0)
model = opt("--model")
if a[:1] != ["mask"] or model not in CASES:
    print("usage error", file=sys.stderr)
    sys.exit(2)
n, b = int(opt("--n", 8192)), int(opt("--batch", 1))
d, hq, hkv, left = CASES[model]
notes = []
if left is None:
    rnd = random.Random(11)
    cuts = sorted(rnd.sample(range(1, n), 5))
    lens = [y - x for x, y in zip([0] + cuts, cuts + [n])]
    kept = sum(x * (x + 1) // 2 for x in lens)
    notes.append("%s: %d documents (%s), causal within each" % (model, len(lens), " ".join(map(str, lens))))
else:
    m = min(n, left + 1)
    kept = m * (m + 1) // 2 + max(0, n - left - 1) * (left + 1)
flops = 4.0 * b * hq * kept * d
rows = []
for impl, built, tf, mult in (("final sm90a forward", d in (64, 128), 500.0, 1.0), ("sm80 forward", d == 128, 300.0, 1.0),
                              ("final backward", d == 128, 200.0, 2.5)):
    if "backward" in impl and "--no-backward" in a:
        continue
    r = {"impl": "%s: %s" % (model, impl), "device": "cuda", "flops": flops * mult}
    if not built:
        r.update(note="not built for d = %d" % d)
    else:
        fail = os.environ.get("FAKE_FAIL") == model and "sm90a" in impl
        ms = flops * mult / (tf * 1e12) * 1e3
        r.update({"time_ms": ms, "tflops": tf, "pass": not fail, "max_abs_err": 0.3 if fail else 0.002,
                  "note": "128 x 128 tiles; 10 tiles visited"})
    rows.append(r)
print(json.dumps({"problem": {"batch": b, "heads": hq, "kv_heads": hkv, "nq": n, "nk": n, "d": d, "causal": True,
                              "dtype": "bf16"}, "results": rows, "notes": notes}))
sys.exit(1 if os.environ.get("FAKE_FAIL") == model else 0)
