#!/usr/bin/env python3
"""The study site: Doxygen over the code and the chapter READMEs, plus generated pages.

    python3 docs/site.py build --out BUILD/docs [--bench-dir BUILD/bench] [--mathjax DIR]
    python3 docs/site.py check --out BUILD/docs        (headless Chromium; see check_site.py)

`build` writes, before running Doxygen:
  pages/mainpage.md      the reading path: chapter order, each chapter's main steps,
                         prerequisites, reading time (each chapter's from its README.md's
                         words), and the total
  pages/diff_*.md        one page per step diff, from the chain of scripts/step_diffs.py:
                         every step against its predecessor, each chapter's first step
                         against the previous chapter's last (colored unified diff, file
                         names, line numbers)
  pages/diffs.md         the index of those pages
  lab/chNN_lab.md        a chapter's lab page (chapter 05: steps/lab/, the tuning experiments
                         beside its main path): its LAB.md with its own reading time and the
                         lab steps' diffs, labelled chNN_lab; Doxygen reads LAB.md through
                         `site.py lab-filter`, which hands it this text. Linked from the
                         chapter's page, not on the reading path
  pages/plots.md         the measured plots (bench's recorded PNGs, or BUILD/bench/*.png)
  pages/api.md           the API reference of common/, one line per header
  append/chNN.md         the figures and diffs of chapter NN, inserted into its page by
                         md_math_filter.pl before its "Exercises" section
  images/                the diagrams (Graphviz, docs/diagrams/*.dot) and the generated
                         SVG pictures (docs/figures.py)
and then html/ with Doxygen (warnings are errors: warnings.log must stay empty), and
site.json, the list of pages `check` expects.
"""
import argparse
import difflib
import glob
import html
import json
import os
import re
import shutil
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, os.path.join(ROOT, 'scripts'))

# Which chapter a reader should have read first, and why (the reading path).
PREREQUISITES = {
    '01': ([], 'C++ and the CUDA programming model (grids, blocks, warps, shared memory)'),
    '02': (['01'], 'the safe softmax and the three-kernel pipeline'),
    '03': (['02'], 'the (m, l) state and its merge'),
    '04': (['03'], 'FA1\'s tiling and its backward'),
    '05': (['04'], 'FA2\'s loop order, mma.sync and cp.async; a Hopper GPU to run the kernels'),
    '06': (['04'], 'FA2\'s loop order; chapter 05 for the Hopper variants'),
    '07': (['02', '04'], 'the merge (split-K) and FA2\'s kernels'),
}

# Pictures per chapter: (file in images/, caption). The .dot files are rendered by Graphviz,
# the .svg files are written by docs/figures.py.
FIGURES = {
    '02': [('merge_tree.svg', 'The merge is associative and commutative with the empty set as its identity, '
                              'so the blocks of a row combine in any order or as a tree.', r'^## The merge')],
    '03': [('loop_order.svg', 'Loop orders: FA1 keeps the K/V blocks outside and streams every Q block '
                              'through them; FA2 (chapter 04) turns the loops around.', r"^## What FA1's loop order"),
           ('warp_ownership.svg', 'Which warp owns what: FA1 splits K/V across warps and reduces partial outputs; '
                                  'FA2 splits Q.', r'^## The kernels')],
    '04': [('loop_order.svg', 'Loop orders of FA1 and FA2: one thread block per Q block, K/V streamed inside.',
            r'^## The three changes'),
           ('warp_ownership.svg', 'Split-K (FA1) against split-Q (FA2): no inter-warp reduction of O in FA2.',
            r'^### Who owns what')],
    '05': [('producer_consumer.svg', 'Warp specialisation: the producer issues TMA copies, the consumers wait on '
                                     'full[s] and release empty[s].', r'^## The producer/consumer'),
           ('pingpong.svg', 'Pingpong: two consumer warpgroups alternate GEMMs and softmax on named barriers.',
            r'^## Pingpong')],
    '07': [('page_table.svg', 'Block tables map logical blocks to pages of one pool; a fork shares pages '
                              'and copies the last one on write.', r'^## 2\. Pages'),
           ('radix_tree.svg', 'A radix tree over token ids: shared prefixes are stored once; unreferenced '
                              'leaves are evicted first.', r'^## 4\. RadixAttention')],
}
# Each picture goes at the end of the section whose heading matches its pattern (md_math_filter.pl
# places it); one whose section is not found goes to a "Pictures" section before the exercises.

WORDS_PER_MINUTE = 200        # prose
CODE_LINES_PER_MINUTE = 10    # code blocks, tables and formulas are read slowly


def say(*a):
    print(*a, flush=True)


def die(msg):
    print('docs: ' + msg, file=sys.stderr, flush=True)
    sys.exit(1)


def write(path, text):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, 'w', encoding='utf-8') as fh:
        fh.write(text)


# ----------------------------------------------------------------------------- chapters

