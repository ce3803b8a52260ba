#!/usr/bin/env python3
"""Where a bench run's time went: every binary launch (seconds, CPU time, page faults, rows) and
every task against the estimate the progress bar used, from the `run` part of results.json.

    python3 bench/bench_timing.py build/bench/results.json [more.json ...]
    python3 bench/bench_timing.py --rows results.json     every row too: kernel, shape, status, rate, note
"""
import sys

sys.path.insert(0, __import__("os").path.dirname(__import__("os").path.abspath(__file__)))
from bench_common import read_json  # noqa: E402


def show_rows(res):
    for r in res.get("rows", []):
        rate = ("%.1f %s" % (r["tflops"], "TFLOP/s") if r.get("tflops") else
                "%.0f GB/s" % r["gbps"] if r.get("gbps") else "-")
        shape = "%s d=%s N=%s nk=%s B=%s H=%s/%s%s%s" % (r.get("pass"), r.get("d"), r.get("N"), r.get("nk"), r.get("B"),
                                                      r.get("H"), r.get("Hkv"), " causal" if r.get("causal") else "",
                                                      " [%s]" % r["variant"] if r.get("variant") else "")
        print("    %-44s %-40s %-11s %-16s %s" % (r.get("kernel", "?")[:44], shape, r.get("status"), rate,
                                                  (r.get("note") or "")[:90]))
    for n in res.get("notes", []):
        print("  note: %s" % n[:200])


def show(path, rows=False):
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
    if rows:
        show_rows(res)
    bad = [r for r in res.get("rows", []) if r.get("status") not in ("ok", None)]
    print("  rows: %d, not ok: %d %s" % (len(res.get("rows", [])), len(bad),
                                         "; ".join("%s %s: %s" % (r["kernel"], r.get("N"), r["status"]) for r in bad[:8])))


if __name__ == "__main__":
    rows = "--rows" in sys.argv[1:]
    for p in [a for a in sys.argv[1:] if a != "--rows"]:
        try:
            show(p, rows)
        except (OSError, ValueError) as e:
            print("== %s: %s" % (p, e))
