#!/usr/bin/env python3
"""Two bench runs row by row: each kernel's (or peer's) time in both, the difference in us and
the ratio, for the rows that are ok in both. For a before/after of something outside the build,
such as the L2 flush (TUTORIAL_L2_FLUSH=write against the default):

    python3 bench/compare_runs.py OLD/results.json NEW/results.json [--label-a write --label-b clean]

Rows match on (kernel, pass, d, N, Nk, B, H, causal).
"""
import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_common import read_json  # noqa: E402


def key(r):
    return (r.get("kernel"), r.get("pass"), r.get("d"), r.get("N"), r.get("nk"), r.get("B"), r.get("H"),
            bool(r.get("causal")))


def table(a, b, la="A", lb="B"):
    rows_a = {key(r): r for r in a.get("rows", []) if r.get("status") == "ok" and r.get("time_ms")}
    out = ["| kernel | pass | d | N | causal | %s ms | %s ms | %s - %s us | %s / %s |" % (la, lb, lb, la, lb, la),
           "|---|---|---|---|---|---|---|---|---|"]
    n = 0
    for r in b.get("rows", []):
        k = key(r)
        if r.get("status") != "ok" or not r.get("time_ms") or k not in rows_a:
            continue
        ta, tb = rows_a[k]["time_ms"], r["time_ms"]
        out.append("| %s | %s | %s | %s | %s | %.4f | %.4f | %+.1f | %.3f |" % (
            k[0], k[1], k[2], k[3], "yes" if k[7] else "no", ta, tb, (tb - ta) * 1e3, tb / ta))
        n += 1
    return out, n


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("a")
    ap.add_argument("b")
    ap.add_argument("--label-a", default="A")
    ap.add_argument("--label-b", default="B")
    a = ap.parse_args(argv)
    lines, n = table(read_json(a.a), read_json(a.b), a.label_a, a.label_b)
    print("\n".join(lines))
    print("%d rows ok in both" % n)
    return 0


if __name__ == "__main__":
    sys.exit(main())