def reading_time(text):
    """(minutes, words of prose) of a Markdown text: WORDS_PER_MINUTE words of prose a minute,
    CODE_LINES_PER_MINUTE lines of code, tables or formulas, rounded to 5 minutes (at least 5)."""
    prose, slow = 0, 0
    in_code = False
    for line in text.split('\n'):
        if line.strip().startswith('```'):
            in_code = not in_code
            continue
        if in_code or line.startswith('|') or line.strip().startswith('$$'):
            slow += 1
        else:
            prose += len(re.findall(r'\w+', line))
    return max(5, int(round((prose / WORDS_PER_MINUTE + slow / CODE_LINES_PER_MINUTE) / 5.0)) * 5), prose


def page_title(text, fallback):
    m = re.search(r'^# (.+)$', text, re.M)
    return re.sub(r'\s*\{#[^}]*\}\s*$', '', m.group(1)) if m else fallback


LAB_DOC = 'LAB.md'   # a chapter's lab, beside its README (chapter 05: the steps in steps/lab/)


def chapters():
    """[{nn, dir, readme, title, minutes, exercises, lab}] in chapter order. minutes: the reading
    path's time for the chapter, from its README.md; lab: None, or {doc, title, minutes, words,
    label} for a chapter with a LAB.md (off the reading path: its own time)."""
    out = []
    for d in sorted(glob.glob(os.path.join(ROOT, 'chapters', '[0-9][0-9]_*'))):
        nn = os.path.basename(d)[:2]
        readme = os.path.join(d, 'README.md')
        if not os.path.isfile(readme):
            continue
        with open(readme, encoding='utf-8') as fh:
            text = fh.read()
        title = page_title(text, os.path.basename(d))
        title = re.sub(r'^Chapter \d\d\s*[—:-]\s*', '', title)
        title = title[:1].upper() + title[1:]
        minutes, prose = reading_time(text)
        exercises = sorted(set(re.findall(r'\bch%s\.(\d+)' % nn, ' '.join(
            open(f, encoding='utf-8', errors='replace').read() for f in source_files(d)))), key=int)
        lab = None
        lab_doc = os.path.join(d, LAB_DOC)
        if os.path.isfile(lab_doc):
            with open(lab_doc, encoding='utf-8') as fh:
                lab_text = fh.read()
            lab_minutes, lab_words = reading_time(lab_text)
            lab = dict(doc=lab_doc, title=page_title(lab_text, f'Chapter {nn} lab'), minutes=lab_minutes,
                       words=lab_words, label=f'ch{nn}_lab')
        out.append(dict(nn=nn, dir=os.path.relpath(d, ROOT), readme=readme, title=title,
                        minutes=minutes, words=prose, exercises=[f'ch{nn}.{k}' for k in exercises], lab=lab))
    return out


def source_files(d):
    for base, _dirs, files in os.walk(d):
        for f in files:
            if f.endswith(('.cpp', '.hpp', '.cu', '.cuh')):
                path = os.path.join(base, f)
                with open(path, encoding='utf-8', errors='replace') as fh:
                    if '// EXERCISE ch' in fh.read():
                        yield path


# ----------------------------------------------------------------------------- diffs

def chapter_of(path):
    m = re.match(r'chapters/(\d\d)_[^/]+/(?:([^/]+)/)?', path)
    return m.group(1) if m else None


def part_of(path):
    m = re.match(r'chapters/\d\d_[^/]+/([^/]+)/steps/', path)
    return m.group(1) if m else ''


def label_for(dst):
    nn = chapter_of(dst)
    part = part_of(dst)
    stem = os.path.splitext(os.path.basename(dst))[0]
    return re.sub(r'[^A-Za-z0-9_]', '_', f'diff_ch{nn}_{part + "_" if part else ""}{stem}')


def render_diff(src_rel, dst_rel, a_lines, b_lines, context=5):
    """A unified diff as an HTML table: old and new line numbers, one row per line."""
    sm = difflib.SequenceMatcher(None, a_lines, b_lines, autojunk=False)
    rows = []
    added = removed = 0
    for group in sm.get_grouped_opcodes(context):
        i1, j1 = group[0][1] + 1, group[0][3] + 1
        i2, j2 = group[-1][2], group[-1][4]
        rows.append(f'<tr class="hunk"><td class="ln"></td><td class="ln"></td>'
                    f'<td class="code">@@ -{i1},{i2 - i1 + 1} +{j1},{j2 - j1 + 1} @@</td></tr>')
        for tag, a0, a1, b0, b1 in group:
            if tag == 'equal':
                for k in range(a1 - a0):
                    rows.append(f'<tr class="ctx"><td class="ln">{a0 + k + 1}</td><td class="ln">{b0 + k + 1}</td>'
                                f'<td class="code"> {html.escape(a_lines[a0 + k])}</td></tr>')
                continue
            for k in range(a0, a1):
                removed += 1
                rows.append(f'<tr class="del"><td class="ln">{k + 1}</td><td class="ln"></td>'
                            f'<td class="code">-{html.escape(a_lines[k])}</td></tr>')
            for k in range(b0, b1):
                added += 1
                rows.append(f'<tr class="add"><td class="ln"></td><td class="ln">{k + 1}</td>'
                            f'<td class="code">+{html.escape(b_lines[k])}</td></tr>')
    head = (f'<div class="study-diff"><div class="files"><span class="old">--- {html.escape(src_rel)}</span><br/>'
            f'<span class="new">+++ {html.escape(dst_rel)}</span></div>')
    if not rows:
        return head + '<p>The two files are identical.</p></div>', 0, 0
    return head + '<table class="difftable">\n' + '\n'.join(rows) + '\n</table></div>', added, removed


