"""results.json -> results.csv and results.md (the tables the READMEs quote).

Everything here is a pure function of the results file (and, for the lab's table, of the
step files' headers that name each lab step's parent), so that CI can regenerate the tables
from the recorded run in the repository and compare. Rules the tables keep:

* a row whose status is not "ok" shows its status (FAIL, not run, n/a), never a speed;
* a peer that was absent from the run is a column that says "absent";
* every ratio is ours / peer from the same run; nothing is rounded in our favour;
* a chapter with a main path and a lab (chapter 05, bench_common.MAIN_PATH) shows its main path,
  its final kernels and the peers; its lab steps get tables of their own only when asked
  (`markdown(res, lab=True)`, `./tutorial bench --lab`, `--report FILE --lab`), and the
  ch05-lab section (each lab step against its parent) whenever the run measured lab steps.
"""
import csv
import glob
import io
import json
import os
import re
import statistics
import sys

import final_vs_steps

from bench_common import (CH06_MODEL_CASES, CH06_SPARSE, CH06_SPARSE_TABLE, DECODE_PEERS, FINAL_KERNEL, FP8_PEERS,
                          LAB_PARENTS, MAIN_PATH, PEER_LABEL, PEERS, SOFTMAX_PEERS, clean_row, fp8_prep, is_lab_row,
                          read_json, shape_key, shape_text, speed, step_token)

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

CEILING_KEY = {"bf16_gemm": "bf16_gemm_tflops", "fp8_gemm": "fp8_gemm_tflops", "read": "read_gbps"}
CEILING_NAME = {"bf16_gemm": "bf16 GEMM", "fp8_gemm": "FP8 GEMM", "read": "read bandwidth"}
STATUS_TEXT = {"failed": "FAIL", "unsupported": "n/a", "not run": "not run", "error": "error",
               "unchecked": "unchecked"}


# ============================================================================ derived fields

def enrich(res):
    """Cleans every row (no speed unless it passed), then adds the share of the same-run
    ceiling and the ratio to every peer on the same shape. Returns the rows."""
    rows = [clean_row(dict(r)) for r in res.get("rows", [])]
    ce = res.get("ceilings", {})
    peers_at = {}
    for r in rows:
        if r.get("kind") == "peer" and speed(r):
            peers_at.setdefault(shape_key(r), {})[r["kernel"]] = speed(r)
    for r in rows:
        v = speed(r)
        if v is None:
            continue
        c = ce.get(CEILING_KEY.get(r.get("ceiling"), ""), None)
        r["share"] = v / c if c else None
        if r.get("kind") == "ours":
            r["vs"] = {p: v / x for p, x in peers_at.get(shape_key(r), {}).items()}
    return rows


def peer_present(res, peer):
    """True when the peer was importable in this run (it may still lack a kernel for a shape)."""
    return res.get("peers", {}).get(peer) == "available"


def short_commit(head):
    """A commit as `git rev-parse --short` prints it: a full hash cut to 7 characters."""
    return head[:7] if head and len(head) > 12 and re.match(r"^[0-9a-f]+$", head) else head


def commit_text(run):
    """"commit 09430b9 (uncommitted changes)" (git_dirty), "commit 09430b9 (clean tree)", from the
    run's git_head and git_dirty ("" without a git_head). A run on a machine that got a copy of the
    tree (BENCH_COMMIT, run.commit) names that commit: its own git state is not the tree's, and the
    copy is the committed tree, clean by construction."""
    if run.get("commit"):
        return "commit %s (clean tree: the committed tree, copied to the GPU machine)" % short_commit(run["commit"])
    head = short_commit(run.get("git_head"))
    if not head:
        return ""
    dirty = run.get("git_dirty")
    return "commit %s (%s)" % (head, "uncommitted changes" if dirty else "clean tree" if dirty is False
                               else "tree state not recorded")


def cpu_record_line(run, record, page_dir, script):
    """The provenance line of a table computed by a CPU model (bench/ch03_linear.py,
    bench/ch07_int4.py): the CPU, date, command and commit of `run`, and the record's link as seen
    from the page's folder."""
    commit = commit_text(run)
    return ("Computed by the CPU model on one %s on %s by `%s`, %s; generated from [%s](%s) by "
            "`%s` (never typed by hand)." % (
                run.get("cpu"), (run.get("date") or "?")[:10], run.get("command"),
                "at " + commit if commit else "commit not recorded", os.path.relpath(record, ROOT),
                os.path.relpath(record, page_dir), script))


def run_line(res):
    r = res.get("run", {})
    clocks = r.get("clocks") or {}
    s = "%s, driver %s, SM clock %s MHz (max %s), memory %s MHz, %s, `%s`" % (
        r.get("gpu"), r.get("driver"), clocks.get("sm_mhz"), clocks.get("max_sm_mhz"), clocks.get("mem_mhz"),
        r.get("date"), r.get("command"))
    if r.get("git_head"):
        s += ", at " + commit_text(r)
    if r.get("commit"):
        s += ", commit %s" % r["commit"]
    return s


def fmt_speed(r, with_share=True):
    if r is None:
        return "-"
    v = speed(r)
    if v is None:
        return STATUS_TEXT.get(r.get("status"), r.get("status") or "-")
    s = "%.0f" % v if v >= 10 else "%.1f" % v
    if with_share and r.get("share"):
        s += " (%.0f%%)" % (100 * r["share"])
    return s


