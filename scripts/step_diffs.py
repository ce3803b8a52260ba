#!/usr/bin/env python3
"""The "step -> lines changed" tables of the chapter READMEs.

A chapter that improves a kernel move by move keeps one file per step in a
`steps/` folder (`v1_idea.cu`, `v2_idea.cu`, ...). Each step is a whole file whose
diff against its predecessor is the lesson, so each README lists those diffs and
their size:

    python3 scripts/step_diffs.py            # rewrite the tables in place
    python3 scripts/step_diffs.py chapters/04_fa2/README.md   # only that README's table
    python3 scripts/step_diffs.py --check    # exit 1 if a table is stale or a step is missing
    python3 scripts/step_diffs.py --print    # print the tables, write nothing

The chain is derived from the tree, not written down:
  * every `steps/` folder under chapters/ is one series, its steps `v<N>[suffix]_*.cu`
    sorted by step number (a kernel file in steps/ without a step number is a series
    of one, derived from what CROSS says: chapter 05's backward b-files and its final
    kernels, final.cu, final_fp8.cu and final_backward.cu, each listed after the step
    it derives from);
  * a step derives from the step before it, unless its header says otherwise with
    "What changes from v<N>" (a branch: chapter 02's v3 and v4 both derive from v2);
  * a series' first step derives from another chapter's kernel, as the small table
    CROSS below says. It names a folder's last step ("the last step of chapter 04"),
    not a file name, so renaming steps breaks nothing;
  * a `steps/lab/` folder (chapter 05's tuning experiments beside its main path) is one
    series of its own, every file of it (v<N> and b<N> alike) derived from the step its
    header names: "What changes from v<N>" (or b<N>), else "(from v<N>)" or "(branches
    from v<N>)" in its first line. That parent may be a lab step or a main-path step in
    steps/; a header that names a missing step, or no step at all, is an error.
A file CROSS names in steps/ or steps/lab/ is looked for in the other folder too, so the
table reads the same before and after a step moves into the lab.

Only code is counted: comments, blank lines and trailing whitespace are removed
from both files before the line diff, so a reworded comment costs nothing and a
re-indented line counts as changed. The table goes between the markers

    <!-- step-diffs:begin -->
    <!-- step-diffs:end -->

of the nearest README.md above the series (the chapter's own); a lab series' table goes
in the LAB.md beside it (chapters/05_fa3_hopper/LAB.md for chapters/05_fa3_hopper/steps/lab).
"""

from __future__ import annotations

import argparse
import difflib
import os
import re
import sys
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
BEGIN = "<!-- step-diffs:begin -->"
END = "<!-- step-diffs:end -->"
DOCS = ("README.md",)  # a chapter's text
LAB_DIR = "lab"        # steps/lab/: the experiments beside a chapter's main path
LAB_DOC = "LAB.md"     # ... and the text that holds their table, beside the chapter's README
STEP_RE = re.compile(r"^v(\d+)([a-z]?)_.*\.cu$")
FROM_RE = re.compile(r"What changes from v(\d+)([a-z]?)\b")
# a lab step's parent: v<N>, b<N> or a final kernel (final, final_fp8, final_backward: final.cu, ...),
# from the header's "What changes from ..." or its first line's "(from ...)" / "(branches from ...)"
NAMED_RE = re.compile(r"^([vb])(\d+)([a-z]?)_.*\.cu$")
PARENT = r"([vb]\d+[a-z]?|final(?:[_-](?:fp8|backward))?)\b"
HEAD_FROM_RE = re.compile(r"What changes from " + PARENT)
FIRST_LINE_FROM_RE = re.compile(r"\((?:branches )?from " + PARENT)


@dataclass(frozen=True)
class Last:
    """The last step of a steps/ folder, optionally skipping steps whose name matches `skip`."""

    folder: str
    skip: str | None = None
    label: str = ""


@dataclass(frozen=True)
class File:
    """One named kernel file (a chapter without steps)."""

    path: str


@dataclass(frozen=True)
class New:
    """A kernel that starts afresh; `why` says what it shares with earlier chapters."""

    why: str