def diff_chain():
    """[(key, [(src_rel or None, dst_rel, note)])] from scripts/step_diffs.py's chain, and the module."""
    try:
        import step_diffs
    except ImportError as e:
        die(f'scripts/step_diffs.py is needed for the diff pages ({e})')
    series = []
    errors = []
    for key in step_diffs.all_series():
        try:
            rows = step_diffs.series_rows(key)
        except step_diffs.ChainError as e:
            errors.append(str(e))
            continue
        series.append((key, [(os.path.relpath(r.src, ROOT) if r.src else None,
                              os.path.relpath(r.dst, ROOT), r.note) for r in rows]))
    for e in errors:   # scripts/step_diffs.py --check fails on these in CI; the site shows the rest
        print(f'docs: warning: no diff pages for a broken series: {e}', file=sys.stderr, flush=True)
    return series, step_diffs


def is_lab_series(step_diffs, key):
    return bool(getattr(step_diffs, 'is_lab', None)) and step_diffs.is_lab(key)


def diff_pages(pages, chaps):
    """The diff pages and their index. Returns ({nn: main-path rows}, {nn: lab rows}, manifest): a row
    is (src, dst, note, label, plus, minus); a lab series (steps/lab/) goes to the chapter's lab page,
    every other one to the chapter's page and the reading path."""
    series, step_diffs = diff_chain()
    titles = {c['nn']: c['title'] for c in chaps}
    labs = {c['nn']: c['lab'] for c in chaps if c.get('lab')}
    by_chapter, by_lab = {}, {}
    manifest = []
    for key, rows in series:
        lab = is_lab_series(step_diffs, key)
        for src, dst, note in rows:
            nn = chapter_of(dst)
            label = label_for(dst)
            target = by_lab if lab else by_chapter
            if src is None:
                target.setdefault(nn, []).append((None, dst, note, label, 0, 0))
                continue
            with open(os.path.join(ROOT, src), encoding='utf-8') as fh:
                a = fh.read().split('\n')
            with open(os.path.join(ROOT, dst), encoding='utf-8') as fh:
                b = fh.read().split('\n')
            body, added, removed = render_diff(src, dst, a, b)
            from pathlib import Path
            plus, minus = step_diffs.code_diff(Path(ROOT, src), Path(ROOT, dst))
            cross = chapter_of(src) != nn
            prev_ch = f'\\ref ch{chapter_of(src)} "chapter {chapter_of(src)}"' if chapter_of(src) in titles \
                else f'chapter {chapter_of(src)}'
            this_ch = f'\\ref ch{nn} "chapter {nn}: {titles[nn]}"' if nn in titles else f'chapter {nn}'
            if lab and nn in labs:
                this_ch = f'\\ref {labs[nn]["label"]} "chapter {nn}\'s lab"'
            part = f' ({part_of(dst)})' if part_of(dst) else (' (lab)' if lab else '')
            kind = (f'The first step of chapter {nn}{part} against the kernel of {prev_ch} it derives from') if cross \
                else ('A lab step against the step its header names as its parent' if lab
                      else 'A branch: this step derives from an earlier step, not from the one listed before it'
                      if note == 'branch' else 'This step against its predecessor')
            text = (f'# Chapter {nn}{part}: {os.path.basename(src)} → {os.path.basename(dst)} {{#{label}}}\n\n'
                    f'Back to {this_ch} · \\ref diffs "all step diffs"\n\n'
                    f'{kind}. Every line of the two files: {added} added, {removed} removed; counting code only '
                    f'(comments and blank lines dropped, as `scripts/step_diffs.py` does): +{plus} −{minus}. '
                    f'The same diff in a terminal: `diff -u {src} {dst}`.\n\n'
                    '\\htmlonly\n' + body + '\n\\endhtmlonly\n')
            write(os.path.join(pages, f'{label}.md'), text)
            target.setdefault(nn, []).append((src, dst, note, label, plus, minus))
            manifest.append(dict(label=label, html=f'{label}.html', src=src, dst=dst, chapter=nn, cross=cross,
                                 lab=lab))
    # The index page.
    lines = ['# Step diffs {#diffs}', '',
             'Every step of a chapter is a whole file whose diff against its predecessor is one idea; a '
             'chapter\'s first step derives from the previous chapter\'s last, so the diff across chapters is '
             'the lesson too. The chain (which file derives from which) is the one of `scripts/step_diffs.py`, '
             'which also keeps the tables in the chapter READMEs up to date.', '']
    for nn in sorted(set(by_chapter) | set(by_lab)):
        name = f'\\ref ch{nn} "Chapter {nn}: {titles[nn]}"' if nn in titles else f'Chapter {nn}'
        for rows, lab in ((by_chapter.get(nn), False), (by_lab.get(nn), True)):
            if not rows:
                continue
            if lab:
                page = f'\\ref {labs[nn]["label"]} "its page"' if nn in labs else 'its LAB.md'
                lines += [f'## Chapter {nn}\'s lab', '', f'The lab\'s steps (off the reading path; {page}), each '
                          'against the step its header names.', '']
            else:
                lines += [f'## Chapter {nn}: {titles.get(nn, "")}', '',
                          f'The chapter page: {name}.' if nn in titles else '', '']
            lines += ['| from → to | code lines | page |', '|---|---|---|']
            for src, dst, note, label, plus, minus in rows:
                if src is None:
                    lines.append(f'| → `{os.path.basename(dst)}` | {note} | |')
                else:
                    lines.append(f'| `{src}` → `{os.path.basename(dst)}`{" (" + note + ")" if note else ""} '
                                 f'| +{plus} −{minus} | \\subpage {label} "diff" |')
            lines.append('')
    write(os.path.join(pages, 'diffs.md'), '\n'.join(lines) + '\n')
    return by_chapter, by_lab, manifest