def fmt_ratio(x):
    return "%.2fx" % x


# ============================================================================ csv

CSV_FIELDS = ["chapter", "kernel", "kind", "pass", "d", "N", "nk", "B", "H", "Hkv", "causal", "page_size", "dtype",
              "status", "unit", "value", "time_ms", "tflops", "gbps", "ceiling", "ceiling_value", "share",
              "prep_ms", "tflops_with_prep"] + \
             ["vs_" + p for p in PEERS + FP8_PEERS + SOFTMAX_PEERS] + \
             ["max_abs_err", "flops", "bytes", "note", "gpu", "driver", "sm_clock_mhz", "mem_clock_mhz", "date",
              "command", "commit"]


def csv_text(res):
    rows = enrich(res)
    run = res.get("run", {})
    ce = res.get("ceilings", {})
    buf = io.StringIO()
    w = csv.DictWriter(buf, fieldnames=CSV_FIELDS, extrasaction="ignore", lineterminator="\n")
    w.writeheader()
    for r in rows:
        out = {k: r.get(k) for k in CSV_FIELDS}
        out["value"] = speed(r)
        prep = fp8_prep(r) if r.get("kind") == "ours" and r.get("dtype") == "fp8" else None
        if prep:
            out["prep_ms"], out["tflops_with_prep"] = prep[0], prep[2]
        out["ceiling_value"] = ce.get(CEILING_KEY.get(r.get("ceiling"), ""))
        for p, x in (r.get("vs") or {}).items():
            out["vs_" + p] = "%.4f" % x
        for k in ("share", "time_ms", "tflops", "gbps", "value", "max_abs_err", "prep_ms", "tflops_with_prep"):
            if isinstance(out.get(k), float):
                out[k] = "%.6g" % out[k]
        clocks = run.get("clocks") or {}
        out.update(gpu=run.get("gpu"), driver=run.get("driver"), sm_clock_mhz=clocks.get("sm_mhz"),
                   mem_clock_mhz=clocks.get("mem_mhz"), date=run.get("date"), command=run.get("command"),
                   commit=run.get("commit"))
        w.writerow(out)
    return buf.getvalue()


# ============================================================================ markdown

def md_table(head, body):
    out = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    out += ["| " + " | ".join(str(c) for c in row) + " |" for row in body]
    return "\n".join(out)


def section(name, title, text, intro=""):
    """A named block of results.md: the README generator copies it by name."""
    parts = ["<!-- table:%s -->" % name, "### " + title, ""]
    if intro:
        parts += [intro, ""]
    parts += [text, "<!-- /table:%s -->" % name, ""]
    return "\n".join(parts)


def peer_cell(res, by, key, peer, with_share=False):
    if not peer_present(res, peer):
        return "absent"
    r = by.get((key, peer))
    return "not run" if r is None else fmt_speed(r, with_share)


def chapter_kernels(rows, chapter, pss, which="all"):
    """The chapter's kernels of one pass, in the order of the rows. which: "all", "main" (a chapter
    with a lab: its main path and final kernels; any other chapter: all) or "lab" (its lab steps)."""
    seen = []
    for r in rows:
        if r.get("chapter") == chapter and r.get("pass") == pss and r["kernel"] not in seen and r.get("kind") == "ours":
            if which == "main" and is_lab_row(r) or which == "lab" and not is_lab_row(r):
                continue
            seen.append(r["kernel"])
    return seen


def has_lab_rows(rows):
    return any(is_lab_row(r) for r in rows)


def attention_table(res, rows, chapters, pss, which="all"):
    """One row per shape; a column per kernel of the chapters, then the peers, then the
    best kernel over each peer. Chapter 06's model cases and sparse patterns beside FlexAttention have
    tables of their own (model_table, sparse_table); the sparse patterns' rows of the mask sweep
    (B = 16K tokens / N, the backward too) are left to the lab's table (which="lab") and results.json."""
    rows = [r for r in rows if r.get("variant") not in CH06_MODEL_CASES and r.get("table") != CH06_SPARSE_TABLE
            and not (which == "main" and r.get("variant") in CH06_SPARSE)]
    kernels = [k for c in chapters for k in chapter_kernels(rows, c, pss, which)]
    if not kernels:
        return None
    by = {(shape_key(r), r["kernel"]): r for r in rows}
    shapes = sorted({shape_key(r) for r in rows if r["kernel"] in kernels},
                    key=lambda k: (k[1], k[9] or "", k[6], k[7], k[2]))
    peers = PEERS
    # an FP8 kernel's time leaves out the pass that prepares its inputs (the row's note gives both)
    fp8 = {r["kernel"] for r in rows if r["kernel"] in kernels and r.get("dtype") == "fp8"}
    with_var = any(k[9] for k in shapes)
    with_gqa = any(k[5] != k[6] for k in shapes)
    head = ["d", "N", "causal"] + (["mask"] if with_var else []) + (["Hq/Hkv"] if with_gqa else []) + \
           [(k[5:] if k.startswith("ch") else k) + (" (kernel alone)" if k in fp8 else "") for k in kernels] + \
           [PEER_LABEL[p] for p in peers] + ["best / " + PEER_LABEL[p] for p in ("fa4", "sdpa_cudnn", "sdpa_flash")]
    body = []
    for key in shapes:
        cells = [key[1], key[2], "yes" if key[7] else "no"] + ([key[9] or "-"] if with_var else []) + \
            (["%s/%s" % (key[5], key[6])] if with_gqa else [])
        ours = [by.get((key, k)) for k in kernels]
        cells += [fmt_speed(r) for r in ours]
        cells += [peer_cell(res, by, key, p) for p in peers]
        # best: the fastest kernel in the peers' precision (bf16): an FP8 kernel is not compared with them
        best = max([speed(r) for r in ours if r is not None and speed(r) and r.get("dtype") != "fp8"] or [0]) or None
        for p in ("fa4", "sdpa_cudnn", "sdpa_flash"):
            pr = by.get((key, p))
            if not peer_present(res, p):
                cells.append("absent")
            elif best is None or pr is None or not speed(pr):
                cells.append("-")
            else:
                cells.append(fmt_ratio(best / speed(pr)))
        body.append(cells)
    return md_table(head, body)