# What the first step of each series (or a chapter's single kernel) derives from.
# Keys: a steps/ folder (its first step) or a kernel file of a chapter without steps.
# A key whose folder or file does not exist yet is skipped.
CROSS: dict[str, Last | File | New] = {
    "chapters/02_online_softmax/steps": File("chapters/01_naive/naive.cu"),
    "chapters/03_fa1/fa1.cu": Last("chapters/02_online_softmax/steps"),
    "chapters/04_fa2/steps": File("chapters/03_fa1/fa1.cu"),
    # chapter 04's final forward kernel: v6, the main path's last step, with the lab's table (LAB.md)
    "chapters/04_fa2/steps/final.cu": File("chapters/04_fa2/steps/v6_two_tiles_per_warp.cu"),
    # chapter 05's v1 is chapter 04's v9 (now in its lab; final.cu took its d = 64 and 256 rows)
    # with cp.async replaced by TMA
    "chapters/05_fa3_hopper/steps": File("chapters/04_fa2/steps/lab/v9_per_dim_tiles.cu"),
    # chapter 06's mask kernels: each is one earlier kernel with a mask policy put in
    # (chapter 04's v9, wherever it lives: steps/ or steps/lab/)
    "chapters/06_variants/masks/ampere_mask.cu": File("chapters/04_fa2/steps/v9_per_dim_tiles.cu"),
    # (chapter 05's v8: its later bf16 steps came after chapter 06 was derived from it)
    "chapters/06_variants/masks/hopper_mask.cu": File("chapters/05_fa3_hopper/steps/v8_head_dims.cu"),
    "chapters/06_variants/masks/backward_mask.cu": File("chapters/04_fa2/backward.cu"),
    # the sm90a masked backward: chapter 05's final backward with the policy
    "chapters/06_variants/masks/hopper_backward.cu": File("chapters/05_fa3_hopper/steps/final_backward.cu"),
    # the main path's sm90a mask steps v1-v4 improve hopper_mask.cu
    "chapters/06_variants/masks/steps": File("chapters/06_variants/masks/hopper_mask.cu"),
    # chapter 06's final masked forward: v4, the main path's last step, with its configuration as one table
    "chapters/06_variants/masks/steps/final.cu": File("chapters/06_variants/masks/steps/v4_row_spans.cu"),
    # chapter 06's packed GQA for non-Hopper GPUs: chapter 04's v9 with the packed view
    "chapters/06_variants/gqa_mla/ampere_packed.cu": File("chapters/04_fa2/steps/v9_per_dim_tiles.cu"),
    # chapter 05's backward: b1 is chapter 04's backward on Hopper's machinery, b2 warp-specialises b1.
    # The main path is b1, b2, b5, b6, b10, b11 and final_backward.cu; b3, b4, b7-b9 and b12-b17 live
    # in steps/lab/ (their table is LAB.md's, from their headers), and a main step's parent is the file
    # it really changes, in the lab or not: b5 changes the lab's b4, b10 the lab's b9. While every
    # b-file still sits in steps/, a name in steps/lab/ is found there (resolve()).
    "chapters/05_fa3_hopper/steps/b1_wgmma_backward.cu": File("chapters/04_fa2/backward.cu"),
    "chapters/05_fa3_hopper/steps/b2_warp_specialized.cu": File("chapters/05_fa3_hopper/steps/b1_wgmma_backward.cu"),
    "chapters/05_fa3_hopper/steps/b3_dq_fragment_order.cu": File("chapters/05_fa3_hopper/steps/b2_warp_specialized.cu"),
    "chapters/05_fa3_hopper/steps/b4_no_spills.cu": File("chapters/05_fa3_hopper/steps/lab/b3_dq_fragment_order.cu"),
    "chapters/05_fa3_hopper/steps/b5_dq_writer.cu": File("chapters/05_fa3_hopper/steps/lab/b4_no_spills.cu"),
    "chapters/05_fa3_hopper/steps/b6_deterministic_walk.cu": File("chapters/05_fa3_hopper/steps/b5_dq_writer.cu"),
    "chapters/05_fa3_hopper/steps/b7_dq_split_by_keys.cu": File("chapters/05_fa3_hopper/steps/b6_deterministic_walk.cu"),
    "chapters/05_fa3_hopper/steps/b8_named_barrier_release.cu": File("chapters/05_fa3_hopper/steps/b6_deterministic_walk.cu"),
    "chapters/05_fa3_hopper/steps/b9_two_ds_buffers.cu": File("chapters/05_fa3_hopper/steps/lab/b8_named_barrier_release.cu"),
    "chapters/05_fa3_hopper/steps/b10_consumer_offset.cu": File("chapters/05_fa3_hopper/steps/lab/b9_two_ds_buffers.cu"),
    "chapters/05_fa3_hopper/steps/b11_longest_walks_first.cu": File("chapters/05_fa3_hopper/steps/b10_consumer_offset.cu"),
    "chapters/05_fa3_hopper/steps/b12_pairs_of_query_blocks.cu": File("chapters/05_fa3_hopper/steps/b11_longest_walks_first.cu"),
    "chapters/05_fa3_hopper/steps/b13_eighty_queries.cu": File("chapters/05_fa3_hopper/steps/b11_longest_walks_first.cu"),
    "chapters/05_fa3_hopper/steps/b14_ds_by_queries.cu": File("chapters/05_fa3_hopper/steps/lab/b13_eighty_queries.cu"),
    "chapters/05_fa3_hopper/steps/b15_scores_ahead.cu": File("chapters/05_fa3_hopper/steps/lab/b13_eighty_queries.cu"),
    # chapter 05's final kernels: the main path's last forward step and last backward step, tuned
    "chapters/05_fa3_hopper/steps/final.cu": File("chapters/05_fa3_hopper/steps/v8_head_dims.cu"),
    "chapters/05_fa3_hopper/steps/final_fp8.cu": File("chapters/05_fa3_hopper/steps/v8_head_dims.cu"),
    "chapters/05_fa3_hopper/steps/final_backward.cu": File("chapters/05_fa3_hopper/steps/b11_longest_walks_first.cu"),
    "chapters/07_paged_radix/steps": New("a decode (one query row per head), built on common/cuda/, not on an earlier loop"),
    # chapter 07's final kernels: the main path's bf16 and 8-bit decode steps with one configuration table each
    "chapters/07_paged_radix/steps/final_bf16.cu": File("chapters/07_paged_radix/steps/v12_one_trip_merge.cu"),
    "chapters/07_paged_radix/steps/final_8bit.cu": File("chapters/07_paged_radix/steps/v9_keys_as_rows.cu"),
}