# ----------------------------------------------------------------------------- pictures and plots

def pictures(out):
    images = os.path.join(out, 'images')
    os.makedirs(images, exist_ok=True)
    subprocess.run([sys.executable, os.path.join(HERE, 'figures.py'), images], check=True)
    dot = shutil.which('dot')
    if not dot:
        die('Graphviz (dot) is needed for the diagrams: apt-get install graphviz')
    for f in sorted(glob.glob(os.path.join(HERE, 'diagrams', '*.dot'))):
        svg = os.path.join(images, os.path.splitext(os.path.basename(f))[0] + '.svg')
        subprocess.run([dot, '-Tsvg', f, '-o', svg], check=True)
    return images


def plots(out, pages, bench_dir):
    """The measured plots. First the recorded copies in the repository (PNGs under bench/, with
    the README.md or NAME.md next to them that names the run); where only a recorded
    results.json is committed, its plots are drawn again with bench/bench_plots.py. Then the
    PNGs of this machine's last `./tutorial bench` (BUILD/bench/), if any."""
    dst = os.path.join(out, 'images', 'plots')
    os.makedirs(dst, exist_ok=True)
    sections = []
    bench = os.path.join(ROOT, 'bench')
    def not_test(p):   # bench's own test fixtures are not a measured run
        return 'testdata' not in os.path.relpath(p, bench).split(os.sep)
    recorded = sorted(p for p in glob.glob(os.path.join(bench, '**', '*.png'), recursive=True) if not_test(p))
    if not recorded:
        for res in sorted(r for r in glob.glob(os.path.join(bench, '**', 'results.json'), recursive=True) if not_test(r)):
            tmp = os.path.join(out, 'recorded_plots', os.path.relpath(os.path.dirname(res), bench))
            os.makedirs(tmp, exist_ok=True)
            r = subprocess.run([sys.executable, os.path.join(bench, 'bench_plots.py'), res, tmp],
                               capture_output=True, text=True)
            if r.returncode != 0:
                print(f'docs: warning: bench_plots.py could not draw {res}: {r.stderr.strip()[-300:]}',
                      file=sys.stderr)
            for png in sorted(glob.glob(os.path.join(tmp, '*.png'))):
                recorded.append(png)
                src_md = os.path.join(os.path.dirname(res), 'README.md')
                if os.path.exists(src_md) and not os.path.exists(os.path.join(tmp, 'README.md')):
                    shutil.copy2(src_md, os.path.join(tmp, 'README.md'))
    if recorded:
        sections.append(('The recorded run (bench/recorded/)', recorded))
    if bench_dir and os.path.isdir(bench_dir):
        own = sorted(glob.glob(os.path.join(bench_dir, '*.png')))
        if own:
            sections.append(('This machine\'s last run (./tutorial bench)', own))
    lines = ['# Measured plots {#plots}', '',
             'Plotted by `./tutorial bench` (bench/lineage.py, bench/bench_plots.py): every chapter\'s kernels '
             'next to the peers and the GPU\'s ceilings, measured in one run.', '']
    names = []
    if not sections:
        lines += ['No measured plots are recorded yet. `./tutorial bench` writes them to `build/bench/` on a '
                  'machine with a GPU, and `./tutorial docs` then shows them here.', '']
    for title, pngs in sections:
        lines += [f'## {title}', '']
        seen_dirs = set()
        for p in pngs:
            d = os.path.dirname(p)
            if d not in seen_dirs:
                # The run's provenance: a README.md next to the plots, or the "Run:" and
                # "Ceilings" lines of the results.md that bench writes with them.
                readme = os.path.join(d, 'README.md')
                results = os.path.join(d, 'results.md')
                if os.path.exists(readme):
                    lines += [open(readme, encoding='utf-8').read().strip(), '']
                elif os.path.exists(results):
                    for para in open(results, encoding='utf-8').read().split('\n\n'):
                        if para.startswith(('Run:', 'Ceilings')):
                            lines += [para.strip(), '']
                    if d.startswith(ROOT):
                        lines += [f'Every table of this run: `{os.path.relpath(results, ROOT)}` '
                                  '(in the page list).', '']
            seen_dirs.add(d)
            name = re.sub(r'[^A-Za-z0-9_.-]', '_', f'{len(names):02d}_{os.path.basename(p)}')
            shutil.copy2(p, os.path.join(dst, name))
            names.append(name)
            caption = os.path.splitext(os.path.basename(p))[0].replace('_', ' ')
            cap_md = os.path.splitext(p)[0] + '.md'
            lines += [f'### {caption}', '']
            if os.path.exists(cap_md):
                lines += [open(cap_md, encoding='utf-8').read().strip(), '']
            lines += [f'\\image html plots/{name} "{caption}" width=900px', '']
    write(os.path.join(pages, 'plots.md'), '\n'.join(lines) + '\n')
    return names