def fp8_peer_cell(res, by, key, peer):
    """A cell of an FP8 peer: "not measured yet" for a run that predates the peer (its peers list does
    not name it), else as peer_cell()."""
    if peer not in res.get("peers", {}):
        return "not measured yet"
    return peer_cell(res, by, key, peer)


def fp8_table(res, rows, chapter="05", which="main"):
    """Chapter 05's FP8 forward kernels against the FP8 peers, one row per shape: each FP8 kernel's rate
    with its time alone and with its preparation pass added, each FP8 peer, and each kernel's time alone
    over each peer's (the peers take FP8 inputs: their time has no preparation in it). None without FP8
    rows of ours."""
    rows = [r for r in rows if r.get("variant") not in CH06_MODEL_CASES]
    kernels = [k for k in chapter_kernels(rows, chapter, "fwd", which)
               if any(r["kernel"] == k and r.get("dtype") == "fp8" for r in rows)]
    if not kernels:
        return None
    by = {(shape_key(r), r["kernel"]): r for r in rows}
    shapes = sorted({shape_key(r) for r in rows if r["kernel"] in kernels},
                    key=lambda k: (k[1], k[7], k[2]))
    name = lambda k: k[5:] if k.startswith("ch") else k  # noqa: E731
    head = ["d", "N", "causal"]
    for k in kernels:
        head += ["%s: kernel alone" % name(k), "%s: with preparation" % name(k)]
    head += [PEER_LABEL[p] for p in FP8_PEERS]
    head += ["%s (kernel alone) / %s" % (name(k), PEER_LABEL[p]) for k in kernels for p in FP8_PEERS]
    body = []
    for key in shapes:
        cells = [key[1], key[2], "yes" if key[7] else "no"]
        for k in kernels:
            r = by.get((key, k))
            prep = fp8_prep(r) if r is not None else None
            cells += [fmt_speed(r, False),
                      ("%.0f" % prep[2] if prep and prep[2] else fmt_speed(r, False) if not speed(r or {}) else "-")]
        cells += [fp8_peer_cell(res, by, key, p) for p in FP8_PEERS]
        for k in kernels:
            for p in FP8_PEERS:
                r, pr = by.get((key, k)), by.get((key, p))
                cells.append(fmt_ratio(speed(r) / speed(pr)) if r is not None and pr is not None and speed(r)
                             and speed(pr) else "-")
        body.append(cells)
    return md_table(head, body)


MODEL_OURS_FWD = ("ch06 mask final sm90a forward", "ch06 mask sm90a forward")
MODEL_OURS_BWD = ("ch06 mask final backward",)


def model_cell(r, peer=False):
    """A cell of the model table: TFLOP/s where the row passed, else what happened, as text."""
    if r is None:
        return "not run"
    if speed(r):
        return fmt_speed(r, False)
    st = r.get("status")
    note = r.get("note") or ""
    if st == "unsupported":
        if not peer and "not built" in note:
            m = re.search(r"not built for d ?= ?\d+", note)
            return m.group(0) if m else "not built"
        return "not supported"
    return STATUS_TEXT.get(st, st or "-")


def model_table(rows):
    """Chapter 06's model cases: one row per (case, N): d, Hq/Hkv, the mask, our final sm90a forward,
    FA4 and FlexAttention (forward) and ours over each; our final backward. None without such rows."""
    mine = [r for r in rows if r.get("variant") in CH06_MODEL_CASES]
    if not mine:
        return None
    keys = sorted({(r["variant"], r.get("N")) for r in mine},
                  key=lambda k: (CH06_MODEL_CASES.index(k[0]), k[1] or 0))
    head = ["case", "N", "B", "d", "Hq/Hkv", "mask", "ours forward (final sm90a)", "FA4", "FlexAttention",
            "ours / FA4", "ours / Flex"]
    bhead = ["case", "N", "d", "ours backward (final)", "FA4 backward", "FlexAttention backward", "ours / FA4",
             "ours / Flex"]
    body, bbody, pbs = [], [], []
    for case, n in keys:
        at = [r for r in mine if r["variant"] == case and r.get("N") == n]
        fwd = next((r for k in MODEL_OURS_FWD for r in at if r["kernel"] == k and r.get("kind") == "ours"), None)
        bwd = next((r for k in MODEL_OURS_BWD for r in at if r["kernel"] == k and r.get("kind") == "ours"), None)
        pe = {p: next((r for r in at if r.get("kind") == "peer" and r["kernel"] == p and r.get("pass") == "fwd"), None)
              for p in ("fa4", "flex")}
        s0 = at[0]
        ratios = [fmt_ratio(speed(fwd) / speed(pe[p])) if fwd and pe[p] and speed(fwd) and speed(pe[p]) else "-"
                  for p in ("fa4", "flex")]
        body.append([case, n, s0.get("B"), s0.get("d"), "%s/%s" % (s0.get("H"), s0.get("Hkv")), s0.get("mask") or "-",
                     model_cell(fwd), model_cell(pe["fa4"], True), model_cell(pe["flex"], True)] + ratios)
        pb = {p: next((r for r in at if r.get("kind") == "peer" and r["kernel"] == p and r.get("pass") == "bwd"), None)
              for p in ("fa4", "flex")}
        pbs.append(pb)
        bratios = [fmt_ratio(speed(bwd) / speed(pb[p])) if bwd and pb[p] and speed(bwd) and speed(pb[p]) else "-"
                   for p in ("fa4", "flex")]
        bbody.append([case, n, s0.get("d"), model_cell(bwd) if bwd else "-",
                      model_cell(pb["fa4"], True) if pb["fa4"] else "-",
                      model_cell(pb["flex"], True) if pb["flex"] else "-"] + bratios)
    # the backward: a table of its own where the run timed a peer's backward; else our backward is
    # the forward table's last column
    if not any(speed(r) for p in pbs for r in p.values() if r):
        return md_table(head + ["ours backward (final)"], [r + [b[3]] for r, b in zip(body, bbody)])
    return md_table(head, body) + "\n\nThe backward (dQ, dK, dV):\n\n" + md_table(bhead, bbody)


