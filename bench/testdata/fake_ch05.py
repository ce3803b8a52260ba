#!/usr/bin/env python3
"""A stand-in for a chapter binary in bench/test_bench.py: answers --help, and prints a --json report
of three forward steps (v1, v8, v10) and one backward row, with made-up times. FAKE_SLOW multiplies
every time; FAKE_FAIL names a step whose row fails its check; FAKE_LOG appends each command line;
FAKE_LIST makes --step take a list (K[,K...]), as the chapter binaries' does now.

FAKE_MAIN makes it chapter 05's binary with a main path and a lab: its --help lists --lab and says
"--step K[,K] ... (v1-v8, final, final-fp8; with --lab also the lab's v9-v29; ...)"; without --lab
it runs v1, v8, "final forward" and "final fp8 forward" (the main path) and the backward b11 and
"final backward"; --lab (or a lab step asked by number) adds v10 and the backward b13. FAKE_LAB says
the build has the lab: without it, --lab or a lab step exits 2, as a build without TUTORIAL_LAB does.
FAKE_V1 sets v1's TFLOP/s (300), to make it slow enough for the bench's pruning."""
import json
import os
import sys

a = sys.argv[1:]
if os.environ.get("FAKE_LOG"):
    with open(os.environ["FAKE_LOG"], "a") as f:
        f.write(" ".join(a) + "  GLIBC_TUNABLES=" + os.environ.get("GLIBC_TUNABLES", "(unset)") + "\n")
LIST = bool(os.environ.get("FAKE_LIST")) or bool(os.environ.get("FAKE_MAIN"))
MAIN = bool(os.environ.get("FAKE_MAIN"))
BUILT_LAB = bool(os.environ.get("FAKE_LAB"))
if "--help" in a:
    if MAIN:
        print("usage: ch05_fa3_hopper [options]\n  --step K[,K]     run these forward steps, e.g. 1,8,final "
              "(v1-v8, final, final-fp8; with --lab also the lab's v9-v29; inputs uploaded once for all), "
              "or all [all]\n  --lab            also run the lab's steps\n  --no-backward\n"
              "  --backward-step X  (auto | all | 1 | 11 | 13 | final)\n  --no-fp8-table\n  --bench\n  --json")
    else:
        print("usage: ch05_fa3_hopper [--n N] [--step %s] [--no-backward] [--backward-step auto|all|1-9] "
              "[--no-fp8-table] [--bench] [--json]" % ("K[,K]" if LIST else "all|1-16"))
    sys.exit(0)


def opt(name, default=None):
    return a[a.index(name) + 1] if name in a else default


n, b, h, d = int(opt("--n", 64)), int(opt("--batch", 1)), int(opt("--heads", 1)), int(opt("--d", 64))
causal = "--causal" in a
lab = "--lab" in a
step = opt("--step", "all")
steps = step.split(",") if LIST else [step]
if MAIN:
    known_main, known_lab = {"all", "1", "8", "final", "final-fp8"}, {"10"}
    if (lab or any(k in known_lab for k in steps)) and not BUILT_LAB:
        print("ch05_fa3_hopper: error: --lab: this build has no lab steps (configure with -DTUTORIAL_LAB=ON)",
              file=sys.stderr)
        sys.exit(2)
    if any(k not in known_main | known_lab for k in steps):
        print("ch05_fa3_hopper: error: step %s does not run this problem" % step, file=sys.stderr)
        sys.exit(2)
elif any(k not in ("all", "1", "8", "10") for k in steps):
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
    if MAIN:
        fwd = [("1", "v1 step 1", float(os.environ.get("FAKE_V1", 300.0)), False), ("8", "v8 step 8", 600.0, False),
               ("final", "final forward", 660.0, False), ("final-fp8", "final fp8 forward", 900.0, False),
               ("10", "v10 step 10", 640.0, True)]
    else:
        fwd = [(s, "v%s step %s" % (s, s), r, False) for s, r in (("1", 300.0), ("8", 600.0), ("10", 640.0))]
    for s, name, rate, in_lab in fwd:
        if (step == "all" and (not MAIN or not in_lab or lab)) or s in steps:
            ok = os.environ.get("FAKE_FAIL") != s
            t = flops / (rate * 1e12) * 1e3 * slow
            rep["results"].append({"impl": name, "device": "cuda", "pass": ok, "flops": flops,
                                   "time_ms": t, "tflops": flops / (t * 1e-3) / 1e12, "max_abs_err": 1e-3})
    bstep = opt("--backward-step", "auto")
    if "--no-backward" not in a and (bstep == "all" or (bstep == "auto" and step == "all")):
        bwd = [("b11 backward", 400.0, False), ("final backward", 450.0, False), ("b13 backward", 420.0, True)] \
            if MAIN else [("b9 backward", 400.0, False)]
        for name, rate, in_lab in bwd:
            if in_lab and not lab:
                continue
            t = 2.5 * flops / (rate * 1e12) * 1e3 * slow
            rep["results"].append({"impl": name, "device": "cuda", "pass": True, "flops": 2.5 * flops,
                                   "time_ms": t, "tflops": 2.5 * flops / (t * 1e-3) / 1e12, "max_abs_err": 2e-3})
print(json.dumps(rep))
