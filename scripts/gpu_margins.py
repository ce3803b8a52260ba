#!/usr/bin/env python3
"""The acceptance rule's margins on a GPU: each chapter's final kernels at two shapes.

    python3 scripts/gpu_margins.py [--bin BUILD/bin]      # a markdown table on stdout

Each case runs one chapter binary with --json and prints, for every GPU row whose name says
"final" (or, for a part without a final kernel, every GPU row), its largest error against the
fp64 reference (max_abs_err, the largest over the row's outputs) and its check_margin: the
worst row's error over its own tolerance (common/compare.hpp), 1 being the edge. The shapes are
DEVELOPERS.md's shapes A and B, except where a part's problem differs: chapter 02 is fp32 (its
only dtype), the ring's shape B is not causal (the ring is causal unless --no-causal), and MLA
decodes (A: H = 128 heads, 2 new tokens a sequence over 1000 keys; B: H = 16, one token over
32K keys). A case that fails or that the GPU cannot run (not Hopper, no such
option) is printed as such, never left out.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

A = ["--batch", "2", "--heads", "4", "--n", "1000", "--d", "64", "--causal"]
B = ["--batch", "1", "--heads", "2", "--n", "2048", "--d", "128"]
# (label, binary, arguments common to both shapes, shape A, shape B)
CASES = [
    ("ch01 cuBLAS + softmax", "ch01_naive", [], A, B),
    ("ch02 softmax v1-v4 (fp32)", "ch02_online_softmax", [], A, B),
    ("ch03 FA1", "ch03_fa1", [], A, B),
    ("ch04 final", "ch04_fa2", ["--step", "final"], A, B),
    ("ch05 final, final backward", "ch05_fa3_hopper", ["--step", "final", "--backward-step", "final", "--no-fp8-table"], A, B),
    ("ch05 final fp8", "ch05_fa3_hopper", ["--step", "final-fp8", "--no-backward", "--no-fp8-table"], A, B),
    ("ch06 mask (window, d = 128)", "ch06_variants", ["mask", "--mask", "window", "--window", "256,0", "--d", "128"],
     ["--batch", "2", "--heads", "4", "--n", "1000"], ["--batch", "1", "--heads", "2", "--n", "2048"]),
    ("ch06 gqa", "ch06_variants", ["gqa"], ["--batch", "2", "--heads", "8", "--kv-heads", "2", "--n", "1000", "--d", "64", "--causal"],
     ["--batch", "1", "--heads", "8", "--kv-heads", "1", "--n", "2048", "--d", "128"]),
    ("ch06 MLA decode (absorb)", "ch06_variants", ["mla", "--form", "absorb", "--no-time"],
     ["--batch", "2", "--heads", "128", "--n", "2", "--nk", "1000"], ["--batch", "1", "--heads", "16", "--nk", "32768"]),
    ("ch06 ring forward, backward (streams, P = 4)", "ch06_variants", ["ring", "--backend", "streams", "--no-decode"],
     A, B + ["--no-causal"]),
    ("ch07 decode", "ch07_paged_radix", ["decode"], ["--nk", "1000"], ["--nk", "65536", "--lengths", "equal"]),
]


def run(binary, args):
    sub = [args[0]] if args and not args[0].startswith("-") else []  # a subcommand comes first
    cmd = [binary] + sub + ["--device", "cuda", "--json"] + args[len(sub):]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
    try:
        rep = json.loads(p.stdout)
    except ValueError:
        err = (p.stderr.strip().splitlines() or ["no output"])[-1]
        return None, "exit %d: %s" % (p.returncode, err[:120])
    rows = [r for r in rep.get("results", []) if r.get("device") == "cuda"]
    finals = [r for r in rows if "final" in (r.get("impl") or "").lower()]
    return finals or rows, None


def cell(rows, err):
    if err:
        return [err, "-"]
    if not rows:
        return ["no GPU row (skipped on this GPU)", "-"]
    out_err, out_m = [], []
    for r in rows:
        e, m = r.get("max_abs_err"), r.get("check_margin")
        ok = "" if r.get("pass") else " FAIL"
        out_err.append("%s: %s%s" % (r.get("impl"), "%.1e" % e if isinstance(e, (int, float)) else "-", ok))
        out_m.append("%.2f" % m if isinstance(m, (int, float)) else "-")
    return ["<br>".join(out_err), " / ".join(out_m)]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--bin", default=os.path.join(ROOT, "build", "bin"))
    a = ap.parse_args()
    print("| part | A: kernel: max err | A: margin | B: kernel: max err | B: margin |")
    print("|---|---|---|---|---|")
    for label, exe, common, sa, sb in CASES:
        binary = os.path.join(a.bin, exe)
        if not os.path.exists(binary):
            print("| %s | %s not built | - | - | - |" % (label, exe))
            continue
        ca = cell(*run(binary, common + sa))
        cb = cell(*run(binary, common + sb))
        print("| %s | %s | %s | %s | %s |" % (label, ca[0], ca[1], cb[0], cb[1]))
        sys.stdout.flush()


if __name__ == "__main__":
    main()