def sparse_table(rows):
    """Chapter 06's structured sparse patterns (rows with table = CH06_SPARSE_TABLE): one row per
    pattern, always all four: the mask's parameters, our final sm90a and sm80 forwards, FlexAttention
    and ours over it, FA4 (which has none of them). A pattern the run did not measure reads "not
    measured yet"; a kernel or peer that cannot run it says so. None without such rows."""
    mine = [r for r in rows if r.get("table") == CH06_SPARSE_TABLE]
    if not mine:
        return None
    head = ["pattern", "N", "B", "d", "H", "mask", "ours forward (final sm90a)", "ours forward (sm80)",
            "FlexAttention", "ours / Flex", "FA4"]
    body = []
    for name in CH06_SPARSE:
        at = [r for r in mine if r.get("variant") == name]
        if not at:
            body.append([name] + ["not measured yet"] * (len(head) - 1))
            continue
        ours = lambda ks: next((r for k in ks for r in at if r["kernel"] == k and r.get("kind") == "ours"), None)  # noqa: E731
        o9, o8 = ours(MODEL_OURS_FWD), ours(("ch06 mask sm80 forward",))
        pe = {p: next((r for r in at if r.get("kind") == "peer" and r["kernel"] == p), None) for p in ("flex", "fa4")}
        ratio = fmt_ratio(speed(o9) / speed(pe["flex"])) if o9 and pe["flex"] and speed(o9) and speed(pe["flex"]) \
            else "-"
        s0 = at[0]
        body.append([name, s0.get("N"), s0.get("B"), s0.get("d"), s0.get("H"), s0.get("mask") or "-", model_cell(o9),
                     model_cell(o8), model_cell(pe["flex"], True), ratio, model_cell(pe["fa4"], True)])
    return md_table(head, body)


def lineage_entries(res, rows):
    """The lineage at a glance: each chapter's best kernel at its reference shape, next to
    the best peer measured on that shape. Reference: forward, d = 128, not causal, the
    largest N the chapter ran (chapter 02: the longest rows; chapter 07: the largest cache).
    A chapter with a final kernel (FINAL_KERNEL: chapter 05's "final forward") is that kernel
    wherever the run has it, at the largest N it ran; else, as for every other chapter, the
    fastest kernel that passed. Each entry says which rule picked it ("final" or "fastest")."""
    out = []
    chapters = sorted({r["chapter"] for r in rows if r.get("kind") == "ours"})
    for c in chapters:
        mine = [r for r in rows if r.get("chapter") == c and r.get("kind") == "ours"]
        if c == "02":
            cand = [r for r in mine if r.get("pass") == "softmax"]
            pick = lambda r: r.get("N") or 0  # noqa: E731
            peer_names = SOFTMAX_PEERS
        elif c == "07":  # the paged kernels (the chapter's point) on the largest bf16 cache, page size 16
            cand = [r for r in mine if r.get("pass") == "decode" and r.get("page_size") == 16
                    and not r.get("variant")]
            cand = [r for r in cand if "paged" in r["kernel"]] or cand
            pick = lambda r: (r.get("bytes") or 0, r.get("nk") or 0)  # noqa: E731
            peer_names = DECODE_PEERS
        else:
            fwd = [r for r in mine if r.get("pass") == "fwd" and r.get("d") == 128 and r.get("dtype") != "fp8"
                   and not r.get("variant")]
            cand = [r for r in fwd if not r.get("causal") and r.get("status") != "unsupported"] or \
                [r for r in fwd if r.get("causal")]  # a chapter that only runs causal: its causal shape
            pick = lambda r: r.get("N") or 0  # noqa: E731
            peer_names = PEERS
        if not cand:
            continue
        final = [r for r in cand if r["kernel"] == FINAL_KERNEL.get(c)]
        rule = "final" if final else "fastest"
        top = max(pick(r) for r in (final or cand))
        at = [r for r in cand if pick(r) == top]
        # one shape: without GQA where the chapter has such a shape (chapter 06 runs both)
        key = shape_key(min([r for r in at if not final or r in final],
                            key=lambda r: (r.get("H") != r.get("Hkv"), 0)))
        at = [r for r in at if shape_key(r) == key]
        ok = [r for r in at if speed(r) and (not final or r["kernel"] == FINAL_KERNEL[c])]
        best = max(ok, key=speed) if ok else None
        failed = [r["kernel"] for r in at if r.get("status") == "failed"]
        peers = [r for r in rows if r.get("kind") == "peer" and shape_key(r) == key and r["kernel"] in peer_names]
        okp = [r for r in peers if speed(r)]
        bestp = max(okp, key=speed) if okp else None
        absent = [p for p in peer_names if not peer_present(res, p)]
        out.append({"chapter": c, "shape": at[0], "best": best, "failed": failed, "peer": bestp, "absent": absent,
                    "rule": rule})
    return out