# ----------------------------------------------------------------------------- generated pages

def diff_list(rows):
    lines = []
    for src, dst, note, label, plus, minus in rows:
        if src is None:
            lines.append(f'- `{os.path.basename(dst)}`: {note}')
        else:
            lines.append(f'- \\ref {label} "{os.path.basename(src)} → {os.path.basename(dst)}" '
                         f'(+{plus} −{minus} code lines{", " + note if note else ""})')
    return lines


def chapter_appendix(append_dir, chaps, diffs_by_chapter):
    for c in chaps:
        nn = c['nn']
        lines = []
        figs = FIGURES.get(nn, [])
        for f, cap, at in figs:
            lines += [f'<!-- at: {at} -->', f'\\image html {f} "{cap}"', '', '<!-- end -->']
        if figs:
            lines += ['<!-- pictures-left -->', '']
        rows = diffs_by_chapter.get(nn, [])
        if rows:
            lines += ['## Step diffs', '',
                      'Each step against the one it derives from, rendered by the study site '
                      '(\\ref diffs "all chapters"):', '']
            lines += diff_list(rows)
            lines.append('')
        lab = c.get('lab')
        if lab:
            lines += ['## The lab', '',
                      f'Off the reading path: \\subpage {lab["label"]} "{lab["title"]}" ({lab["minutes"]} min), '
                      'the experiments beside this chapter\'s main path, each step against its parent, with '
                      'its outcome and the diffs.', '']
        if lines:
            write(os.path.join(append_dir, f'ch{nn}.md'), '\n'.join(lines) + '\n')


def step_name(dst):
    """A step's short name on the reading path: "v1", "b5", or the file's stem ("final_fp8")."""
    stem = os.path.splitext(os.path.basename(dst))[0]
    m = re.match(r'^([vb]\d+[a-z]?)_', stem)
    return m.group(1) if m else stem


def main_steps(rows):
    """The main path's steps of a chapter as links to their diff pages: "v1 v2 ... final"."""
    out = []
    for src, dst, note, label, plus, minus in rows:
        name = step_name(dst)
        out.append(f'\\ref {label} "{name}"' if src is not None else name)
    return ' '.join(out) or '—'


def mainpage(pages, chaps, diffs_by_chapter=None):
    have = {c['nn'] for c in chaps}
    total = sum(c['minutes'] for c in chaps)
    diffs_by_chapter = diffs_by_chapter or {}
    labs = [c for c in chaps if c.get('lab')]
    lines = ['# The attention-kernel lineage: the reading path', '',
             'Attention rebuilt one step at a time, from the three-kernel textbook version to the kernels that '
             'run today\'s models. Read the chapters in this order; each one takes the previous one\'s code, makes '
             'one idea real, proves it correct against an fp64 reference and measures what it bought.', '',
             '| # | chapter | its main steps (each a diff) | read first | you need | reading time | exercises |',
             '|---|---|---|---|---|---|---|']
    for c in chaps:
        pre, need = PREREQUISITES.get(c['nn'], ([], ''))
        pre_s = ', '.join(f'\\ref ch{p} "{p}"' if p in have else p for p in pre) or '—'
        lines.append(f'| {c["nn"]} | \\subpage ch{c["nn"]} "{c["title"]}" | '
                     f'{main_steps(diffs_by_chapter.get(c["nn"], []))} | {pre_s} | {need} | '
                     f'{c["minutes"]} min | {len(c["exercises"])} |')
    lines += ['', f'**Reading path: {total} minutes in all** ({len(chaps)} chapters). Reading time is estimated '
              f'from each README: {WORDS_PER_MINUTE} words of prose a minute, {CODE_LINES_PER_MINUTE} lines of '
              'code, tables or formulas a minute (rounded to 5 minutes). Running the binaries and doing the '
              'exercises takes longer.', '']
    if labs:
        lines += ['Off the path: ' + '; '.join(
            f'\\ref {c["lab"]["label"]} "chapter {c["nn"]}\'s lab" ({c["lab"]["minutes"]} min, from its LAB.md), '
            'the tuning experiments behind its final kernels' for c in labs) +
            '. Its time is not in the total above.', '']
    missing = [nn for nn in PREREQUISITES if nn not in have]
    if missing:
        lines += ['Not written yet: ' + ', '.join(f'chapter {nn}' for nn in missing) + '.', '']
    lines += ['## How to study', '',
              '1. Read a chapter page, then run its binary: `build/bin/chNN_name --help` (every chapter takes the '
              'same options and prints the same table).',
              '2. Read the step diffs linked from the chapter page: each is one idea.',
              '3. Do the exercises in your own copy of the tree: `./tutorial workbook` makes it (every exercise a '
              'stub), `./tutorial test --workbook` says which are not started, failing or solved, and '
              '`./tutorial workbook --reset chNN.k` puts one stub back. The repository keeps its solutions.',
              '4. Close with the \\ref cheatsheet "cheat sheet": which kernel when, what each costs, and the '
              'common mistakes.', '',
              '## Also in this site', '',
              '- \\subpage diffs "Step diffs": every step against its predecessor, and across chapters.',
              '- \\subpage plots "Measured plots" of the lineage next to its peers.',
              '- \\subpage cheatsheet "Which kernel when", the cheat sheet.',
              '- \\subpage api "API reference of common/": the problem, the reference, the acceptance rule, '
              'the online-softmax state, the traffic model, the CLI and the CUDA primitives.',
              '- The project\'s README and DEVELOPERS.md (conventions, the acceptance rule) are in the '
              'page list; each chapter\'s lab (LAB.md: its experiments, predictions and outcomes) is linked '
              'from its chapter.', '']
    write(os.path.join(pages, 'mainpage.md'), '\n'.join(lines) + '\n')


