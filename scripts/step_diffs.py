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
    of one, derived from what CROSS says);
  * a step derives from the step before it, unless its header says otherwise with
    "What changes from v<N>" (a branch: chapter 02's v3 and v4 both derive from v2);
  * a series' first step derives from another chapter's kernel, as the small table
    CROSS below says. It names a folder's last step ("the last step of chapter 04"),
    not a file name, so renaming steps breaks nothing.

Only code is counted: comments, blank lines and trailing whitespace are removed
from both files before the line diff, so a reworded comment costs nothing and a
re-indented line counts as changed. The table goes between the markers

    <!-- step-diffs:begin -->
    <!-- step-diffs:end -->

of the nearest README.md above the series (the chapter's own).
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
STEP_RE = re.compile(r"^v(\d+)([a-z]?)_.*\.cu$")
FROM_RE = re.compile(r"What changes from v(\d+)([a-z]?)\b")


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
    "chapters/05_fa3_hopper/steps": Last("chapters/04_fa2/steps"),
    # chapter 06's mask kernels: each is one earlier kernel with a mask policy put in
    "chapters/06_variants/masks/steps/ampere_mask.cu": Last("chapters/04_fa2/steps"),
    # (chapter 05's v8: its later bf16 steps came after chapter 06 was derived from it)
    "chapters/06_variants/masks/steps/hopper_mask.cu": File("chapters/05_fa3_hopper/steps/v8_head_dims.cu"),
    "chapters/06_variants/masks/steps/backward_mask.cu": File("chapters/04_fa2/backward.cu"),
    # the sm90a mask steps v1, v2, ... improve hopper_mask.cu
    "chapters/06_variants/masks/steps": File("chapters/06_variants/masks/steps/hopper_mask.cu"),
    # chapter 06's packed GQA for non-Hopper GPUs: chapter 04's last step with the packed view
    "chapters/06_variants/gqa_mla/steps/ampere_packed.cu": Last("chapters/04_fa2/steps"),
    # chapter 05's backward: b1 is chapter 04's backward on Hopper's machinery, b2 warp-specialises b1
    "chapters/05_fa3_hopper/steps/b1_wgmma_backward.cu": File("chapters/04_fa2/backward.cu"),
    "chapters/05_fa3_hopper/steps/b2_warp_specialized.cu": File("chapters/05_fa3_hopper/steps/b1_wgmma_backward.cu"),
    "chapters/05_fa3_hopper/steps/b3_dq_fragment_order.cu": File("chapters/05_fa3_hopper/steps/b2_warp_specialized.cu"),
    "chapters/05_fa3_hopper/steps/b4_no_spills.cu": File("chapters/05_fa3_hopper/steps/b3_dq_fragment_order.cu"),
    "chapters/05_fa3_hopper/steps/b5_dq_writer.cu": File("chapters/05_fa3_hopper/steps/b4_no_spills.cu"),
    "chapters/05_fa3_hopper/steps/b6_deterministic_walk.cu": File("chapters/05_fa3_hopper/steps/b5_dq_writer.cu"),
    "chapters/05_fa3_hopper/steps/b7_dq_split_by_keys.cu": File("chapters/05_fa3_hopper/steps/b6_deterministic_walk.cu"),
    "chapters/05_fa3_hopper/steps/b8_named_barrier_release.cu": File("chapters/05_fa3_hopper/steps/b6_deterministic_walk.cu"),
    "chapters/05_fa3_hopper/steps/b9_two_ds_buffers.cu": File("chapters/05_fa3_hopper/steps/b8_named_barrier_release.cu"),
    "chapters/05_fa3_hopper/steps/b10_consumer_offset.cu": File("chapters/05_fa3_hopper/steps/b9_two_ds_buffers.cu"),
    "chapters/05_fa3_hopper/steps/b11_longest_walks_first.cu": File("chapters/05_fa3_hopper/steps/b10_consumer_offset.cu"),
    "chapters/05_fa3_hopper/steps/b12_pairs_of_query_blocks.cu": File("chapters/05_fa3_hopper/steps/b11_longest_walks_first.cu"),
    "chapters/05_fa3_hopper/steps/b13_eighty_queries.cu": File("chapters/05_fa3_hopper/steps/b11_longest_walks_first.cu"),
    "chapters/05_fa3_hopper/steps/b14_ds_by_queries.cu": File("chapters/05_fa3_hopper/steps/b13_eighty_queries.cu"),
    "chapters/05_fa3_hopper/steps/b15_scores_ahead.cu": File("chapters/05_fa3_hopper/steps/b13_eighty_queries.cu"),
    "chapters/07_paged_radix/steps": New("a decode (one query row per head), built on common/cuda/, not on an earlier loop"),
}


class ChainError(Exception):
    pass


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


def resolve(pred: Last | File | New) -> Path | None:
    if isinstance(pred, New):
        return None
    if isinstance(pred, File):
        p = ROOT / pred.path
        if not p.is_file():
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


def series_rows(key: str) -> list[Row]:
    """The diffs of one series: its first step against its predecessor, then step by step."""
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
        rows.append(Row(resolve(pred), files[0], note))
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
    (a kernel of its own, derived as CROSS says), and every file CROSS names as a key."""
    keys = set()
    for folder in (ROOT / "chapters").glob("**/steps"):
        if not folder.is_dir():
            continue
        if steps_of(folder):
            keys.add(rel(folder))
        keys |= {rel(p) for p in folder.glob("*.cu") if not STEP_RE.match(p.name)}
    keys |= {k for k in CROSS if (ROOT / k).is_file()}
    # numbers in names compare as numbers: b9 before b10
    return sorted(keys, key=lambda k: [int(x) if x.isdigit() else x for x in re.split(r"(\d+)", k)])


def readme_of(key: str) -> Path | None:
    """The nearest README.md above a series, up to its chapter folder."""
    p = (ROOT / key).parent
    chapters = ROOT / "chapters"
    while p != chapters and p != ROOT:
        for name in DOCS:
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
        return p.name if p.parent in (here, here / "steps") else r(p).lstrip("./")

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
    for key in all_series():
        readme = readme_of(key)
        if readme is None:
            continue
        try:
            per_readme.setdefault(readme, []).extend(series_rows(key))
        except ChainError as e:
            errors.append(str(e))
    tables: dict[Path, str] = {}
    for readme in sorted(d for name in DOCS for d in (ROOT / "chapters").glob("**/" + name)):
        text = readme.read_text(encoding="utf-8")
        if BEGIN not in text:
            continue
        if END not in text or text.index(END) < text.index(BEGIN):
            errors.append(f"{rel(readme)}: {BEGIN} without a following {END}")
            continue
        rows = per_readme.get(readme)
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
    mode.add_argument("--check", action="store_true", help="exit 1 when a README's table is stale or a step is missing")
    mode.add_argument("--print", action="store_true", help="print the tables, write nothing")
    ap.add_argument("readmes", nargs="*", help="write only these READMEs (default: every README with the markers)")
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
    for e in errors:
        print(f"step_diffs: {e}", file=sys.stderr)
    for s in stale:
        print(f"step_diffs: {s}: the step-diff table is stale (run python3 scripts/step_diffs.py)", file=sys.stderr)
    if args.check and not errors and not stale:
        print(f"step_diffs: {len(tables)} README tables up to date")
    return 1 if errors or stale else 0


if __name__ == "__main__":
    sys.exit(main())