def chapter_best(at, chapter):
    """(row, rule) that stands for a chapter on one shape, from its forward rows `at` there: its
    final kernel (FINAL_KERNEL) where it passed, else its fastest bf16/fp16 kernel that passed."""
    ok = [r for r in at if speed(r) and r.get("dtype") != "fp8"]
    final = [r for r in ok if r["kernel"] == FINAL_KERNEL.get(chapter)]
    if final:
        return final[0], "final"
    return (max(ok, key=speed), "fastest") if ok else (None, None)


def lineage_table(res, rows):
    body = []
    for e in lineage_entries(res, rows):
        s = e["shape"]
        if s.get("pass") == "decode":
            shape = "decode B=%s, L=%s, %s/%s heads" % (s["B"], s["nk"], s["H"], s["Hkv"])
        elif s.get("pass") == "softmax":
            shape = "softmax rows of %s" % s["N"]
        else:
            shape = "d=%s, N=%s%s" % (s["d"], s["N"], ", causal" if s.get("causal") else "")
        b = e["best"]
        ours = ("%s: %s %s" % (b["kernel"][5:], fmt_speed(b, False), b["unit"])) if b else "no kernel passed"
        share = ("%.0f%% of %s" % (100 * b["share"], CEILING_NAME.get(b.get("ceiling"), "?"))
                 if b and b.get("share") else "-")
        p = e["peer"]
        peer = "%s %s" % (PEER_LABEL.get(p["kernel"], p["kernel"]), fmt_speed(p, False)) if p else \
            ("absent" if e["absent"] else "-")
        ratio = fmt_ratio(speed(b) / speed(p)) if b and p else "-"
        failed = ", ".join(k[5:] for k in e["failed"]) or "none"
        picked = "its final kernel" if e["rule"] == "final" else "fastest that passed"
        body.append(["%s" % e["chapter"], shape, ours, picked, share, peer, ratio, failed])
    measured = {e["chapter"] for e in lineage_entries(res, rows)}
    for c in res.get("run", {}).get("chapters", []):
        if c in measured:
            continue
        why = [n for n in res.get("notes", []) if ("ch%s" % c) in n or ("chapter %s" % c) in n]
        budget = [n for n in why if n.startswith("not run (--budget")]
        if budget:
            reason = "left out by the run's %s" % budget[0].split("(", 1)[1].split(")", 1)[0]
        else:
            reason = "; ".join(why[:2]) if why else "no kernel of this chapter reported a speed"
        body.append([c, "-", "not measured in this run: " + reason, "-", "-", "-", "-", "-"])
    body.sort(key=lambda r: r[0])
    if not body:
        return None
    return md_table(["chapter", "shape", "best kernel", "picked as", "share of ceiling", "best peer (same run)",
                     "best / best peer", "failed its check"], body)


def decode_table(res, rows, which="main"):
    """Chapter 07's decode table: the main path's steps ("main", with the peers) or the lab's ("lab")."""
    kernels = chapter_kernels(rows, "07", "decode", which)
    cfgs = []
    for r in rows:
        if r.get("pass") == "decode" and r.get("kind") == "ours" and r.get("B") and shape_key(r) not in cfgs \
                and r["kernel"] in kernels:
            cfgs.append(shape_key(r))
    if not cfgs:
        return None
    by = {(shape_key(r), r["kernel"]): r for r in rows}
    with_kv = any(k[9] for k in cfgs)  # 8-bit caches: a column says which format the row reads
    head = ["B", "L", "Hq/Hkv", "page"] + (["KV"] if with_kv else []) + [k[5:] for k in kernels] + \
        ([] if which == "lab" else [PEER_LABEL[p] for p in DECODE_PEERS] + ["chosen / cuDNN"])
    body = []
    for key in cfgs:
        ours = [by.get((key, k)) for k in kernels]
        cells = [key[4], key[3], "%s/%s" % (key[5], key[6]), key[8]] + \
            ([(key[9] or "bf16").replace("KV ", "")] if with_kv else []) + \
            [fmt_speed(r) + (" S=%d" % r["splits"] if r is not None and speed(r) and (r.get("splits") or 1) > 1
                             else "") for r in ours]
        if which == "lab":
            body.append(cells)
            continue
        for p in DECODE_PEERS:
            cells.append(peer_cell(res, by, key, p, True) if key[8] == 16 and not key[9] else "-")
        # the chapter's answer: its final kernel where the run has it, else the split heuristic's pick
        chosen = [r for r in ours if r and r["kernel"].startswith("ch07 final")] or \
            [r for r in ours if r and r.get("chosen") and "paged" in r["kernel"]]
        cud = by.get((key, "sdpa_cudnn"))
        if not peer_present(res, "sdpa_cudnn"):
            cells.append("absent")
        elif chosen and speed(chosen[0]) and cud is not None and speed(cud):
            cells.append(fmt_ratio(speed(chosen[0]) / speed(cud)))
        else:
            cells.append("-")
        body.append(cells)
    return md_table(head, body)


