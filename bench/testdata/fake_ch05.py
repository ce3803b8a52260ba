#!/usr/bin/env python3
"""A stand-in for a chapter binary in bench/test_bench.py: answers --help, and prints a --json report
of three forward steps (v1, v8, v10) and one backward row, with made-up times. FAKE_SLOW multiplies
every time; FAKE_FAIL names a step whose row fails its check; FAKE_LOG appends each command line;
FAKE_LIST makes --step take a list (K[,K...]), as the chapter binaries' does now."""
import json
import os
import sys

a = sys.argv[1:]
if os.environ.get("FAKE_LOG"):
    with open(os.environ["FAKE_LOG"], "a") as f:
        f.write(" ".join(a) + "  GLIBC_TUNABLES=" + os.environ.get("GLIBC_TUNABLES", "(unset)") + "\n")
LIST = bool(os.environ.get("FAKE_LIST"))  # --step takes a list, as the chapter binaries do now
if "--help" in a:
    print("usage: ch05_fa3_hopper [--n N] [--step %s] [--no-backward] [--backward-step auto|all|1-9] "
          "[--no-fp8-table] [--bench] [--json]" % ("K[,K]" if LIST else "all|1-16"))
    sys.exit(0)


def opt(name, default=None):
    return a[a.index(name) + 1] if name in a else default


n, b, h, d = int(opt("--n", 64)), int(opt("--batch", 1)), int(opt("--heads", 1)), int(opt("--d", 64))
causal = "--causal" in a
step = opt("--step", "all")
steps = step.split(",") if LIST else [step]
if any(k not in ("all", "1", "8", "10") for k in steps):
    print("ch05_fa3_hopper: error: step %s does not run this problem" % step, file=sys.stderr)
    sys.exit(2)
problem = {"batch": b, "heads": h, "kv_heads": h, "nq": n, "nk": n, "d": d, "causal": causal, "dtype": "bf16"}
rep = {"problem": problem, "results": [], "notes": []}
if "--bench" in a:
    rep["ceilings"] = {"read_gbps": 4000.0, "gemm_tflops": 800.0, "gemm_what": "cuBLAS bf16"}
    rep["notes"].append("fp8 ceiling: cuBLASLt E4M3 GEMM 8192^3 1400 TFLOP/s (measured in this run)")
flops = 4.0 * b * h * n * n * d * (0.5 if causal else 1.0)
slow = float(os.environ.get("FAKE_SLOW", "1"))
if opt("--device") == "cuda":
    for s, rate in (("1", 300.0), ("8", 600.0), ("10", 640.0)):
        if step == "all" or s in steps:
            ok = os.environ.get("FAKE_FAIL") != s
            t = flops / (rate * 1e12) * 1e3 * slow
            rep["results"].append({"impl": "v%s step %s" % (s, s), "device": "cuda", "pass": ok, "flops": flops,
                                   "time_ms": t, "tflops": flops / (t * 1e-3) / 1e12, "max_abs_err": 1e-3})
    bstep = opt("--backward-step", "auto")
    if "--no-backward" not in a and (bstep == "all" or (bstep == "auto" and step == "all")):
        t = 2.5 * flops / (400e12) * 1e3 * slow
        rep["results"].append({"impl": "b9 backward", "device": "cuda", "pass": True, "flops": 2.5 * flops,
                               "time_ms": t, "tflops": 2.5 * flops / (t * 1e-3) / 1e12})
print(json.dumps(rep))