class ChainError(Exception):
    pass


notes: list[str] = []  # what build() left alone, and why (printed by --check and --print)


def rel(p: Path) -> str:
    return p.relative_to(ROOT).as_posix()


def step_key(p: Path) -> tuple[int, str]:
    m = STEP_RE.match(p.name)
    assert m
    return int(m.group(1)), m.group(2)


def steps_of(folder: Path) -> list[Path]:
    return sorted((p for p in folder.iterdir() if p.is_file() and STEP_RE.match(p.name)), key=step_key)


def strip_code(text: str) -> list[str]:
    """The lines of C++/CUDA source with comments, blank lines and trailing blanks removed."""
    out, cur = [], []
    i, n = 0, len(text)
    in_block = False
    while i < n:
        c = text[i]
        if in_block:
            if text.startswith("*/", i):
                in_block = False
                i += 2
            else:
                if c == "\n":
                    out.append("".join(cur))
                    cur = []
                i += 1
            continue
        if text.startswith("//", i):
            j = text.find("\n", i)
            i = n if j < 0 else j
            continue
        if text.startswith("/*", i):
            in_block = True
            i += 2
            continue
        if c in "\"'":
            # a string or character literal, copied whole (a // inside it is not a comment)
            j = i + 1
            while j < n and text[j] != c and text[j] != "\n":
                j += 2 if text[j] == "\\" else 1
            cur.append(text[i : j + 1])
            i = j + 1
            continue
        if c == "\n":
            out.append("".join(cur))
            cur = []
        else:
            cur.append(c)
        i += 1
    out.append("".join(cur))
    return [line.rstrip() for line in out if line.strip()]


def code_diff(a: Path, b: Path) -> tuple[int, int]:
    """(+added, -removed) code lines from a to b."""
    la = strip_code(a.read_text(encoding="utf-8"))
    lb = strip_code(b.read_text(encoding="utf-8"))
    plus = minus = 0
    for tag, i1, i2, j1, j2 in difflib.SequenceMatcher(None, la, lb, autojunk=False).get_opcodes():
        if tag in ("replace", "delete"):
            minus += i2 - i1
        if tag in ("replace", "insert"):
            plus += j2 - j1
    return plus, minus