def softmax_table(res, rows):
    kernels = chapter_kernels(rows, "02", "softmax")
    if not kernels:
        return None
    by = {(shape_key(r), r["kernel"]): r for r in rows}
    shapes = sorted({shape_key(r) for r in rows if r["kernel"] in kernels}, key=lambda k: k[2])
    head = ["N (row length)"] + [k[5:] for k in kernels] + [PEER_LABEL[p] for p in SOFTMAX_PEERS]
    body = [[key[2]] + [fmt_speed(by.get((key, k))) for k in kernels] +
            [peer_cell(res, by, key, p, True) for p in SOFTMAX_PEERS] for key in shapes]
    return md_table(head, body)


def step_parents(chapter):
    """{step: parent step} of a chapter's step files, from their headers ("What changes from v8",
    or "(from v8)" / "(branches from v8)" in the first line; scripts/step_diffs.py reads them), in
    steps/ and steps/lab/; LAB_PARENTS where a file or its header is not there."""
    parents = dict(LAB_PARENTS.get(chapter, {}))
    try:
        sys.path.insert(0, os.path.join(ROOT, "scripts"))
        import step_diffs
        from pathlib import Path
    except ImportError:
        return parents
    for home in glob.glob(os.path.join(ROOT, "chapters", chapter + "_*", "steps")):
        for f in sorted(glob.glob(os.path.join(home, "*.cu")) + glob.glob(os.path.join(home, "lab", "*.cu"))):
            m = step_diffs.NAMED_RE.match(os.path.basename(f))
            if not m:
                continue
            try:
                h = step_diffs.header_parent(Path(f))
            except (step_diffs.ChainError, OSError, UnicodeDecodeError):
                continue
            if h:  # a final kernel by the name its rows carry: "final", "final-fp8" (the backward's: "final")
                parents[m.group(1) + m.group(2) + m.group(3)] = {"final_fp8": "final-fp8",
                                                                  "final_backward": "final"}.get(h, h)
    return parents


def step_number(kernel):
    t = step_token(kernel) or ""
    m = re.match(r"[vb](\d+)", t)
    return int(m.group(1)) if m else 1 << 20


def lab_ratio_entries(rows, chapter="05", parents=None):
    """Each lab step the run measured, against its parent: [{kernel, pass, parent (kernel or a step
    name not in the run), ratios (the step's time / the parent's on every shape both passed)}]. A
    backward step's "deterministic dQ" row is compared with its parent's deterministic row."""
    parents = step_parents(chapter) if parents is None else parents
    ours = [r for r in rows if r.get("chapter") == chapter and r.get("kind") == "ours"]
    out = []
    for pss in ("fwd", "bwd"):
        lab = [k for k in chapter_kernels(ours, chapter, pss, "lab")]
        lab.sort(key=lambda k: (step_number(k), k.endswith("deterministic dQ")))
        for k in lab:
            det = k.endswith("deterministic dQ")
            step = step_token(k)
            parent = parents.get(step)
            pk = next((x for x in chapter_kernels(ours, chapter, pss)
                       if parent and step_token(x) == parent and x.endswith("deterministic dQ") == det), None)
            ratios = []
            if pk:
                mine = {shape_key(r): r for r in ours if r["kernel"] == k and r.get("pass") == pss}
                theirs = {shape_key(r): r for r in ours if r["kernel"] == pk and r.get("pass") == pss}
                for key in sorted(set(mine) & set(theirs), key=lambda x: [str(v) for v in x]):
                    a, b = mine[key], theirs[key]
                    if speed(a) and speed(b) and a.get("time_ms") and b.get("time_ms"):
                        ratios.append(a["time_ms"] / b["time_ms"])
            out.append({"kernel": k, "pass": pss, "step": step, "parent_step": parent, "parent": pk,
                        "ratios": ratios})
    return out


def lab_ratio_table(rows, chapter="05", parents=None):
    entries = lab_ratio_entries(rows, chapter, parents)
    if not entries:
        return None
    body = []
    for e in entries:
        if e["parent"]:
            parent = e["parent_step"]  # the parent's own row names it in full
        elif e["parent_step"]:
            parent = "%s (not in this run)" % e["parent_step"]
        else:
            parent = "? (its header names none)"
        rs = e["ratios"]
        cells = [fmt_ratio(min(rs)), fmt_ratio(statistics.median(rs)), fmt_ratio(max(rs))] if rs else ["-"] * 3
        body.append([{"fwd": "forward", "bwd": "backward"}[e["pass"]], e["kernel"][5:], parent, len(rs)] + cells)
    return md_table(["pass", "lab step", "parent", "shapes", "time / parent's: min", "median", "max"], body)