def lab_page(out, chap, lab_rows):
    """OUT/lab/chNN_lab.md: the page Doxygen shows for the chapter's LAB.md (labelled chNN_lab, linked
    from the chapter's page, not on the reading path): LAB.md with its reading time under its title
    and the lab steps' diff pages at its end. Doxygen reads LAB.md itself (its links stay relative
    to it, and the README's links to LAB.md resolve); `site.py lab-filter`, its input filter, hands
    Doxygen this text instead of the file's."""
    lab = chap['lab']
    with open(lab['doc'], encoding='utf-8') as fh:
        text = fh.read()
    head = re.search(r'^# (.+)$', text, re.M)
    note = (f'Back to \\ref ch{chap["nn"]} "chapter {chap["nn"]}: {chap["title"]}". Off the reading path: '
            f'reading time {lab["minutes"]} min ({lab["words"]} words of prose; the chapter itself: '
            f'{chap["minutes"]} min).')
    if head:
        title = re.sub(r'\s*\{#[^}]*\}\s*$', '', head.group(1))
        text = text[:head.start()] + f'# {title} {{#{lab["label"]}}}\n\n{note}\n' + text[head.end():]
    else:
        text = f'# {lab["title"]} {{#{lab["label"]}}}\n\n{note}\n\n' + text
    if lab_rows:
        text = text.rstrip('\n') + '\n\n## The lab steps\' diffs, rendered\n\n' + \
            'Each lab step against the step its header names (\\ref diffs "all step diffs"):\n\n' + \
            '\n'.join(diff_list(lab_rows)) + '\n'
    write(os.path.join(out, 'lab', f'{lab["label"]}.md'), text)


def cmd_lab_filter(out, path):
    """Doxygen's input filter for a chapter's LAB.md: the page lab_page() wrote, with the math of
    md_math_filter.pl (the filter of every other Markdown page)."""
    m = re.search(r'chapters/(\d\d)_[^/]+/' + re.escape(LAB_DOC) + '$', path.replace(os.sep, '/'))
    page = os.path.join(out, 'lab', f'ch{m.group(1)}_lab.md') if m else ''
    src = page if page and os.path.isfile(page) else path
    r = subprocess.run(['perl', os.path.join(HERE, 'md_math_filter.pl'), src], capture_output=True, text=True)
    sys.stdout.write(r.stdout)
    sys.stderr.write(r.stderr)
    return r.returncode


def file_brief(path):
    with open(path, encoding='utf-8', errors='replace') as fh:
        text = fh.read(6000)
    m = re.search(r'[@\\]brief\s+(.+?)(?:\n\s*(?://[/!]|\*)?\s*\n|\n\s*[@\\]|\*/)', text, re.S)
    if not m:
        m = re.search(r'[@\\]file\b[^\n]*\n((?:\s*(?://[/!]|\*)[^\n]*\n){1,3})', text)
    if not m:
        return ''
    s = re.sub(r'\s*(?://[/!<]?|\*)\s*', ' ', m.group(1))
    s = re.sub(r'\s+', ' ', s).strip()
    s = s.split('. ')[0].rstrip('.')
    return s.replace('|', '\\|')