def other_place(path: str) -> str | None:
    """The same file name in steps/lab/ for a path in steps/, and in steps/ for one in steps/lab/."""
    parts = path.split("/")
    if len(parts) >= 3 and parts[-2] == LAB_DIR and parts[-3] == "steps":
        return "/".join(parts[:-2] + parts[-1:])
    if len(parts) >= 2 and parts[-2] == "steps":
        return "/".join(parts[:-1] + [LAB_DIR, parts[-1]])
    return None


def resolve(pred: Last | File | New) -> Path | None:
    if isinstance(pred, New):
        return None
    if isinstance(pred, File):
        p = ROOT / pred.path
        if not p.is_file():
            alt = other_place(pred.path)
            if alt and (ROOT / alt).is_file():
                return ROOT / alt
            raise ChainError(f"{pred.path}: named in the cross-chapter table, but missing")
        return p
    folder = ROOT / pred.folder
    steps = [s for s in steps_of(folder)] if folder.is_dir() else []
    if pred.skip:
        steps = [s for s in steps if not re.search(pred.skip, s.name)]
    if not steps:
        raise ChainError(f"{pred.folder}: the cross-chapter table needs its last step, but it has none")
    return steps[-1]


@dataclass
class Row:
    src: Path | None  # None: a new kernel
    dst: Path
    note: str = ""


def is_lab(key: str) -> bool:
    """A lab series: a steps/lab/ folder (or a file in one)."""
    parts = key.split("/")
    return LAB_DIR in parts and parts.index(LAB_DIR) > 0 and parts[parts.index(LAB_DIR) - 1] == "steps"


def steps_home(path: Path) -> Path:
    """The steps/ folder of a file or folder in steps/ or steps/lab/."""
    p = path if path.is_dir() else path.parent
    return p.parent if p.name == LAB_DIR else p


def header_parent(path: Path) -> str | None:
    """The step a file's header says it changes: "v8" for "What changes from v8" in its first 60
    lines, else for "(from v8)" or "(branches from v8)" in its first line (b<N> alike, and a final
    kernel by its file's name: "final", "final_fp8", "final_backward"). Both present and naming
    different steps is an error."""
    lines = path.read_text(encoding="utf-8").splitlines()
    m = HEAD_FROM_RE.search("\n".join(lines[:60]))
    f = FIRST_LINE_FROM_RE.search(lines[0]) if lines else None
    what = m.group(1).replace("-", "_") if m else None
    first = f.group(1).replace("-", "_") if f else None
    if what and first and what != first:
        raise ChainError(f"{rel(path)}: its first line says it derives from {first}, its header from {what}")
    return what or first


def find_step(home: Path, step: str) -> Path | None:
    """The file of step v<N> or b<N> (v<N>_*.cu), or of a final kernel (final.cu, ...), in steps/ or
    steps/lab/."""
    for folder in (home, home / LAB_DIR):
        if folder.is_dir():
            for p in sorted(folder.iterdir()):
                m = NAMED_RE.match(p.name)
                if p.is_file() and (m and m.group(1) + m.group(2) + m.group(3) == step or p.name == step + ".cu"):
                    return p
    return None


def named_key(p: Path) -> tuple[int, int, str, str]:
    """Lab files in order: v<N> by number, then b<N> by number, then anything else by name."""
    m = NAMED_RE.match(p.name)
    if not m:
        return (2, 0, "", p.name)
    return (0 if m.group(1) == "v" else 1, int(m.group(2)), m.group(3), p.name)


def lab_rows(key: str) -> list[Row]:
    """A lab folder: every kernel file against the step its header names (CROSS first, for a file
    it lists). The parent may be a lab step or a main-path step in steps/."""
    folder = ROOT / key
    files = sorted((p for p in folder.iterdir() if p.is_file() and p.suffix == ".cu"), key=named_key)
    if not files:
        raise ChainError(f"{key}: a lab folder with no kernel file in it")
    rows: list[Row] = []
    prev = None
    for cur in files:
        pred = CROSS.get(rel(cur))
        if pred is not None:
            src = resolve(pred)
        else:
            h = header_parent(cur)
            if h is None:
                raise ChainError(f"{rel(cur)}: a lab step whose header names no parent "
                                 "(\"What changes from v<N>\" (or b<N>, final), or \"(from v<N>)\" in its first line)")
            src = find_step(steps_home(folder), h)
            if src is None:
                raise ChainError(f"{rel(cur)}: its header says it changes {h}, which is missing")
        note = "" if src == prev else ("from the main path" if src is not None and src.parent != folder
                                       else "branch")
        rows.append(Row(src, cur, note))
        prev = cur
    return rows


