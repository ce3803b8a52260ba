#!/usr/bin/env python3
"""PNG plots of a results.json (matplotlib; Debian's python3-matplotlib).

    /usr/bin/python3 bench/bench_plots.py RESULTS_JSON OUT_DIR     prints the paths it wrote

* tflops_chNN_fwd.png / _bwd.png: TFLOP/s against N, a panel per head dim and mask, one
  line per step of the chapter and one per peer (log scale: the steps span two decades);
  chapter 05's are its main path and final kernels, and with the lab asked for (a run of
  `./tutorial bench --lab`, or draw_all(..., lab=True)) tflops_ch05_lab_fwd.png / _bwd.png
  hold its lab steps;
* tflops_lineage_fwd.png: the best kernel of every chapter at each shape (chapter 05: its
  final kernel where the run has it), and the peers;
* roofline.png: every kernel placed by its counted bytes and FLOPs under the same-run roofs;
* decode_gbps.png: chapter 07's decode bandwidth against context length and page size;
* lineage.png: the lineage at a glance, best kernel of each chapter against the best peer.

Only rows that passed their check are drawn; a failed kernel has no point. No panel draws
more than MAX_LINES (8) lines: a chapter with more steps gets more rows of panels (its
steps in order, the last of them with the peers), the lineage plot keeps the fastest peers,
and save() refuses a figure that breaks the rule.
"""
import os
import re
import sys
import textwrap

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bench_report  # noqa: E402
from bench_common import DECODE_PEERS, PEER_LABEL, PEERS, read_json, shape_key, speed, step_token  # noqa: E402

PEER_STYLE = {
    "fa4": dict(color="black", ls="-", lw=2.2, marker="*"),
    "sdpa_cudnn": dict(color="#555555", ls="--", lw=1.8, marker="D"),
    "sdpa_flash": dict(color="#555555", ls=":", lw=1.8, marker="s"),
    "sdpa_efficient": dict(color="#999999", ls="-.", lw=1.2, marker="v"),
    "flex": dict(color="#8c564b", ls="--", lw=1.4, marker="P"),
    "torch_softmax": dict(color="#555555", ls="--", lw=1.8, marker="D"),
}
CHAPTER_CMAP = {"01": "Reds", "02": "Oranges", "03": "Purples", "04": "Blues", "05": "Greens", "06": "YlOrBr",
                "07": "RdPu"}
CHAPTER_COLOR = {"01": "#d62728", "02": "#ff7f0e", "03": "#9467bd", "04": "#1f77b4", "05": "#2ca02c",
                 "06": "#bcbd22", "07": "#e377c2"}


MAX_LINES = 8  # lines (kernels and peers) one panel may draw; the ceilings' rules are not counted


def drawn_lines(ax):
    """The lines of a panel that the rule counts: every labelled series (axhline's rules have none)."""
    return [l for l in ax.get_lines() if not str(l.get_label()).startswith("_")]


def save(fig, path):
    """Saves a figure after checking that no panel draws more than MAX_LINES lines."""
    for ax in fig.axes:
        n = len(drawn_lines(ax))
        if n > MAX_LINES:
            plt.close(fig)
            raise ValueError("%s: a panel (%r) draws %d lines, more than %d" % (
                os.path.basename(path), ax.get_title(), n, MAX_LINES))
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def line_groups(kernels, peers, cap=MAX_LINES, finals=()):
    """Kernels (in the lesson's order) and peers as panels of at most `cap` lines each. One panel
    when they fit. Else the peers go in a last panel with the kernels that meet them: the final
    kernels (`finals`, of `kernels`) and, as room allows, the last steps before them; the steps
    take the panels before it, all of them when they fit in one (the last step is then drawn in
    both), else the ones the last panel does not draw, as evenly as they go. Returns [(kernels, peers)]."""
    kernels = list(kernels)
    peers = list(peers)[:max(0, cap - 1)]  # a panel of peers keeps one kernel beside them
    if len(kernels) + len(peers) <= cap:
        return [(kernels, peers)]
    room = cap - len(peers)
    fin = [k for k in kernels if k in finals][-room:]
    steps = [k for k in kernels if k not in finals]
    tail = steps[len(steps) - (room - len(fin)):] if room > len(fin) else []
    last = [k for k in kernels if k in tail or k in fin]
    rest = steps if len(steps) <= cap else [k for k in steps if k not in tail]
    n = -(-len(rest) // cap)
    size = -(-len(rest) // n) if rest else 1
    return [(rest[i:i + size], []) for i in range(0, len(rest), size)] + [(last, peers)]


def fastest_peers(rows, peers, keyfilter, keep):
    """The `keep` peers with the highest median speed over the rows keyfilter() accepts (the others
    are dropped from a plot that has no room for them; the tables keep every peer)."""
    med = {}
    for p in peers:
        v = sorted(speed(r) for r in rows if r["kernel"] == p and keyfilter(r) and speed(r))
        if v:
            med[p] = v[len(v) // 2]
    return sorted(med, key=lambda p: -med[p])[:max(0, keep)]


def short_step(kernel):
    """"ch05 v12 fp8 ..." -> "v12", "ch05 final fp8 forward" -> "final-fp8", else the name."""
    return step_token(kernel) or (kernel[5:] if kernel[:2] == "ch" else kernel)


def n_label(n):
    return "%dK" % (n // 1024) if n >= 1024 and n % 1024 == 0 else str(n)


def nice_axes(ax, xs=None, logy=True):
    """Plain numbers on log axes: N as 512, 1K, ... and TFLOP/s as 20, 50, 100, ..."""
    from matplotlib.ticker import FixedLocator, FuncFormatter, LogLocator, NullFormatter
    if xs:
        ax.xaxis.set_major_locator(FixedLocator(sorted(xs)))
        ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _: n_label(int(round(v)))))
        ax.xaxis.set_minor_formatter(NullFormatter())
    if logy:
        ax.yaxis.set_major_locator(LogLocator(base=10, subs=(1.0, 2.0, 5.0)))
        ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: "%g" % v))
        ax.yaxis.set_minor_formatter(NullFormatter())