def api_page(pages):
    lines = ['# API reference: common/ {#api}', '',
             'Everything two chapters share is written once, in `common/` (host code, usable without CUDA) and '
             '`common/cuda/` (device primitives; no `asm` outside it). Each header below links to its reference '
             'page; the classes and functions are also in the class and file lists.', '']
    for sub, title in [('common', 'Host side'), ('common/cuda', 'CUDA primitives'),
                       ('common/cuda/hopper', 'Hopper primitives (sm_90a)')]:
        files = sorted(f for f in glob.glob(os.path.join(ROOT, sub, '*'))
                       if f.endswith(('.hpp', '.cuh')) and os.path.isfile(f))
        if not files:
            continue
        lines += [f'## {title}', '', '| header | what it holds |', '|---|---|']
        for f in files:
            rel = os.path.relpath(f, ROOT)
            lines.append(f'| \\ref {rel} "{rel}" | {file_brief(f)} |')
        lines.append('')
    write(os.path.join(pages, 'api.md'), '\n'.join(lines) + '\n')


# ----------------------------------------------------------------------------- build

def copy_chapter_images(html_dir, chaps):
    """A README's own pictures (![...](pictures/x.svg)) keep their relative path in the HTML;
    copy each from the chapter's folder (or one of its parts) next to the page."""
    for c in chaps:
        page = os.path.join(html_dir, f'ch{c["nn"]}.html')
        if not os.path.exists(page):
            continue
        text = open(page, encoding='utf-8').read()
        d = os.path.join(ROOT, c['dir'])
        bases = [d] + sorted(p for p in glob.glob(os.path.join(d, '*')) if os.path.isdir(p))
        for src in re.findall(r'<img[^>]*\bsrc="([^"]+)"', text):
            if re.match(r'^[a-z]+:', src) or os.path.exists(os.path.join(html_dir, src)):
                continue
            for b in bases:
                cand = os.path.normpath(os.path.join(b, src))
                if os.path.isfile(cand) and cand.startswith(ROOT):
                    dst = os.path.normpath(os.path.join(html_dir, src))
                    if dst.startswith(html_dir):
                        os.makedirs(os.path.dirname(dst), exist_ok=True)
                        shutil.copy2(cand, dst)
                    break


def bench_pages():
    """bench/'s own pages (what it runs, the recorded run's tables), which README.md links to."""
    bench = os.path.join(ROOT, 'bench')
    return sorted(p for p in glob.glob(os.path.join(bench, '**', '*.md'), recursive=True)
                  if 'testdata' not in os.path.relpath(p, bench).split(os.sep))


def copy_page_images(html_dir):
    """A Markdown page's pictures (![...](bench/recorded/x.png)) keep their relative path in the
    HTML; copy each one the pages use from the tree next to the pages."""
    bases = [ROOT] + sorted(glob.glob(os.path.join(ROOT, 'chapters', '*'))) + \
        sorted(glob.glob(os.path.join(ROOT, 'chapters', '*', '*'))) + [os.path.join(ROOT, 'bench')]
    for page in glob.glob(os.path.join(html_dir, '*.html')):
        with open(page, encoding='utf-8', errors='replace') as fh:
            text = fh.read()
        if '<img' not in text:
            continue
        changed = False
        for src in set(re.findall(r'<img[^>]*\bsrc="([^"]+)"', text)):
            if re.match(r'^[a-z]+:', src) or os.path.exists(os.path.join(html_dir, src)):
                continue
            for b in bases:
                cand = os.path.normpath(os.path.join(b, src))
                if not (os.path.isfile(cand) and cand.startswith(ROOT)):
                    continue
                dst = os.path.normpath(os.path.join(html_dir, src))
                if not dst.startswith(html_dir):
                    # a chapter README's ../../bench/recorded/x.png: the same file, kept inside the
                    # site under its path from the repository root, and the page pointed at it
                    new_src = os.path.relpath(cand, ROOT)
                    dst = os.path.join(html_dir, new_src)
                    text = text.replace('src="%s"' % src, 'src="%s"' % new_src)
                    changed = True
                os.makedirs(os.path.dirname(dst), exist_ok=True)
                shutil.copy2(cand, dst)
                break
        if changed:
            with open(page, 'w', encoding='utf-8') as fh:
                fh.write(text)


def doxyfile(out, pages, images, append_dir, lab_docs=()):
    """The Doxyfile from Doxyfile.in. A chapter's LAB.md is one more page (lab_docs), read through
    `site.py lab-filter` (its page as lab_page() wrote it), listed before the Markdown filter."""
    readmes = sorted(glob.glob(os.path.join(ROOT, 'chapters', '*', 'README.md')))
    with open(os.path.join(HERE, 'Doxyfile.in'), encoding='utf-8') as fh:
        text = fh.read()
    subst = {
        'DOCS_OUT': out, 'PROJECT_SOURCE_DIR': ROOT, 'DOCS_CHAPTER_READMES': ' '.join(readmes),
        'DOCS_PAGES': pages,
        'DOCS_PAGE_FILES': ' '.join(sorted(glob.glob(os.path.join(pages, '*.md'))) + bench_pages() + list(lab_docs)),
        'DOCS_IMAGES': images, 'DOCS_APPEND': append_dir,
        'DOXYGEN_DOT_FOUND': 'YES' if shutil.which('dot') else 'NO',
    }
    for k, v in subst.items():
        text = text.replace(f'@{k}@', v)
    left = re.findall(r'@[A-Z_]+@', text)
    if left:
        die('Doxyfile.in: unknown ' + ' '.join(sorted(set(left))))
    if lab_docs:  # the first pattern that matches a file names its filter
        lab_filter = f'*/{LAB_DOC}="{sys.executable} {os.path.join(HERE, "site.py")} lab-filter {out}"'
        text, n = re.subn(r'^(FILTER_PATTERNS\s*=\s*)', lambda m: m.group(1) + lab_filter + ' ', text, count=1,
                          flags=re.M)
        if n != 1:
            die('Doxyfile.in: no FILTER_PATTERNS line for the lab pages\' filter')
    write(os.path.join(out, 'Doxyfile'), text)
    return os.path.join(out, 'Doxyfile')