def series_rows(key: str) -> list[Row]:
    """The diffs of one series: its first step against its predecessor, then step by step."""
    if is_lab(key) and (ROOT / key).is_dir():
        return lab_rows(key)
    path = ROOT / key
    pred = CROSS.get(key)
    if path.is_file():
        files = [path]
    else:
        files = steps_of(path)
        if not files:
            raise ChainError(f"{key}: a steps/ folder with no step v<N>_*.cu in it")
    rows: list[Row] = []
    if pred is None:
        rows.append(Row(None, files[0], "first step (no predecessor in scripts/step_diffs.py CROSS)"))
    elif isinstance(pred, New):
        rows.append(Row(None, files[0], "new kernel: " + pred.why))
    else:
        note = pred.label if isinstance(pred, Last) and pred.label else ""
        src = resolve(pred)
        if src is not None and is_lab(rel(src)) and not is_lab(key):
            note = note or "from the lab"  # a main-path step that changes a lab step (b5 changes b4)
        rows.append(Row(src, files[0], note))
    by_number = {step_key(f): f for f in files} if not path.is_file() else {}
    for prev, cur in zip(files, files[1:]):
        src = prev
        head = "\n".join(cur.read_text(encoding="utf-8").splitlines()[:60])
        m = FROM_RE.search(head)
        if m:
            named = by_number.get((int(m.group(1)), m.group(2)))
            if named is None:
                raise ChainError(f"{rel(cur)}: its header says it changes v{m.group(1)}{m.group(2)}, which is missing")
            src = named
        rows.append(Row(src, cur, "branch" if src != prev else ""))
    return rows


def all_series() -> list[str]:
    """Every steps/ folder of numbered steps, every other kernel file in a steps/ folder
    (a kernel of its own, derived as CROSS says), every file CROSS names as a key, and every
    steps/lab/ folder (one series). A final kernel (final*.cu) comes right after the series
    that holds the file it derives from: final.cu after v8, final_backward.cu after b11."""
    keys = set()
    for folder in (ROOT / "chapters").glob("**/steps"):
        if not folder.is_dir():
            continue
        if steps_of(folder):
            keys.add(rel(folder))
        keys |= {rel(p) for p in folder.glob("*.cu") if not STEP_RE.match(p.name)}
        lab = folder / LAB_DIR
        if lab.is_dir() and any(p.suffix == ".cu" for p in lab.iterdir()):
            keys.add(rel(lab))
    keys |= {k for k in CROSS if (ROOT / k).is_file()}

    def natural(k: str) -> list:  # numbers in names compare as numbers: b9 before b10
        return [int(x) if x.isdigit() else x for x in re.split(r"(\d+)", k)]

    order = sorted((k for k in keys if not Path(k).name.startswith("final")), key=natural)
    for k in sorted((k for k in keys if Path(k).name.startswith("final")), key=natural):
        at = len(order)
        pred = CROSS.get(k)
        try:
            src = resolve(pred) if isinstance(pred, (File, Last)) else None
        except ChainError:
            src = None
        if src is not None:
            holders = [i for i, o in enumerate(order)
                       if (ROOT / o) == src or ((ROOT / o).is_dir() and src.parent == ROOT / o)]
            if holders:
                at = holders[-1] + 1
                while at < len(order) and Path(order[at]).name.startswith("final"):
                    at += 1  # after the finals already placed there: final.cu, then final_fp8.cu
        order.insert(at, k)
    return order


def readme_of(key: str) -> Path | None:
    """The nearest README.md above a series, up to its chapter folder; for a lab series the
    nearest LAB.md above its steps/ folder (the doc beside the chapter's README), or None."""
    chapters = ROOT / "chapters"
    names = (LAB_DOC,) if is_lab(key) else DOCS
    p = steps_home(ROOT / key).parent if is_lab(key) else (ROOT / key).parent
    while p != chapters and p != ROOT:
        for name in names:
            if (p / name).is_file():
                return p / name
        p = p.parent
    return None