def before_after_table(res, rows):
    """--before: each kernel of ours next to the same kernel of the older build, on every shape both
    ran (best of --rounds each). A kernel only one build has is listed with a dash on the other side."""
    before = {(r["kernel"][len("before: "):], shape_key(r)): r for r in rows if r.get("kind") == "before"}
    if not before:
        return None
    ours = {(r["kernel"], shape_key(r)): r for r in rows if r.get("kind") == "ours"}
    def natural(k):  # v2 before v10
        return (str(k[1]), [int(x) if x.isdigit() else x for x in re.split(r"(\d+)", k[0])])
    keys = sorted(set(before) | set(ours), key=natural)
    head = ["shape", "pass", "kernel", "before", "after", "after / before"]
    body = []
    for k in keys:
        b, a = before.get(k), ours.get(k)
        if a is None and b is None:
            continue
        r = a or b
        vb, va = speed(b) if b else None, speed(a) if a else None
        ratio = fmt_ratio(va / vb) if va and vb else ("- (new)" if b is None else "-")
        body.append([shape_text(r), r.get("pass", ""), k[0], fmt_speed(b, False) if b else "-",
                     fmt_speed(a, False) if a else "-", ratio])
    return md_table(head, body)


def markdown(res, lab=None):
    """results.md. lab: also the tables of the lab steps (default: when the run was made with --lab)."""
    if lab is None:
        lab = bool(res.get("run", {}).get("lab"))
    rows = enrich(res)
    run = res.get("run", {})
    ce = res.get("ceilings", {})
    out = ["# Benchmark results", "", "Run: " + run_line(res) + ".", ""]
    if not run.get("complete", True):
        out += ["**This run did not finish**: the tables hold what it measured before it stopped.", ""]

    def num(x, f="%.0f"):
        return f % x if isinstance(x, (int, float)) else "not measured"
    out += ["Ceilings, measured in the same run (%s): read %s GB/s; bf16 GEMM %s TFLOP/s; FP8 GEMM %s TFLOP/s." % (
        ce.get("source", "?"), num(ce.get("read_gbps")), num(ce.get("bf16_gemm_tflops")),
        num(ce.get("fp8_gemm_tflops"))), ""]
    pv = run.get("peer_versions") or {}
    pl = []
    for p in PEERS + SOFTMAX_PEERS + FP8_PEERS:
        if p in FP8_PEERS and p not in res.get("peers", {}):
            pl.append("%s: not measured yet (the run predates it)" % PEER_LABEL[p])
            continue
        st = res.get("peers", {}).get(p, "not run")
        pl.append("%s: %s" % (PEER_LABEL[p], "present" if st == "available" else "absent (%s)" % st))
    out += ["Peers (%s): %s." % (", ".join("%s %s" % kv for kv in sorted(pv.items())) or "none", "; ".join(pl)), ""]
    out += ["TFLOP/s by FlashAttention's count (forward 4·B·H·N²·d, halved for causal; backward 2.5x); "
            "(%) is the share of the same-run ceiling (bf16 GEMM; FP8 GEMM for fp8 kernels; read bandwidth for "
            "GB/s). B·N = 16K tokens, H·d = 2048. FAIL: the kernel failed its fp64 check and has no speed; "
            "n/a: no kernel for the shape; absent: the peer was not importable in this run.", ""]
    t = lineage_table(res, rows)
    if t:
        out.append(section("lineage", "The lineage at a glance", t,
                           "Each chapter's best kernel at its reference shape (forward, d = 128, not causal where "
                           "the chapter runs it, the largest N it ran), next to the best peer on the same shape in "
                           "the same run. The best kernel is chapter 05's final kernel where the run has it, else "
                           "(and for every other chapter) the fastest kernel that passed; \"picked as\" says which."))
    for c, title in (("01", "Chapter 01: naive attention"), ("03", "Chapter 03: FlashAttention-1"),
                     ("04", "Chapter 04: FlashAttention-2"), ("05", "Chapter 05: FlashAttention-3 on Hopper"),
                     ("06", "Chapter 06: variants")):
        for pss, what in (("fwd", "forward"), ("bwd", "backward")):
            t = attention_table(res, rows, [c], pss, "main")
            if t:
                intro = "best / peer: the fastest bf16 kernel of the row over the peer."
                if c in MAIN_PATH:
                    intro = ("The main path's steps and the final kernels (the lab's steps: %s). " % (
                        "their own tables in the run's results file, and LAB.md" if lab and has_lab_rows(rows) else
                        "not in this table; `--lab` adds their tables") + intro)
                out.append(section("ch%s-%s" % (c, pss), "%s, %s (TFLOP/s)" % (title, what), t, intro))
        if c == "05":
            for which, sec in (("main", "ch05-fp8"),) + ((("lab", "ch05-lab-fp8"),) if lab else ()):
                t = fp8_table(res, rows, c, which)
                if t:
                    out.append(section(sec, "%s, FP8 forward against cuDNN's FP8 forward (TFLOP/s)%s" % (
                        title, ", the lab's steps" if which == "lab" else ""), t,
                        "Our FP8 kernels twice: with the attention kernel's time alone (Q, K and V^T already in "
                        "E4M3) and with the preparation pass added (Hadamard rotation of Q and K, per-block "
                        "scales, quantisation, V^T: fp8_prepare.cu), both timed the same way. cuDNN FP8: cuDNN's "
                        "sdpa_fp8 forward on E4M3 Q, K, V with one scale a tensor (bench/peer_cudnn_fp8.py), "
                        "checked against fp32 first; it takes FP8 inputs, so its time has no preparation in it "
                        "and compares with the kernel-alone column: the ratio is that column over cuDNN FP8 "
                        "(above 1.00x: ours faster). not measured yet: the run predates the peer; n/a: cuDNN "
                        "builds no FP8 graph for the shape."))
        if c in MAIN_PATH and lab:
            for pss, what in (("fwd", "forward"), ("bwd", "backward")):
                t = attention_table(res, rows, [c], pss, "lab")
                if t:
                    out.append(section("ch%s-lab-%s" % (c, pss), "%s, the lab's steps, %s (TFLOP/s)" % (title, what),
                                       t, "The lab's steps (LAB.md) alone; best / peer: the fastest bf16 lab step "
                                       "of the row over the peer."))
        if c in MAIN_PATH:
            t = lab_ratio_table(rows, c)
            if t:
                out.append(section("ch%s-lab" % c, "Chapter %s's lab: each step against its parent" % c, t,
                                   "Each lab step's time over its parent's (the step its header names) at the "
                                   "shapes both passed in this run: smallest, median, largest. Below 1.00x the "
                                   "lab step is faster; deterministic-dQ rows against their parent's."))
    t = model_table(rows)
    if t:
        out.append(section("ch06-models", "Chapter 06: the masks in the shapes of real models (TFLOP/s)", t,
                           "`ch06_variants mask --model NAME`, B = 16K tokens / N (packed-docs: one packed batch of N), bf16; TFLOP/s over kept pairs "
                           "(4·B·Hq·kept·d forward, 2.5x backward). FA4 and FlexAttention are each checked against fp32 "
                           "before they are timed (forward: sampled rows; backward: dQ, dK, dV of the first and last "
                           "KV heads); ours / peer above 1.00x: ours "
                           "faster. not built: no kernel of ours for the head dim; not supported: the peer lacks "
                           "the case (the reason is the row's note in results.json)."))
    t = sparse_table(rows)
    if t:
        out.append(section("ch06-sparse", "Chapter 06: the structured sparse patterns beside FlexAttention (TFLOP/s)", t,
                           "`bench/ch06_masks.py --variants strided,fixed,longformer,bigbird`: B = 1, H = 16, d = "
                           "128, bf16, forward; TFLOP/s over kept pairs (4·B·H·kept·d). FlexAttention runs a "
                           "BlockMask of the same definition (BigBird's random blocks drawn by the same hash and "
                           "seed), checked against fp32 on sampled rows before it is timed; ours / Flex above "
                           "1.00x: ours faster. FA4's interface has none of these patterns."))
    t = before_after_table(res, rows)
    if t:
        ba = res.get("run", {}).get("before") or {}
        out.append(section("before-after", "This build against an older one (TFLOP/s)", t,
                           "--before %s: every launch of ours ran in both builds, alternating, %s round(s); "
                           "each kernel's best time of the rounds; a kernel that failed in any round is FAIL." % (
                               ba.get("build", "?"), ba.get("rounds", 1))))
    t = softmax_table(res, rows)
    if t:
        out.append(section("ch02-softmax", "Chapter 02: online softmax (GB/s)", t,
                           "2^28 fp32 scores in rows of N. GB/s = (S read once + what the kernel writes: P and "
                           "the LSE, or O for the fused kernel) / time, the same count for torch.softmax (S read, "
                           "P written): a kernel that sweeps S three times pays for it in time."))
    t = decode_table(res, rows)
    if t:
        out.append(section("ch07-decode", "Chapter 07: paged decode (KV GB/s)", t,
                           "Bytes of every cached key and value over the median time; d = 128; S: the key "
                           "splits a kernel used; chosen: the final kernel where the run has it, else the kernel the split heuristic "
                           "picks. Peers read contiguous bf16 K/V (page 16 rows only)."))
    t = decode_table(res, rows, "lab")  # the sweep runs the lab's decode steps too: their table whenever they ran
    if t:
        out.append(section("ch07-decode-lab", "Chapter 07's lab: decode (KV GB/s)", t,
                           "The lab's decode steps (chapter 07's LAB.md): KV GB/s (share of the read ceiling) and S, the key splits, "
                           "as in the ch07-decode table."))
    for c in sorted({r.get("chapter") for r in rows if step_token(r.get("kernel")) in ("final", "final-fp8")} - {None}):
        lab = any(is_lab_row(r) for r in rows if r.get("chapter") == c) if c in MAIN_PATH else None
        t = final_vs_steps.section_text(rows, c, lab=lab)
        if t:
            out.append(section("ch%s-final" % c, "Chapter %s: the final kernels against every step" % c, t))
    notes = res.get("notes") or []
    if notes:
        out += ["### Notes", ""] + ["- " + n for n in notes] + [""]
    return "\n".join(out)


def write_all(res, out_dir, lab=None):
    os.makedirs(out_dir, exist_ok=True)
    paths = []
    p = os.path.join(out_dir, "results.json")
    if not os.path.exists(p) or read_json(p) != res:
        with open(p, "w") as f:
            json.dump(res, f, indent=1)
    paths.append(p)
    for name, text in (("results.csv", csv_text(res)), ("results.md", markdown(res, lab))):
        p = os.path.join(out_dir, name)
        with open(p, "w") as f:
            f.write(text)
        paths.append(p)
    return paths


def extract_section(md, name):
    """The text of one named block of results.md (between its markers), or None."""
    b, e = "<!-- table:%s -->" % name, "<!-- /table:%s -->" % name
    if b not in md or e not in md:
        return None
    return md.split(b, 1)[1].split(e, 1)[0].strip("\n")
