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
replaced; nothing outside them is touched (a section of PLACEHOLDER, e.g. ch06-models, holds one
line saying it is not measured yet until a recorded run has its table). A number
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


# A section that a README may ask for before any recorded run has measured it: the line it holds
# until one has (instead of the error a missing table is)
PLACEHOLDER = {
    "ch06-models": "Not measured yet in the recorded run.",
    "ch06-sparse": "Not measured yet in the recorded run.",
}


def newest_run():
    runs = sorted(glob.glob(os.path.join(RECORDED, "*.json")), key=run_time)
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
    return ("Measured on one %s (driver %s) on %s by `%s`%s%s; generated from [%s](%s) by `bench/bench_readme.py` "
            "(never typed by hand). Every ratio is to a peer measured in the same run." % (
                r.get("gpu"), r.get("driver"), (r.get("date") or "?")[:10], r.get("command"), run_extent(res),
                commit, rel, rel))


def section_text(name, res, md, run_path, readme_dir, tables_md=None, again=False):
    """A section of a recorded run, under its provenance line; again: a page's later section from
    the run an earlier section of that page named in full, whose line then only points back."""
    body = bench_report.extract_section(md, name)
    if body is None:
        return None
    body = "\n".join(l for l in body.splitlines() if not l.startswith("### "))  # the README has its own heading
    tables_md = tables_md or os.path.join(RECORDED, "results.md")
    rec = os.path.relpath(tables_md, readme_dir)
    if again:
        text = "Measured in the run named above on this page ([%s](%s))." % (os.path.relpath(run_path, ROOT),
                                                                            os.path.relpath(run_path, readme_dir))
    else:
        text = provenance(res, run_path).replace("](%s)" % os.path.relpath(run_path, ROOT),
                                                  "](%s)" % os.path.relpath(run_path, readme_dir))
    text += " All tables: [%s](%s).\n\n" % (os.path.relpath(tables_md, ROOT), rec)
    text += body.strip("\n") + "\n"
    if name == "lineage" and os.path.exists(os.path.join(RECORDED, "lineage.png")):
        text += "\n![The lineage at a glance](%s)\n" % os.path.relpath(os.path.join(RECORDED, "lineage.png"),
                                                                       readme_dir)
    return text


def readmes():
    """The files whose bench: sections are generated: the root README, every chapter's README and LAB.md."""
    return [os.path.join(ROOT, "README.md")] + sorted(glob.glob(os.path.join(ROOT, "chapters", "*", "README.md")) +
                                                       glob.glob(os.path.join(ROOT, "chapters", "*", "LAB.md")))


def run_time(path):
    """A recorded run's date and time from its name (<gpu>-YYYY-MM-DD-HHMM.json), for ordering runs of
    different GPUs."""
    m = re.search(r"(\d{4}-\d\d-\d\d)(?:-(\d{4}))?\.json$", os.path.basename(path))
    return (m.group(1), m.group(2) or "") if m else ("", "")


def all_runs():
    """Every recorded run, newest first."""
    return sorted(glob.glob(os.path.join(RECORDED, "*.json")), key=run_time, reverse=True)


def results_md_path(run_path, main_run):
    """results.md for the main run; <run>.md beside it for a run that only some sections come from."""
    if os.path.abspath(run_path) == os.path.abspath(main_run):
        return os.path.join(RECORDED, "results.md")
    return os.path.join(RECORDED, os.path.splitext(os.path.basename(run_path))[0] + ".md")


def section_run(name, runs, main_run):
    """The run a section comes from: a chapter's section (chNN-...) from the newest recorded run that
    measured that chapter and has the table (a run of some chapters, e.g. --chapters 05 --lab, is
    newer than the last full sweep for those chapters only); every other section (the lineage across
    chapters) from the main run. None when no run has it."""
    m = re.match(r"ch(\d\d)-", name)
    if not m:
        return main_run if bench_report.extract_section(runs[main_run][1], name) is not None else None
    for path in all_runs():
        res, md = runs[path]
        chapters = res.get("run", {}).get("chapters")
        if (not chapters or m.group(1) in chapters) and bench_report.extract_section(md, name) is not None:
            return path
    return None


