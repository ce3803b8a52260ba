#!/usr/bin/env python3
"""Where a bench run's time went: every binary launch (seconds, CPU time, page faults, rows) and
every task against the estimate the progress bar used, from the `run` part of results.json.

    python3 bench/bench_timing.py build/bench/results.json [more.json ...]
"""
import sys

sys.path.insert(0, __import__("os").path.dirname(__import__("os").path.abspath(__file__)))
from bench_common import read_json  # noqa: E402


def show(path):
    res = read_json(path)
    run = res.get("run", {})
    print("== %s: `%s`, %s s, GLIBC_TUNABLES=%s" % (path, run.get("command"), run.get("duration_s"),
                                                    (run.get("binary_env") or {}).get("GLIBC_TUNABLES", "?")))
    for l in run.get("launches", []):
        print("  %6.2f s  user %6s  sys %5s  minflt %8s  rows %4s  %s %s [%s]" % (
            l["s"], l.get("user_s", "-"), l.get("sys_s", "-"), l.get("minflt", "-"), l.get("rows", "-"),
            l["binary"], l["args"][:110], l["status"]))
    tasks = run.get("tasks", [])
    if tasks:
        s = sum(t["s"] for t in tasks)
        e = sum(t["est_s"] for t in tasks)
        print("  tasks: %.1f s measured, %.1f s estimated (%d tasks)" % (s, e, len(tasks)))
        for t in tasks:
            if abs(t["s"] - t["est_s"]) > max(2.0, 0.25 * t["est_s"]):
                print("    %6.1f s (est %5.1f)  %s" % (t["s"], t["est_s"], t["task"]))
    bad = [r for r in res.get("rows", []) if r.get("status") not in ("ok", None)]
    print("  rows: %d, not ok: %d %s" % (len(res.get("rows", [])), len(bad),
                                         "; ".join("%s %s: %s" % (r["kernel"], r.get("N"), r["status"]) for r in bad[:8])))


if __name__ == "__main__":
    for p in sys.argv[1:]:
        try:
            show(p)
        except (OSError, ValueError) as e:
            print("== %s: %s" % (p, e))
