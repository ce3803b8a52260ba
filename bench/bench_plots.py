#!/usr/bin/env python3
"""PNG plots of a results.json (matplotlib; Debian's python3-matplotlib).

    /usr/bin/python3 bench/bench_plots.py RESULTS_JSON OUT_DIR     prints the paths it wrote

* tflops_chNN_fwd.png / _bwd.png: TFLOP/s against N, a panel per head dim and mask, one
  line per step of the chapter and one per peer (log scale: the steps span two decades);
* tflops_lineage_fwd.png: the best kernel of every chapter at each shape, and the peers;
* roofline.png: every kernel placed by its counted bytes and FLOPs under the same-run roofs;
* decode_gbps.png: chapter 07's decode bandwidth against context length and page size;
* lineage.png: the lineage at a glance, best kernel of each chapter against the best peer.

Only rows that passed their check are drawn; a failed kernel has no point.
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
from bench_common import DECODE_PEERS, PEER_LABEL, PEERS, read_json, shape_key, speed  # noqa: E402

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


def fig_chapter(res, rows, chapter, pss, out_dir):
    kernels = bench_report.chapter_kernels(rows, chapter, pss)
    kernels = [k for k in kernels if any(speed(r) for r in rows if r["kernel"] == k)]
    if not kernels:
        return None
    kernels = sorted(kernels, key=step_order)  # the steps as the chapter numbers them, light to dark
    ns = {r["N"] for r in rows if r["kernel"] in kernels}
    if len(ns) == 1 or chapter == "06":  # chapter 06: variants and head groups, a panel each, not an N sweep
        return fig_chapter_bars(res, rows, chapter, pss, kernels, out_dir)
    dims = sorted({r["d"] for r in rows if r["kernel"] in kernels})
    fig, axes = plt.subplots(len(dims), 2, figsize=(11, 3.3 * len(dims) + 1.6), squeeze=False)
    colors = kernel_colors(kernels, chapter)
    gemm = res.get("ceilings", {}).get("bf16_gemm_tflops")
    for i, d in enumerate(dims):
        for j, causal in enumerate((False, True)):
            ax = axes[i][j]
            # the papers' shapes only: no variant, every query head its own KV head (a GQA shape of
            # chapter 06, with its peers, has its own plot)
            drawn = line_panel(ax, rows, lambda r: r.get("pass") == pss and r.get("d") == d and
                               bool(r.get("causal")) == causal and not r.get("variant") and
                               r.get("Hkv") == r.get("H"), kernels, colors, res)
            if gemm:
                ax.axhline(gemm, color="#bbbbbb", lw=1, ls="-")
                ax.text(0.01, gemm, " bf16 GEMM %.0f (same run)" % gemm, fontsize=7, va="bottom", color="#888888",
                        transform=ax.get_yaxis_transform())
            ax.set_title("d = %d, %s" % (d, "causal" if causal else "not causal"), fontsize=10)
            ax.set_ylabel("TFLOP/s")
            if not drawn:
                ax.text(0.5, 0.5, "nothing measured", transform=ax.transAxes, ha="center", color="#888888")
            if i == len(dims) - 1:
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
    fig.suptitle("Chapter %s, %s: every step and every peer, one run" % (chapter, title), y=1 - 0.12 / fig.get_size_inches()[1],
                 va="top", fontsize=11)
    # as many columns as the figure's width holds at the longest label (8 pt: about 0.075 in a character)
    width = fig.get_size_inches()[0]
    ncol = max(1, min(6, len(labels), int(width / (0.075 * max(len(l) for l in labels) + 0.5))))
    y = frame(fig, labels, ncol=ncol)
    fig.legend(handles, labels, loc="upper center", bbox_to_anchor=(0.5, y), ncol=ncol, fontsize=8,
               frameon=False)
    footer(fig, res)
    path = os.path.join(out_dir, "tflops_ch%s_%s.png" % (chapter, pss))
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def fig_chapter_bars(res, rows, chapter, pss, kernels, out_dir):
    """One N: a panel per shape (head dim, mask, and chapter 06's variants and GQA groups), a bar per
    kernel measured on it and per peer on the same shape."""
    all_k = bench_report.chapter_kernels(rows, chapter, pss)
    mine = [r for r in rows if r.get("chapter") == chapter and r.get("pass") == pss]
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
    path = os.path.join(out_dir, "tflops_ch%s_%s.png" % (chapter, pss))
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def fig_lineage_lines(res, rows, out_dir):
    """The best kernel of each chapter at every shape (forward), with the peers."""
    chapters = sorted({r["chapter"] for r in rows if r.get("kind") == "ours" and r.get("pass") == "fwd"})
    best = {}
    for r in rows:
        if r.get("kind") == "ours" and r.get("pass") == "fwd" and speed(r) and r.get("dtype") != "fp8":
            k = (r["chapter"], shape_key(r))
            if k not in best or speed(r) > speed(best[k]):
                best[k] = r
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
    kernels = ["ch%s best" % c for c in chapters]
    colors = {"ch%s best" % c: CHAPTER_COLOR.get(c, "C0") for c in chapters}
    allrows = brows + [r for r in rows if r.get("kind") == "peer"]
    for i, d in enumerate(dims):
        for j, causal in enumerate((False, True)):
            ax = axes[i][j]
            line_panel(ax, allrows, lambda r: r.get("pass") == "fwd" and r.get("d") == d and
                       bool(r.get("causal")) == causal and not r.get("variant") and r.get("Hkv") == r.get("H"),
                       kernels, colors, res, labels={k: "chapter %s (best step)" % k[2:4] for k in kernels})
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
    fig.suptitle("The lineage, forward: the best kernel of each chapter and the peers",
                 y=1 - 0.12 / fig.get_size_inches()[1], va="top", fontsize=11)
    y = frame(fig, labels)
    fig.legend(handles, labels, loc="upper center", bbox_to_anchor=(0.5, y), ncol=6, fontsize=8, frameon=False)
    footer(fig, res)
    path = os.path.join(out_dir, "tflops_lineage_fwd.png")
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


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
    path = os.path.join(out_dir, "roofline.png")
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def fig_decode(res, rows, out_dir):
    dec = [r for r in rows if r.get("pass") == "decode" and not r.get("variant")]  # bf16 caches (8-bit: the table)
    ours = [r for r in dec if r.get("kind") == "ours"]
    if not any(speed(r) for r in ours):
        return None
    bw = res.get("ceilings", {}).get("read_gbps")
    fig, (ax, ax2) = plt.subplots(1, 2, figsize=(13, 6.0), gridspec_kw={"width_ratios": [2.2, 1]})
    cfgs = sorted({shape_key(r) for r in dec if r.get("page_size") == 16}, key=lambda k: (k[3], k[4], k[5] / k[6]))
    labels = ["L=%dK\nB=%d %d/%d" % (k[3] // 1024, k[4], k[5], k[6]) for k in cfgs]
    kernels = [k for k in bench_report.chapter_kernels(rows, "07", "decode") if any(r["kernel"] == k for r in dec)]
    # a colour per kernel (v1, v2, ...), a line style per layout: paged solid, contiguous dashed
    versions = []
    for k in kernels:
        if k.split()[1] not in versions:
            versions.append(k.split()[1])
    versions.sort(key=lambda v: int(v[1:]) if v[1:].isdigit() else 1 << 30)  # v1, v2, ... in the chapter's order
    palette = ["#e377c2", "#9467bd", "#17becf", "#bcbd22", "#8c564b", "#1f77b4", "#ff7f0e", "#2ca02c",
               "#d62728", "#7f7f7f"]
    colors = {k: palette[versions.index(k.split()[1]) % len(palette)] for k in kernels}
    styles = {k: ("--" if "contiguous" in k else "-") for k in kernels}
    by = {(shape_key(r), r["kernel"]): r for r in dec}
    for k in kernels:
        xs, ys = [], []
        for i, c in enumerate(cfgs):
            r = by.get((c, k))
            if r is not None and speed(r):
                xs.append(i)
                ys.append(speed(r))
        if xs:
            ax.plot(xs, ys, marker="o", ms=4, lw=1.4, ls=styles[k], color=colors[k], label=k[5:])
    for p in DECODE_PEERS:
        xs, ys = [], []
        for i, c in enumerate(cfgs):
            r = by.get((c, p))
            if r is not None and speed(r):
                xs.append(i)
                ys.append(speed(r))
        if xs:
            ax.plot(xs, ys, ms=6, label=PEER_LABEL[p], **PEER_STYLE[p])
    if bw:
        ax.axhline(bw, color="#bbbbbb", lw=1)
        ax.text(-0.3, bw, " read ceiling %.0f GB/s" % bw, fontsize=7, va="bottom", color="#888888")
    ax.set_xticks(range(len(cfgs)))
    ax.set_xticklabels(labels, fontsize=7.5)
    ax.set_ylabel("KV GB/s (cached K and V bytes / time)")
    ax.set_xlabel("context length L, batch B, query/KV heads (page size 16), sorted by L")
    ax.set_title("Decode: one query token per sequence, d = 128", fontsize=10)
    ax.grid(True, alpha=0.25)
    ax.legend(fontsize=7.5, ncol=4, loc="upper center", bbox_to_anchor=(0.5, -0.2), frameon=False)
    # page size at one long sequence (paged layouts: contiguous K/V has no page size)
    pg = sorted({r.get("page_size") for r in ours if r.get("page_size")})
    one = [r for r in ours if r["B"] == 1 and r["nk"] == max(x["nk"] for x in ours if x["B"] == 1) and
           r["Hkv"] != r["H"]] if any(x["B"] == 1 for x in ours) else []
    for k in kernels:
        if "contiguous" in k:
            continue
        pts = sorted((r["page_size"], speed(r)) for r in one if r["kernel"] == k and speed(r))
        if pts:
            ax2.plot(*zip(*pts), marker="o", color=colors[k], ls=styles[k], label=k[5:])
    ax2.set_xscale("log", base=2)
    ax2.set_xticks(pg or [16])
    ax2.set_xticklabels([str(p) for p in (pg or [16])])
    if one:
        ax2.set_title("page size, B=1 L=%dK %d/%d" % (one[0]["nk"] // 1024, one[0]["H"], one[0]["Hkv"]), fontsize=10)
    ax2.set_xlabel("tokens per page")
    ax2.grid(True, alpha=0.25)
    if bw:
        ax2.axhline(bw, color="#bbbbbb", lw=1)
    ax2.set_ylabel("KV GB/s")
    ax2.legend(fontsize=7.5)
    fig.tight_layout(rect=(0, 0.04, 1, 1))
    footer(fig, res)
    path = os.path.join(out_dir, "decode_gbps.png")
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


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
    path = os.path.join(out_dir, "lineage.png")
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def draw_all(res, out_dir):
    os.makedirs(out_dir, exist_ok=True)
    rows = bench_report.enrich(res)
    jobs = []
    chapters = sorted({r["chapter"] for r in rows if r.get("kind") == "ours"})
    for c in chapters:
        for pss in ("fwd", "bwd"):
            jobs.append((fig_chapter, (res, rows, c, pss, out_dir)))
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
    if len(sys.argv) != 3:
        sys.exit("usage: bench_plots.py RESULTS_JSON OUT_DIR")
    for p in draw_all(read_json(sys.argv[1]), sys.argv[2]):
        print(p)
