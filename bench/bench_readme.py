#!/usr/bin/env python3
"""The measured tables in the READMEs, generated from a named run kept in the repository.

    /usr/bin/python3 bench/bench_readme.py --write     regenerate bench/recorded/results.md, the plots,
                                                       and every marked README section
    /usr/bin/python3 bench/bench_readme.py --check     exit 1 (with a diff) if any of them differs
                                                       from what the recorded run gives (CI runs this)
    ... --run bench/recorded/OTHER.json                use another recorded run (default: the newest)
    /usr/bin/python3 bench/bench_readme.py --record LOG  copy a run (results.json, or a GPU log holding it
                                                       on one line, as JSON or after BENCH_RESULTS_B64GZ as
                                                       gzip+base64) to bench/recorded/<gpu>-<date>-<HHMM>.json,
                                                       then --write

The recorded run is a results.json written by `./tutorial bench` on a GPU, copied to
bench/recorded/<gpu>-<date>-<HHMM>.json (--record does it); the newest name is the named run. Sections are marked in a README as

    <!-- bench:lineage begin -->  ...  <!-- bench:lineage end -->     the lineage at a glance (root README)
    <!-- bench:ch04-fwd begin -->  ...  <!-- bench:ch04-fwd end -->   any table of results.md, by its name
    <!-- bench:ch05-lab begin -->  ...  <!-- bench:ch05-lab end -->   chapter 05's lab steps against their
                                                                     parents (in chapters/05_fa3_hopper/LAB.md)

in the root README.md, a chapter's README.md or its LAB.md, and everything between the markers is
replaced; nothing outside them is touched. A number
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


def run_extent(res):
    """How long the run took and whether it ran its whole plan: "in 6:12, every one of its 161
    tasks", or "in 8:09, 150 of its 161 tasks (11 left to its --budget)"; "" when the run does not say."""
    r = res.get("run", {})
    if r.get("duration_s") is None or "tasks" not in r:
        return ""
    secs = int(round(r["duration_s"]))
    ran = len(r["tasks"])
    left = sum(1 for n in res.get("notes", []) if n.startswith("not run (--budget"))
    whole = r.get("complete", True) and not left
    return " in %d:%02d, %s" % (secs // 60, secs % 60, "every one of its %d tasks" % ran if whole else
                               "%d of its %d tasks (%d left to its --budget)" % (ran, ran + left, left)
                               if left else "%d tasks, cut before its end" % ran)


def provenance(res, run_path):
    """The line above every generated section: the GPU, the date, the command, how long it ran, the
    commit the tree was at (run.git_head, short) and whether that tree had uncommitted changes
    (run.git_dirty), and the recorded file."""
    r = res.get("run", {})
    rel = os.path.relpath(run_path, ROOT)
    commit = bench_report.commit_text(r)
    commit = ", at " + commit if commit else ", commit not recorded"
    if r.get("commit"):  # BENCH_COMMIT: the commit a copied tree came from
        commit += " (the tree copied from commit %s)" % r["commit"]
    return ("Measured on one %s (driver %s) on %s by `%s`%s%s; generated from [%s](%s) by `bench/bench_readme.py` "
            "(never typed by hand). Every ratio is to a peer measured in the same run." % (
                r.get("gpu"), r.get("driver"), (r.get("date") or "?")[:10], r.get("command"), run_extent(res),
                commit, rel, rel))


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
    """The files whose bench: sections are generated: the root README, every chapter's README and LAB.md."""
    return [os.path.join(ROOT, "README.md")] + sorted(glob.glob(os.path.join(ROOT, "chapters", "*", "README.md")) +
                                                       glob.glob(os.path.join(ROOT, "chapters", "*", "LAB.md")))


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


def run_name(res):
    """bench/recorded/<gpu>-<date>-<HHMM>.json for a results.json: "NVIDIA H200", 2026-12-01T12:50Z
    -> h200-2026-12-01-1250.json (the newest run sorts last)."""
    r = res.get("run", {})
    gpu = re.sub(r"[^a-z0-9]+", "-", (r.get("gpu") or "gpu").lower().replace("nvidia", "")).strip("-") or "gpu"
    date = r.get("date") or "0000-00-00T00:00Z"
    return "%s-%s-%s.json" % (gpu, date[:10], date[11:16].replace(":", ""))


def record(source):
    """Copies a run into bench/recorded under run_name(). `source` is a results.json, or a GPU log
    with the run's results.json on one line of its own."""
    import json
    text = open(source).read()
    try:
        res = json.loads(text)
    except ValueError:
        res = None
        for line in text.splitlines():
            line = line.strip()
            if line.startswith("{") and '"rows"' in line and '"run"' in line:
                res = json.loads(line)
            elif line.startswith("BENCH_RESULTS_B64GZ "):  # the GPU requests' form: gzip, then base64
                import base64
                import gzip
                res = json.loads(gzip.decompress(base64.b64decode(line.split(None, 1)[1])))
        if res is None:
            sys.exit("bench_readme: no results.json in %s" % source)
    for old in glob.glob(os.path.join(RECORDED, "*.json")):  # an older run named by its date only
        if re.match(r"^.*-\d{4}-\d\d-\d\d\.json$", os.path.basename(old)):
            new = os.path.join(RECORDED, run_name(read_json(old)))
            os.rename(old, new)
            print("renamed", os.path.relpath(old, ROOT), "->", os.path.relpath(new, ROOT))
    path = os.path.join(RECORDED, run_name(res))
    with open(path, "w") as f:
        json.dump(res, f, indent=1)
        f.write("\n")
    print("recorded", os.path.relpath(path, ROOT))
    return path


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    g = ap.add_mutually_exclusive_group(required=True)
    g.add_argument("--write", action="store_true")
    g.add_argument("--check", action="store_true")
    g.add_argument("--record", metavar="RESULTS_OR_LOG",
                   help="copy a run (its results.json, or a GPU log that holds it) into bench/recorded, then --write")
    ap.add_argument("--run", help="a recorded results.json (default: the newest in bench/recorded)")
    ap.add_argument("--no-plots", action="store_true", help="with --write: tables only")
    a = ap.parse_args()
    if a.record:
        a.run, a.write = record(a.record), True
    run_path = os.path.abspath(a.run or newest_run())
    if a.write and not a.no_plots:  # first: the README links the lineage picture when it exists
        import bench_plots
        drawn = bench_plots.draw_all(read_json(run_path), RECORDED)
        for p in drawn:
            print("wrote", os.path.relpath(p, ROOT))
        for p in glob.glob(os.path.join(RECORDED, "*.png")):  # a plot of an older run that this one lacks
            if os.path.abspath(p) not in {os.path.abspath(x) for x in drawn}:
                os.remove(p)
                print("removed", os.path.relpath(p, ROOT))
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
