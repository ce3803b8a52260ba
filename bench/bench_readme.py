#!/usr/bin/env python3
"""The measured tables in the READMEs, generated from a named run kept in the repository.

    /usr/bin/python3 bench/bench_readme.py --write     regenerate bench/recorded/results.md, the plots,
                                                       and every marked README section
    /usr/bin/python3 bench/bench_readme.py --check     exit 1 (with a diff) if any of them differs
                                                       from what the recorded run gives (CI runs this)
    ... --run bench/recorded/OTHER.json                use another recorded run (default: the newest)

The recorded run is a results.json written by `./tutorial bench` on a GPU, copied to
bench/recorded/<gpu>-<date>.json. Sections are marked in a README as

    <!-- bench:lineage begin -->  ...  <!-- bench:lineage end -->     the lineage at a glance (root README)
    <!-- bench:ch04-fwd begin -->  ...  <!-- bench:ch04-fwd end -->   any table of results.md, by its name

and everything between the markers is replaced; nothing outside them is touched. A number
in those sections is never typed by hand: a regression shows up as soon as a new run is
recorded.
"""
import argparse
import difflib
import glob
import os
import re
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, HERE)
import bench_report  # noqa: E402
from bench_common import read_json  # noqa: E402

RECORDED = os.path.join(HERE, "recorded")
MARK = re.compile(r"(<!-- bench:([a-z0-9-]+) begin -->\n)(.*?)(<!-- bench:\2 end -->)", re.S)


def newest_run():
    runs = sorted(glob.glob(os.path.join(RECORDED, "*.json")))
    if not runs:
        sys.exit("bench_readme: no recorded run in %s" % os.path.relpath(RECORDED, ROOT))
    return runs[-1]


def provenance(res, run_path):
    r = res.get("run", {})
    rel = os.path.relpath(run_path, ROOT)
    return ("Measured on one %s (driver %s) on %s by `%s`%s; generated from [%s](%s) by `bench/bench_readme.py` "
            "(never typed by hand). Every ratio is to a peer measured in the same run." % (
                r.get("gpu"), r.get("driver"), (r.get("date") or "?")[:10], r.get("command"),
                ", commit %s" % r["commit"] if r.get("commit") else "", rel, rel))


def section_text(name, res, md, run_path, readme_dir):
    body = bench_report.extract_section(md, name)
    if body is None:
        return None
    body = "\n".join(l for l in body.splitlines() if not l.startswith("### "))  # the README has its own heading
    rec = os.path.relpath(os.path.join(RECORDED, "results.md"), readme_dir)
    text = provenance(res, run_path).replace("](%s)" % os.path.relpath(run_path, ROOT),
                                              "](%s)" % os.path.relpath(run_path, readme_dir))
    text += " All tables: [%s](%s).\n\n" % (os.path.relpath(os.path.join(RECORDED, "results.md"), ROOT), rec)
    text += body.strip("\n") + "\n"
    if name == "lineage" and os.path.exists(os.path.join(RECORDED, "lineage.png")):
        text += "\n![The lineage at a glance](%s)\n" % os.path.relpath(os.path.join(RECORDED, "lineage.png"),
                                                                       readme_dir)
    return text


def readmes():
    return [os.path.join(ROOT, "README.md")] + sorted(glob.glob(os.path.join(ROOT, "chapters", "*", "README.md")))


def generate(run_path):
    """{path: new text} for results.md and every README with markers."""
    res = read_json(run_path)
    md = bench_report.markdown(res)
    out = {os.path.join(RECORDED, "results.md"): md}
    for path in readmes():
        if not os.path.exists(path):
            continue
        old = open(path).read()
        missing = []

        def fill(m):
            t = section_text(m.group(2), res, md, run_path, os.path.dirname(path))
            if t is None:
                missing.append(m.group(2))
                return m.group(0)
            return m.group(1) + t + m.group(4)
        new = MARK.sub(fill, old)
        if missing:
            sys.exit("bench_readme: %s asks for table(s) %s, which the recorded run does not have" % (
                os.path.relpath(path, ROOT), ", ".join(missing)))
        if new != old or MARK.search(old):
            out[path] = new
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    g = ap.add_mutually_exclusive_group(required=True)
    g.add_argument("--write", action="store_true")
    g.add_argument("--check", action="store_true")
    ap.add_argument("--run", help="a recorded results.json (default: the newest in bench/recorded)")
    ap.add_argument("--no-plots", action="store_true", help="with --write: tables only")
    a = ap.parse_args()
    run_path = os.path.abspath(a.run or newest_run())
    if a.write and not a.no_plots:  # first: the README links the lineage picture when it exists
        import bench_plots
        for p in bench_plots.draw_all(read_json(run_path), RECORDED):
            print("wrote", os.path.relpath(p, ROOT))
    files = generate(run_path)
    if a.check:
        bad = 0
        for path, new in files.items():
            old = open(path).read() if os.path.exists(path) else ""
            if old != new:
                bad += 1
                sys.stdout.writelines(difflib.unified_diff(old.splitlines(True), new.splitlines(True),
                                                           os.path.relpath(path, ROOT) + " (in the repository)",
                                                           os.path.relpath(path, ROOT) + " (from the run)"))
        if bad:
            print("bench_readme: %d file(s) differ from %s: run bench/bench_readme.py --write" % (
                bad, os.path.relpath(run_path, ROOT)))
            return 1
        print("bench_readme: %d file(s) match %s" % (len(files), os.path.relpath(run_path, ROOT)))
        return 0
    for path, new in files.items():
        if not os.path.exists(path) or open(path).read() != new:
            with open(path, "w") as f:
                f.write(new)
            print("wrote", os.path.relpath(path, ROOT))
    return 0


if __name__ == "__main__":
    sys.exit(main())