def main_run_of(runs, given=None):
    """The run of the lineage table and results.md: the one given, else the newest that measured every
    chapter it was asked for without a --chapters subset (a full sweep)."""
    if given:
        return os.path.abspath(given)
    for path in all_runs():
        if "--chapters" not in (runs[path][0].get("run", {}).get("command") or ""):
            return path
    return all_runs()[0]


def generate(run_path=None):
    """{path: new text} for results.md (and <run>.md of any other run a section comes from) and every
    README or LAB.md with markers."""
    runs = {}
    for path in all_runs():
        res = read_json(path)
        runs[path] = (res, bench_report.markdown(res))
    if run_path:
        run_path = os.path.abspath(run_path)
        if run_path not in runs:
            res = read_json(run_path)
            runs[run_path] = (res, bench_report.markdown(res))
    main_run = main_run_of(runs, run_path)
    out = {os.path.join(RECORDED, "results.md"): runs[main_run][1]}
    for path in readmes():
        if not os.path.exists(path):
            continue
        old = open(path).read()
        missing = []
        named = set()  # the runs this page has named in full so far (sections are filled in page order)

        def fill(m):
            src = section_run(m.group(2), runs, main_run) if not run_path else run_path
            t = None
            if src is not None:
                res, md = runs[src]
                t = section_text(m.group(2), res, md, src, os.path.dirname(path), results_md_path(src, main_run),
                                 again=src in named)
                if t is not None:
                    named.add(src)
            if t is None and m.group(2) in PLACEHOLDER:
                return m.group(1) + PLACEHOLDER[m.group(2)] + "\n" + m.group(4)
            if t is None:
                missing.append(m.group(2))
                return m.group(0)
            if src != main_run:
                out[results_md_path(src, main_run)] = md
            return m.group(1) + t + m.group(4)
        new = MARK.sub(fill, old)
        if missing:
            sys.exit("bench_readme: %s asks for table(s) %s, which no recorded run has" % (
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
    ap.add_argument("--run", help="one recorded results.json for every section (default: each chapter's sections "
                                  "from the newest run that measured it, the rest from the newest full sweep)")
    ap.add_argument("--no-plots", action="store_true", help="with --write: tables only")
    a = ap.parse_args()
    if a.record:  # then every section from the newest run that has it (section_run())
        record(a.record)
        a.write = True
    run_path = os.path.abspath(a.run) if a.run else None
    plot_run = run_path or main_run_of({p: (read_json(p), None) for p in all_runs()})
    files = generate(run_path)
    if a.write and not a.no_plots:  # the README links the lineage picture when it exists
        import shutil
        import tempfile
        import bench_plots
        drawn = bench_plots.draw_all(read_json(plot_run), RECORDED)
        # a chapter whose sections come from a newer run of some chapters: its plots from that run too
        for other in all_runs():
            if other == plot_run or results_md_path(other, plot_run) not in files:
                continue
            chapters = read_json(other).get("run", {}).get("chapters") or []
            with tempfile.TemporaryDirectory() as tmp:
                for p in bench_plots.draw_all(read_json(other), tmp):
                    m = re.match(r"tflops_ch(\d\d)_", os.path.basename(p))
                    if m and m.group(1) in chapters:
                        dst = os.path.join(RECORDED, os.path.basename(p))
                        shutil.copyfile(p, dst)
                        drawn = [x for x in drawn if os.path.basename(x) != os.path.basename(p)] + [dst]
        for p in drawn:
            print("wrote", os.path.relpath(p, ROOT))
        for p in glob.glob(os.path.join(RECORDED, "*.png")):  # a plot of an older run that this one lacks
            if os.path.abspath(p) not in {os.path.abspath(x) for x in drawn}:
                os.remove(p)
                print("removed", os.path.relpath(p, ROOT))
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
            print("bench_readme: %d file(s) differ from the recorded runs: run bench/bench_readme.py --write" % bad)
            return 1
        print("bench_readme: %d file(s) match the recorded runs (main run: %s)" % (
            len(files), os.path.relpath(plot_run, ROOT)))
        return 0
    for path, new in files.items():
        if not os.path.exists(path) or open(path).read() != new:
            with open(path, "w") as f:
                f.write(new)
            print("wrote", os.path.relpath(path, ROOT))
    return 0


if __name__ == "__main__":
    sys.exit(main())