def table(readme: Path, rows: list[Row]) -> str:
    here = readme.parent

    def r(p: Path) -> str:
        return os.path.relpath(p, here)

    def name(p: Path) -> str:
        # a step of this README's chapter by its file name, another chapter's file by its path
        return p.name if p.parent in (here, here / "steps", here / "steps" / LAB_DIR) else r(p).lstrip("./")

    lines = [
        BEGIN,
        "<!-- generated by scripts/step_diffs.py (code lines only: comments and blank lines are not counted) -->",
        "",
        "| from → to | command (in this folder) | code lines changed |",
        "|---|---|---|",
    ]
    for row in rows:
        if row.src is None:
            lines.append(f"| → `{name(row.dst)}` | {row.note} | |")
            continue
        plus, minus = code_diff(row.src, row.dst)
        note = f" ({row.note})" if row.note else ""
        lines.append(
            f"| `{name(row.src)}` → `{name(row.dst)}`{note} | `diff {r(row.src)} {r(row.dst)}` | +{plus} −{minus} |"
        )
    lines += ["", END]
    return "\n".join(lines)


def build() -> tuple[dict[Path, str], list[str]]:
    """The table of every README that has the markers, and the errors found on the way."""
    per_readme: dict[Path, list[Row]] = {}
    errors: list[str] = []
    broken: set[Path] = set()  # a doc whose series did not resolve (its error is reported already)
    for key in all_series():
        readme = readme_of(key)
        if readme is None:
            continue
        try:
            per_readme.setdefault(readme, []).extend(series_rows(key))
        except ChainError as e:
            errors.append(str(e))
            broken.add(readme)
    tables: dict[Path, str] = {}
    notes.clear()
    for readme in sorted(d for name in DOCS + (LAB_DOC,) for d in (ROOT / "chapters").glob("**/" + name)):
        text = readme.read_text(encoding="utf-8")
        if BEGIN not in text:
            continue
        if END not in text or text.index(END) < text.index(BEGIN):
            errors.append(f"{rel(readme)}: {BEGIN} without a following {END}")
            continue
        rows = per_readme.get(readme)
        if not rows and readme in broken:
            continue
        if not rows and readme.name == LAB_DOC and not list(readme.parent.glob("**/steps/" + LAB_DIR)):
            # a LAB.md written before its steps moved to steps/lab/: nothing to put there yet
            notes.append(f"{rel(readme)}: no steps/{LAB_DIR}/ folder beside it yet: its table is left as it is")
            continue
        if not rows:
            errors.append(f"{rel(readme)}: has the step-diff markers, but no series of steps belongs to it")
            continue
        tables[readme] = table(readme, rows)
    return tables, errors


def splice(text: str, block: str) -> str:
    a = text.index(BEGIN)
    b = text.index(END, a) + len(END)
    return text[:a] + block + text[b:]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    mode = ap.add_mutually_exclusive_group()
    mode.add_argument("--check", action="store_true",
                      help="exit 1 when a README's (or LAB.md's) table is stale or a step is missing")
    mode.add_argument("--print", action="store_true", help="print the tables, write nothing")
    ap.add_argument("readmes", nargs="*",
                    help="write only these READMEs or LAB.mds (default: every one with the markers)")
    args = ap.parse_args()
    only = {(Path.cwd() / r).resolve() for r in args.readmes}

    tables, errors = build()
    stale = []
    for readme, block in tables.items():
        text = readme.read_text(encoding="utf-8")
        new = splice(text, block)
        if args.print:
            print(f"## {rel(readme)}\n{block}\n")
        elif new != text and (not only or readme.resolve() in only):
            if args.check:
                stale.append(rel(readme))
            else:
                readme.write_text(new, encoding="utf-8")
                print(f"step_diffs: wrote {rel(readme)}")
    for n in notes:
        print(f"step_diffs: note: {n}", file=sys.stderr)
    for e in errors:
        print(f"step_diffs: {e}", file=sys.stderr)
    for s in stale:
        print(f"step_diffs: {s}: the step-diff table is stale (run python3 scripts/step_diffs.py)", file=sys.stderr)
    if args.check and not errors and not stale:
        print(f"step_diffs: {len(tables)} tables up to date ({', '.join(sorted(rel(t) for t in tables))})")
    return 1 if errors or stale else 0


if __name__ == "__main__":
    sys.exit(main())