def frame(fig, legend_labels, ncol=6, title_lines=1):
    """Room at the top for the title and the legend, at the bottom for the footer (in inches)."""
    h = fig.get_size_inches()[1]
    rows = -(-len(legend_labels) // ncol) if legend_labels else 0
    top = 1 - (0.2 + 0.25 * title_lines + 0.22 * rows) / h
    fig.tight_layout(rect=(0, 0.28 / h, 1, top))
    return 1 - (0.25 + 0.25 * title_lines) / h


def footer(fig, res):
    """The run's GPU, clocks, date and command, wrapped to the figure's width (6.5 pt: about 20
    characters an inch)."""
    text = bench_report.run_line(res).replace("`", "")
    lines = textwrap.wrap(text, max(60, int(fig.get_size_inches()[0] * 20)))
    fig.text(0.01, 0.005, "\n".join(lines[:3]), fontsize=6.5, color="#444444", ha="left", va="bottom")


def kernel_colors(kernels, chapter):
    cmap = plt.get_cmap(CHAPTER_CMAP.get(chapter, "viridis"))
    n = max(1, len(kernels))
    return {k: cmap(0.35 + 0.65 * (i + 1) / n) for i, k in enumerate(kernels)}


def points(rows, kernel, keyfilter):
    """(N, speed) of one kernel's rows that passed: the only points any plot draws."""
    return sorted((r["N"], speed(r)) for r in rows if r["kernel"] == kernel and keyfilter(r) and speed(r))


def line_panel(ax, rows, keyfilter, kernels, colors, res, peers=PEERS, labels=None):
    """TFLOP/s against N for the rows that match keyfilter(row)."""
    drawn = False
    for k in kernels:
        pts = points(rows, k, keyfilter)
        if pts:
            lab = (labels or {}).get(k) or (k[5:] if k[:2] == "ch" else k)
            ax.plot(*zip(*pts), marker="o", ms=3.5, lw=1.5, color=colors[k], label=lab)
            drawn = True
    for p in peers:
        pts = points(rows, p, keyfilter)
        if pts:
            st = dict(PEER_STYLE[p])
            ax.plot(*zip(*pts), ms=5, label=PEER_LABEL[p], **st)
            drawn = True
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    nice_axes(ax, sorted({r["N"] for r in rows if keyfilter(r) and r.get("N")}))
    ax.grid(True, which="both", alpha=0.25)
    return drawn


def bar_panel(ax, rows, keyfilter, kernels, colors, gemm):
    """One N only: a bar per step (the lesson read top to bottom) and per peer."""
    names, vals, cols, why = [], [], [], []
    for k in kernels:
        v = points(rows, k, keyfilter)
        r = next((r for r in rows if r["kernel"] == k and keyfilter(r)), None)
        if r is None:
            continue
        names.append((k[5:] if k[:2] == "ch" else k) + (" (FP8 inputs)" if r.get("dtype") == "fp8" else ""))
        vals.append(v[0][1] if v else 0)
        cols.append(colors[k] if v else "white")
        # a bar with no speed says why, as the tables do: FAIL, not run, unchecked (timed, not checked), n/a
        why.append(bench_report.STATUS_TEXT.get(r.get("status"), r.get("status") or "not run"))
    for p in PEERS:
        v = points(rows, p, keyfilter)
        if v:
            names.append(PEER_LABEL[p])
            vals.append(v[0][1])
            cols.append(PEER_STYLE[p]["color"])
            why.append("")
    y = list(range(len(names)))[::-1]
    ax.barh(y, vals, color=cols, edgecolor="#555555", lw=0.5)
    top = max(vals + [gemm or 0]) or 1
    for yi, v, w in zip(y, vals, why):
        ax.text(v + top * 0.01, yi, ("%.0f" % v) if v else w, va="center", fontsize=7.5)
    ax.set_yticks(y)
    ax.set_yticklabels(names, fontsize=7.5)
    if gemm:
        ax.axvline(gemm, color="#bbbbbb", lw=1)
        ax.text(gemm, 0.02, "bf16 GEMM %.0f " % gemm, fontsize=7, ha="right", va="bottom", rotation=90,
                color="#888888", transform=ax.get_xaxis_transform())
    ax.set_xlim(0, top * 1.12)
    ax.set_xlabel("TFLOP/s")
    ax.grid(True, axis="x", alpha=0.25)
    return bool(names)


def step_order(kernel):
    """Sort key of a chapter's kernel: its step number ("ch05 v12 ...", "ch05 b3 ..."), the other
    kernels after the steps, in the order given (sorted() is stable)."""
    m = re.match(r"ch\d\d [vb](\d+)\b", kernel)
    return (0, int(m.group(1))) if m else (1, 0)


def fig_chapter(res, rows, chapter, pss, out_dir, which="main"):
    """TFLOP/s against N of one chapter's kernels (which: "main", the main path and final kernels
    of a chapter with a lab, every kernel of any other; "lab", the lab's steps: its own file),
    a row of panels per head dim (and per group of steps when they and the peers would draw more
    than MAX_LINES lines in one panel), a column per mask."""
    kernels = bench_report.chapter_kernels(rows, chapter, pss, which)
    kernels = [k for k in kernels if any(speed(r) for r in rows if r["kernel"] == k)]
    if not kernels:
        return None
    kernels = sorted(kernels, key=step_order)  # the steps as the chapter numbers them, light to dark
    suffix = "_lab" if which == "lab" else ""
    ns = {r["N"] for r in rows if r["kernel"] in kernels}
    if len(ns) == 1 or chapter == "06":  # chapter 06: variants and head groups, a panel each, not an N sweep
        return fig_chapter_bars(res, rows, chapter, pss, kernels, out_dir, suffix)
    dims = sorted({r["d"] for r in rows if r["kernel"] in kernels})

    def panel_filter(d, causal):
        # the papers' shapes only: no variant, every query head its own KV head (a GQA shape of
        # chapter 06, with its peers, has its own plot)
        return lambda r: (r.get("pass") == pss and r.get("d") == d and bool(r.get("causal")) == causal and
                          not r.get("variant") and r.get("Hkv") == r.get("H"))
    mine = lambda r: r.get("pass") == pss and r.get("d") in dims and not r.get("variant")  # noqa: E731
    peers = [p for p in PEERS if points(rows, p, mine)]
    groups = line_groups(kernels, peers, finals=[k for k in kernels if step_order(k)[0]])
    nrow = len(dims) * len(groups)
    fig, axes = plt.subplots(nrow, 2, figsize=(11, (3.3 if nrow <= 3 else 2.9) * nrow + 1.6), squeeze=False)
    colors = kernel_colors(kernels, chapter)
    gemm = res.get("ceilings", {}).get("bf16_gemm_tflops")
    for i, d in enumerate(dims):
        for g, (ks, ps) in enumerate(groups):
            row = i * len(groups) + g
            for j, causal in enumerate((False, True)):
                ax = axes[row][j]
                drawn = line_panel(ax, rows, panel_filter(d, causal), ks, colors, res, peers=ps)
                if gemm:
                    ax.axhline(gemm, color="#bbbbbb", lw=1, ls="-")
                    ax.text(0.01, gemm, " bf16 GEMM %.0f (same run)" % gemm, fontsize=7, va="bottom",
                            color="#888888", transform=ax.get_yaxis_transform())
                title = "d = %d, %s" % (d, "causal" if causal else "not causal")
                if len(groups) > 1:
                    title += ": %s%s%s" % (short_step(ks[0]), "" if len(ks) == 1 else " … " + short_step(ks[-1]),
                                           " and the peers" if ps else "")
                ax.set_title(title, fontsize=10)
                ax.set_ylabel("TFLOP/s")
                if not drawn:
                    ax.text(0.5, 0.5, "nothing measured", transform=ax.transAxes, ha="center", color="#888888")
                if row == nrow - 1:
                    ax.set_xlabel("N (B·N = 16K tokens, H·d = 2048)")
    # the legend in the lesson's order (the steps as the chapter numbers them, then the peers),
    # whichever panel drew a line first
    by_label = {}
    for ax in axes.flat:
        for h, l in zip(*ax.get_legend_handles_labels()):
            by_label.setdefault(l, h)
    order = [(k[5:] if k[:2] == "ch" else k) for k in kernels] + [PEER_LABEL[p] for p in PEERS]
    labels = [l for l in order if l in by_label] + [l for l in by_label if l not in order]
    handles = [by_label[l] for l in labels]
    title = {"fwd": "forward", "bwd": "backward"}[pss]
    what = ("the lab's steps" if which == "lab" else "the main path, the final kernels"
            if chapter in bench_report.MAIN_PATH else "every step")
    fig.suptitle("Chapter %s, %s: %s and every peer, one run" % (chapter, title, what),
                 y=1 - 0.12 / fig.get_size_inches()[1], va="top", fontsize=11)
    # as many columns as the figure's width holds at the longest label (8 pt: about 0.075 in a character)
    width = fig.get_size_inches()[0]
    ncol = max(1, min(6, len(labels), int(width / (0.075 * max(len(l) for l in labels) + 0.5))))
    y = frame(fig, labels, ncol=ncol)
    fig.legend(handles, labels, loc="upper center", bbox_to_anchor=(0.5, y), ncol=ncol, fontsize=8,
               frameon=False)
    footer(fig, res)
    return save(fig, os.path.join(out_dir, "tflops_ch%s%s_%s.png" % (chapter, suffix, pss)))


def fig_chapter_bars(res, rows, chapter, pss, kernels, out_dir, suffix=""):
    """One N: a panel per shape (head dim, mask, and chapter 06's variants and GQA groups), a bar per
    kernel of `kernels` measured on it and per peer on the same shape."""
    all_k = [k for k in bench_report.chapter_kernels(rows, chapter, pss) if k in kernels]
    mine = [r for r in rows if r.get("chapter") == chapter and r.get("pass") == pss and r["kernel"] in all_k]
    shapes = sorted({(r["d"], bool(r.get("causal")), r.get("variant") or "", r.get("H"), r.get("Hkv"), r.get("N"),
                      r.get("nk"))
                     for r in mine}, key=lambda k: (k[2] != "", k[2], k[0], k[1], -(k[4] or 0), k[5] or 0))
    ncol = 2 if len(shapes) == 4 else min(3, len(shapes))
    nrow = -(-len(shapes) // ncol)
    nbars = max(len([k for k in all_k if any(r["kernel"] == k and r.get("variant", "") == sh[2] for r in mine)])
                for sh in shapes) + len(PEERS)
    fig, axes = plt.subplots(nrow, ncol, figsize=(max(9.5, 6.2 * ncol), nrow * (0.32 * nbars + 1.3) + 0.5),
                             squeeze=False)
    colors = kernel_colors(all_k, chapter)
    gemm = res.get("ceilings", {}).get("bf16_gemm_tflops")
    for ax, (d, causal, variant, h, hkv, n, nk) in zip(axes.flat, shapes):
        def f(r, d=d, causal=causal, variant=variant, hkv=hkv, n=n, nk=nk):
            return (r.get("pass") == pss and r.get("N") == n and r.get("nk") == nk and r.get("d") == d and
                    bool(r.get("causal")) == causal and (r.get("variant") or "") == variant and r.get("Hkv") == hkv)
        ks = [k for k in all_k if any(r["kernel"] == k and f(r) and r.get("status") != "unsupported" for r in rows)]
        if ks:
            bar_panel(ax, rows, f, ks, colors, gemm)
        else:
            why = next((r.get("note") for r in mine if f(r) and r.get("note")), "not measured")
            ax.text(0.5, 0.5, "\n".join(textwrap.wrap(why, 40)), ha="center", va="center", transform=ax.transAxes,
                    fontsize=9, color="#aa0000")
            ax.set_xticks([])
            ax.set_yticks([])
        title = "d = %d, N = %s%s, %s" % (d, n_label(n), "" if nk in (None, n) else ", context %s" % n_label(nk),
                                          "causal" if causal else "not causal")
        if variant:
            title += ", " + variant
        if h and hkv and h != hkv:
            title += ", Hq/Hkv = %d/%d" % (h, hkv)
        ax.set_title(title, fontsize=10)
    for ax in list(axes.flat)[len(shapes):]:
        ax.axis("off")
    title = {"fwd": "forward", "bwd": "backward"}[pss]
    fig.suptitle("Chapter %s, %s: every step and every peer, one run (B·N = 16K, H·d = 2048)" % (chapter, title),
                 fontsize=11)
    fig.tight_layout(rect=(0, 0.4 / fig.get_size_inches()[1], 1, 1 - 0.35 / fig.get_size_inches()[1]))
    footer(fig, res)
    return save(fig, os.path.join(out_dir, "tflops_ch%s%s_%s.png" % (chapter, suffix, pss)))


def fig_lineage_lines(res, rows, out_dir):
    """The best kernel of each chapter at every shape (forward), with the peers."""
    chapters = sorted({r["chapter"] for r in rows if r.get("kind") == "ours" and r.get("pass") == "fwd"})
    at = {}
    for r in rows:
        if r.get("kind") == "ours" and r.get("pass") == "fwd":
            at.setdefault((r["chapter"], shape_key(r)), []).append(r)
    best, rules = {}, {}
    for (c, k), rs in at.items():
        r, rule = bench_report.chapter_best(rs, c)  # chapter 05: its final kernel where the run has it
        if r is not None:
            best[(c, k)] = r
            rules.setdefault(c, set()).add(rule)
    per_chapter = {}
    for (c, k), r in best.items():
        per_chapter.setdefault(c, set()).add(r["N"])
    if not per_chapter or max(len(v) for v in per_chapter.values()) < 2:
        return None  # one N per chapter: lineage.png says it all
    brows = []
    for (c, _), r in best.items():
        x = dict(r)
        x["kernel"] = "ch%s best" % c
        brows.append(x)
    # the head dims of the papers' shapes only (chapter 06's MLA, d = 192, is a variant with its own plot)
    dims = sorted({r["d"] for r in brows if not r.get("variant") and r.get("Hkv") == r.get("H")})
    fig, axes = plt.subplots(len(dims), 2, figsize=(11, 3.3 * len(dims) + 1.6), squeeze=False)
    kernels = ["ch%s best" % c for c in chapters if any(k[0] == c for k in best)]
    colors = {"ch%s best" % c: CHAPTER_COLOR.get(c, "C0") for c in chapters}
    allrows = brows + [r for r in rows if r.get("kind") == "peer"]

    def label(c):
        r = rules.get(c, set())
        return "chapter %s (%s)" % (c, "final kernel" if r == {"final"} else "best step" if "final" not in r
                                    else "final kernel, else best step")
    # room for MAX_LINES lines a panel: every chapter, and the fastest peers that fit beside them
    fwd = lambda r: r.get("pass") == "fwd" and not r.get("variant") and r.get("Hkv") == r.get("H")  # noqa: E731
    peers = fastest_peers(rows, PEERS, fwd, MAX_LINES - len(kernels))
    for i, d in enumerate(dims):
        for j, causal in enumerate((False, True)):
            ax = axes[i][j]
            line_panel(ax, allrows, lambda r: r.get("pass") == "fwd" and r.get("d") == d and
                       bool(r.get("causal")) == causal and not r.get("variant") and r.get("Hkv") == r.get("H"),
                       kernels, colors, res, peers=[p for p in PEERS if p in peers],
                       labels={k: label(k[2:4]) for k in kernels})
            ax.set_title("d = %d, %s" % (d, "causal" if causal else "not causal"), fontsize=10)
            ax.set_ylabel("TFLOP/s")
            if i == len(dims) - 1:
                ax.set_xlabel("N")
    handles, labels = [], []
    for ax in axes.flat:
        for h, l in zip(*ax.get_legend_handles_labels()):
            if l not in labels:
                handles.append(h)
                labels.append(l)
    left = [PEER_LABEL[p] for p in PEERS if p not in peers and points(rows, p, fwd)]
    fig.suptitle("The lineage, forward: the best kernel of each chapter and the fastest peers" +
                 (" (not drawn: %s; every peer is in the tables)" % ", ".join(left) if left else ""),
                 y=1 - 0.12 / fig.get_size_inches()[1], va="top", fontsize=11 if not left else 9.5)
    y = frame(fig, labels)
    fig.legend(handles, labels, loc="upper center", bbox_to_anchor=(0.5, y), ncol=6, fontsize=8, frameon=False)
    footer(fig, res)
    return save(fig, os.path.join(out_dir, "tflops_lineage_fwd.png"))


def fig_roofline(res, rows, out_dir):
    ce = res.get("ceilings", {})
    bw, gemm, fp8 = ce.get("read_gbps"), ce.get("bf16_gemm_tflops"), ce.get("fp8_gemm_tflops")
    pts = []
    for r in rows:
        if r.get("kind") != "ours" or not speed(r) or not r.get("bytes"):
            continue
        fl = r.get("flops")
        if not fl and r.get("pass") == "decode":
            fl = 4.0 * r["B"] * r["H"] * r["nk"] * r["d"]
        if not fl or not r.get("time_ms"):
            continue
        pts.append((r, fl / r["bytes"], fl / (r["time_ms"] * 1e-3) / 1e12))
    if not pts:
        return None
    fig, ax = plt.subplots(figsize=(9.5, 6.2))
    lo = min(p[1] for p in pts) / 2
    hi = max(p[1] for p in pts) * 2
    if bw and gemm:
        hi = max(hi, 3 * gemm * 1e3 / bw)
    if bw and gemm:
        xs = [lo * (hi / lo) ** (i / 200) for i in range(201)]
        ax.plot(xs, [min(gemm, bw * x / 1e3) for x in xs], color="black", lw=1.5,
                label="roof: %.0f GB/s read, %.0f TFLOP/s bf16 GEMM" % (bw, gemm))
        if fp8:
            ax.plot(xs, [min(fp8, bw * x / 1e3) for x in xs], color="black", lw=1, ls="--",
                    label="FP8 GEMM roof %.0f TFLOP/s" % fp8)
        ax.axvline(gemm * 1e3 / bw, color="#cccccc", lw=0.8)
    markers = {"fwd": "o", "bwd": "^", "decode": "s"}
    seen = set()
    for r, x, y in pts:
        c = r["chapter"]
        lab = "chapter %s %s" % (c, {"fwd": "forward", "bwd": "backward", "decode": "decode"}[r["pass"]])
        ax.scatter([x], [y], s=22, marker=markers.get(r["pass"], "o"), color=CHAPTER_COLOR.get(c, "C0"),
                   alpha=0.75, edgecolors="none", label=None if lab in seen else lab)
        seen.add(lab)
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("arithmetic intensity: FLOPs / counted HBM bytes (FLOP/byte)")
    ax.set_ylabel("TFLOP/s (FlashAttention's count)")
    ax.set_title("Roofline: every kernel that passed, placed by its own count of bytes and FLOPs")
    ax.text(0.01, 0.99, "A point above the slanted roof moved fewer HBM bytes than it counts:\nre-reads of K and V "
            "that the L2 cache served.", transform=ax.transAxes, va="top", fontsize=8, color="#444444")
    ax.grid(True, which="both", alpha=0.25)
    ax.legend(fontsize=8, loc="lower right")
    fig.tight_layout(rect=(0, 0.04, 1, 1))
    footer(fig, res)
    return save(fig, os.path.join(out_dir, "roofline.png"))


def fig_decode(res, rows, out_dir):
    """Chapter 07's decode: KV GB/s over the sweep's shapes (page size 16), and against the page size
    at one long sequence. Its kernels (each layout a line) and the peers take as many rows of panels
    as MAX_LINES lines a panel need, the earlier versions first, the last ones with the peers."""
    dec = [r for r in rows if r.get("pass") == "decode" and not r.get("variant")]  # bf16 caches (8-bit: the table)
    ours = [r for r in dec if r.get("kind") == "ours"]
    if not any(speed(r) for r in ours):
        return None
    bw = res.get("ceilings", {}).get("read_gbps")
    cfgs = sorted({shape_key(r) for r in dec if r.get("page_size") == 16}, key=lambda k: (k[3], k[4], k[5] / k[6]))
    labels = ["L=%dK\nB=%d %d/%d" % (k[3] // 1024, k[4], k[5], k[6]) for k in cfgs]
    kernels = [k for k in bench_report.chapter_kernels(rows, "07", "decode") if any(r["kernel"] == k for r in dec)]

    def version(k):
        v = k.split()[1]
        return int(v[1:]) if v[1:].isdigit() else 1 << 30
    kernels.sort(key=lambda k: (version(k), "contiguous" in k))  # v1, v2, ... in the chapter's order
    # a colour per kernel (v1, v2, ...), a line style per layout: paged solid, contiguous dashed
    versions = []
    for k in kernels:
        if k.split()[1] not in versions:
            versions.append(k.split()[1])
    palette = ["#e377c2", "#9467bd", "#17becf", "#bcbd22", "#8c564b", "#1f77b4", "#ff7f0e", "#2ca02c",
               "#d62728", "#7f7f7f"]
    colors = {k: palette[versions.index(k.split()[1]) % len(palette)] for k in kernels}
    styles = {k: ("--" if "contiguous" in k else "-") for k in kernels}
    by = {(shape_key(r), r["kernel"]): r for r in dec}

    def series(k):
        xs, ys = [], []
        for i, c in enumerate(cfgs):
            r = by.get((c, k))
            if r is not None and speed(r):
                xs.append(i)
                ys.append(speed(r))
        return xs, ys
    main_k = [k for k in kernels if series(k)[0]]
    peers = [p for p in DECODE_PEERS if series(p)[0]]
    main_groups = line_groups(main_k, peers)
    # page size at one long sequence (paged layouts: contiguous K/V has no page size)
    pg = sorted({r.get("page_size") for r in ours if r.get("page_size")})
    one = [r for r in ours if r["B"] == 1 and r["nk"] == max(x["nk"] for x in ours if x["B"] == 1) and
           r["Hkv"] != r["H"]] if any(x["B"] == 1 for x in ours) else []

    def page_points(k):
        return sorted((r["page_size"], speed(r)) for r in one if r["kernel"] == k and speed(r))
    page_k = [k for k in kernels if "contiguous" not in k and page_points(k)]
    page_groups = line_groups(page_k, []) if page_k else [([], [])]
    nrow = max(len(main_groups), len(page_groups))
    fig, axes = plt.subplots(nrow, 2, figsize=(13, 4.4 * nrow + 1.0), gridspec_kw={"width_ratios": [2.2, 1]},
                             squeeze=False)
    for g in range(nrow):
        ax, ax2 = axes[g]
        if g < len(main_groups):
            ks, ps = main_groups[g]
            for k in ks:
                ax.plot(*series(k), marker="o", ms=4, lw=1.4, ls=styles[k], color=colors[k], label=k[5:])
            for p in ps:
                ax.plot(*series(p), ms=6, label=PEER_LABEL[p], **PEER_STYLE[p])
            if bw:
                ax.axhline(bw, color="#bbbbbb", lw=1)
                ax.text(-0.3, bw, " read ceiling %.0f GB/s" % bw, fontsize=7, va="bottom", color="#888888")
            ax.set_xticks(range(len(cfgs)))
            ax.set_xticklabels(labels, fontsize=7.5)
            ax.set_ylabel("KV GB/s (cached K and V bytes / time)")
            title = "Decode: one query token per sequence, d = 128"
            if len(main_groups) > 1 and ks:
                title += ": %s … %s%s" % (ks[0].split()[1], ks[-1].split()[1], " and the peers" if ps else "")
            ax.set_title(title, fontsize=10)
            ax.grid(True, alpha=0.25)
            ax.legend(fontsize=7, ncol=2, loc="best")
            if g == len(main_groups) - 1:
                ax.set_xlabel("context length L, batch B, query/KV heads (page size 16), sorted by L")
        else:
            ax.axis("off")
        if g < len(page_groups) and page_groups[g][0]:
            for k in page_groups[g][0]:
                ax2.plot(*zip(*page_points(k)), marker="o", color=colors[k], ls=styles[k], label=k[5:])
            ax2.set_xscale("log", base=2)
            ax2.set_xticks(pg or [16])
            ax2.set_xticklabels([str(p) for p in (pg or [16])])
            if one:
                ax2.set_title("page size, B=1 L=%dK %d/%d" % (one[0]["nk"] // 1024, one[0]["H"], one[0]["Hkv"]),
                              fontsize=10)
            ax2.set_xlabel("tokens per page")
            ax2.grid(True, alpha=0.25)
            if bw:
                ax2.axhline(bw, color="#bbbbbb", lw=1)
            ax2.set_ylabel("KV GB/s")
            ax2.legend(fontsize=7)
        else:
            ax2.axis("off")
    fig.tight_layout(rect=(0, 0.04, 1, 1))
    footer(fig, res)
    return save(fig, os.path.join(out_dir, "decode_gbps.png"))


def fig_lineage(res, rows, out_dir):
    ents = bench_report.lineage_entries(res, rows)
    if not ents:
        return None
    ce = res.get("ceilings", {})
    comp = [e for e in ents if e["shape"].get("unit") == "TFLOP/s"]
    mem = [e for e in ents if e["shape"].get("unit") == "GB/s"]
    fig, axes = plt.subplots(1, 2, figsize=(max(12, 2.3 * (len(comp) + len(mem)) + 1), 5.6),
                             gridspec_kw={"width_ratios": [max(1, len(comp)), max(1, len(mem))]})
    for ax, group, ceil, unit in ((axes[0], comp, ce.get("bf16_gemm_tflops"), "TFLOP/s"),
                                  (axes[1], mem, ce.get("read_gbps"), "GB/s")):
        top = max([speed(e["best"]) for e in group if e["best"]] + [speed(e["peer"]) for e in group if e["peer"]] +
                  [ceil or 0] + [1])
        for i, e in enumerate(group):
            b, p = e["best"], e["peer"]
            c = e["chapter"]
            if b:
                ax.bar(i - 0.18, speed(b), 0.36, color=CHAPTER_COLOR.get(c, "C0"))
                inside = speed(b) > 0.1 * top
                ax.text(i - 0.18, speed(b) * (0.98 if inside else 1.02), ("%.0f" if speed(b) >= 100 else "%.3g") % speed(b), ha="center",
                        va="top" if inside else "bottom", fontsize=8, color="white" if inside else "black",
                        fontweight="bold")
            else:
                ax.text(i - 0.18, 0, "failed", ha="center", va="bottom", fontsize=8, color="red")
            if p:
                ax.bar(i + 0.18, speed(p), 0.36, color="#777777")
                ax.text(i + 0.18, speed(p) * 0.98, "%.0f" % speed(p), ha="center", va="top", fontsize=8,
                        color="white", fontweight="bold")
                ax.text(i + 0.18, speed(p) * 1.01, "\n".join(textwrap.wrap(PEER_LABEL.get(p["kernel"], p["kernel"]), 12, break_long_words=False)),
                        ha="center", va="bottom", fontsize=7)
            else:
                ax.text(i + 0.18, 0, "peer\nabsent", ha="center", va="bottom", fontsize=7, color="#777777")
            if b and p:
                ax.text(i, max(speed(b), speed(p)) * 1.09, "%.2fx" % (speed(b) / speed(p)), ha="center",
                        va="bottom", fontsize=9, fontweight="bold",  # readable where it meets the ceiling's line
                        bbox=dict(boxstyle="round,pad=0.15", facecolor="white", edgecolor="none"))
        names = []
        for e in group:
            s = e["shape"]
            what = "\n".join(textwrap.wrap(b["kernel"][5:], 22)) if (b := e["best"]) else "-"
            if s.get("pass") == "decode":
                names.append("ch%s %s\nB=%d L=%dK" % (e["chapter"], what, s["B"], s["nk"] // 1024))
            elif s.get("pass") == "softmax":
                names.append("ch%s %s\nrows of %d" % (e["chapter"], what, s["N"]))
            else:
                names.append("ch%s %s\nd=%d N=%d%s" % (e["chapter"], what, s["d"], s["N"],
                                                        " causal" if s.get("causal") else ""))
        ax.set_xticks(range(len(group)))
        ax.set_xticklabels(names, fontsize=7.5)
        ax.set_ylim(0, top * 1.3)
        if ceil:
            ax.axhline(ceil, color="black", lw=1, ls="--")
            ax.text(0.01, 1.0, "- - same-run ceiling %.0f %s" % (ceil, unit), fontsize=7.5, va="top", ha="left",
                    transform=ax.transAxes, bbox=dict(facecolor="white", edgecolor="none", pad=1.5))
        ax.set_ylabel(unit)
        ax.grid(True, axis="y", alpha=0.25)
    axes[0].set_title("compute-bound chapters: best kernel (colour) and best peer (grey)", fontsize=10)
    axes[1].set_title("memory-bound chapters", fontsize=10)
    missing = [c for c in res.get("run", {}).get("chapters", []) if c not in {e["chapter"] for e in ents}]
    if missing:
        fig.text(0.99, 0.005, "not measured in this run: chapter %s" % ", ".join(missing), ha="right", va="bottom",
                 fontsize=7.5, color="#aa0000")
    fig.suptitle("The lineage at a glance: one run, each chapter's best against the best peer", fontsize=11)
    fig.tight_layout(rect=(0, 0.05, 1, 0.95))
    footer(fig, res)
    return save(fig, os.path.join(out_dir, "lineage.png"))


def draw_all(res, out_dir, lab=None):
    """Every plot of a run. lab: also the lab's own plots (default: when the run was made with --lab)."""
    if lab is None:
        lab = bool(res.get("run", {}).get("lab"))
    os.makedirs(out_dir, exist_ok=True)
    rows = bench_report.enrich(res)
    jobs = []
    chapters = sorted({r["chapter"] for r in rows if r.get("kind") == "ours"})
    for c in chapters:
        for pss in ("fwd", "bwd"):
            jobs.append((fig_chapter, (res, rows, c, pss, out_dir)))
            if lab and c in bench_report.MAIN_PATH:
                jobs.append((fig_chapter, (res, rows, c, pss, out_dir, "lab")))
    jobs += [(f, (res, rows, out_dir)) for f in (fig_lineage_lines, fig_roofline, fig_decode, fig_lineage)]
    paths = []
    for f, args in jobs:
        try:
            paths.append(f(*args))
        except Exception as e:  # one picture's trouble never costs the others (the tests see it)
            print("bench_plots: %s failed: %s: %s" % (f.__name__, e.__class__.__name__, e), file=sys.stderr)
            plt.close("all")
    return [p for p in paths if p]


if __name__ == "__main__":
    argv = [a for a in sys.argv[1:] if a != "--lab"]
    if len(argv) != 2:
        sys.exit("usage: bench_plots.py RESULTS_JSON OUT_DIR [--lab]")
    for p in draw_all(read_json(argv[0]), argv[1], lab=True if "--lab" in sys.argv[1:] else None):
        print(p)