def cmd_build(args):
    out = os.path.abspath(args.out)
    pages = os.path.join(out, 'pages')
    append_dir = os.path.join(out, 'append')
    for d in (pages, append_dir, os.path.join(out, 'html')):
        shutil.rmtree(d, ignore_errors=True)
        os.makedirs(d)
    chaps = chapters()
    images = pictures(out)
    diffs_by_chapter, diffs_by_lab, diff_manifest = diff_pages(pages, chaps)
    plot_files = plots(out, pages, args.bench_dir)
    chapter_appendix(append_dir, chaps, diffs_by_chapter)
    shutil.rmtree(os.path.join(out, 'lab'), ignore_errors=True)
    for c in chaps:
        if c.get('lab'):
            lab_page(out, c, diffs_by_lab.get(c['nn'], []))
    mainpage(pages, chaps, diffs_by_chapter)
    api_page(pages)
    shutil.copy2(os.path.join(HERE, 'cheatsheet.md'), os.path.join(pages, 'cheatsheet.md'))
    doxy = doxyfile(out, pages, images, append_dir, [c['lab']['doc'] for c in chaps if c.get('lab')])
    mathjax = os.path.join(out, 'html', 'mathjax')
    if os.path.lexists(mathjax):
        os.remove(mathjax)
    if not os.path.isdir(args.mathjax):
        die(f'MathJax not found at {args.mathjax}: apt-get install libjs-mathjax')
    os.symlink(args.mathjax, mathjax)
    log = os.path.join(out, 'warnings.log')
    if os.path.exists(log):
        os.remove(log)
    r = subprocess.run([args.doxygen, doxy], cwd=ROOT)
    copy_chapter_images(os.path.join(out, 'html'), chaps)
    copy_page_images(os.path.join(out, 'html'))
    manifest = dict(
        main='index.html',
        chapters=[dict(nn=c['nn'], html=f'ch{c["nn"]}.html', title=c['title'], minutes=c['minutes'],
                       main_steps=[os.path.basename(d[1]) for d in diffs_by_chapter.get(c['nn'], [])],
                       formulas=open(c['readme'], encoding='utf-8').read().count('$') > 0) for c in chaps],
        labs=[dict(nn=c['nn'], html=f'{c["lab"]["label"]}.html', title=c['lab']['title'],
                   minutes=c['lab']['minutes'], chapter_html=f'ch{c["nn"]}.html',
                   diffs=[f'{d[3]}.html' for d in diffs_by_lab.get(c['nn'], []) if d[0] is not None])
              for c in chaps if c.get('lab')],
        reading_minutes=sum(c['minutes'] for c in chaps),
        diffs=diff_manifest, diff_index='diffs.html', plots='plots.html', plot_files=plot_files,
        cheatsheet='cheatsheet.html', api='api.html')
    write(os.path.join(out, 'site.json'), json.dumps(manifest, indent=1))
    warnings = open(log).read() if os.path.exists(log) else ''
    if warnings.strip():
        sys.stderr.write(warnings)
        die(f'Doxygen reported warnings ({log})')
    if r.returncode != 0:
        die('Doxygen failed')
    say(f'docs: {out}/html/index.html ({len(chaps)} chapters, {len(manifest["labs"])} lab page(s), '
        f'{len(diff_manifest)} diff pages, {len(plot_files)} plots, 0 Doxygen warnings)')


def main():
    ap = argparse.ArgumentParser()
    sub = ap.add_subparsers(dest='cmd', required=True)
    b = sub.add_parser('build')
    b.add_argument('--out', required=True)
    b.add_argument('--bench-dir', default='')
    b.add_argument('--mathjax', default='/usr/share/javascript/mathjax')
    b.add_argument('--doxygen', default=shutil.which('doxygen') or 'doxygen')
    c = sub.add_parser('check')
    c.add_argument('--out', required=True)
    c.add_argument('--chromium', default='')
    f = sub.add_parser('lab-filter', help='Doxygen\'s input filter for a LAB.md (the Doxyfile calls it)')
    f.add_argument('out')
    f.add_argument('file')
    args = ap.parse_args()
    if args.cmd == 'lab-filter':
        sys.exit(cmd_lab_filter(args.out, args.file))
    if args.cmd == 'build':
        cmd_build(args)
    else:
        import check_site
        sys.exit(check_site.check(os.path.abspath(args.out), args.chromium))


if __name__ == '__main__':
    main()
