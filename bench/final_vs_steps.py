"""Each chapter's final kernels against every step of the chapter, lab included, in one run.

A chapter with a main path ends it in a final kernel per direction (forward, FP8 forward,
backward; chapter 07: decode). The final kernel is the chapter's answer to "what do I use?", so
at every shape the run measured it must be at least `BAR` x the fastest step of the chapter
(main path and lab) of the same pass, dtype and mode. This module finds, for every cell (a final
kernel on one shape), the fastest step, and writes:

  * a summary: how many cells hold the bar, and the smallest ratio;
  * a table of the cells where a step is faster than the final kernel by more than 1%.

bench_report.markdown() adds it to results.md as the section `chNN-final` for each chapter that
has a final kernel in the run, and bench_readme.py copies that section into a README or LAB.md
that has its markers.
"""

from __future__ import annotations

from bench_common import shape_key, speed, step_token

BAR = 0.98    # the final kernel against the fastest step of its chapter, at every shape
SHOWN = 0.99  # cells below this ratio are listed


def _mode(row):
    """What must match besides the shape: dtype, the backward's deterministic-dQ mode, and the
    KV layout: a decode kernel that reads contiguous K/V (no page table) solves another problem
    than a paged one, so it is not a paged final kernel's rival."""
    k = row.get("kernel") or ""
    return (row.get("dtype"), k.endswith("deterministic dQ"), "contiguous" in k)


def cells(rows, chapter):
    """[{final, step, final_speed, step_speed, ratio, row}] for every shape a final kernel of the
    chapter passed on; step is None where no step ran that shape."""
    ours = [r for r in rows if r.get("chapter") == chapter and r.get("kind") == "ours"]
    finals = [r for r in ours if step_token(r.get("kernel")) in ("final", "final-fp8") and speed(r)]
    out = []
    for f in finals:
        pool = [r for r in ours if step_token(r.get("kernel")) not in (None, "final", "final-fp8")
                and shape_key(r) == shape_key(f) and _mode(r) == _mode(f) and speed(r)]
        best = max(pool, key=speed) if pool else None
        out.append({"final": f["kernel"], "step": best["kernel"] if best else None, "final_speed": speed(f),
                    "step_speed": speed(best) if best else None,
                    "ratio": speed(f) / speed(best) if best else None, "row": f})
    return out


def _shape(r):
    if r.get("pass") == "decode":
        return "B=%s L=%s P=%s" % (r.get("B"), r.get("nk"), r.get("page_size"))
    nk = "" if r.get("nk") in (None, r.get("N")) else "/%s" % r["nk"]
    var = " %s" % r["variant"] if r.get("variant") else ""
    return "d=%s N=%s%s%s%s" % (r.get("d"), r.get("N"), nk, " causal" if r.get("causal") else "", var)


def section_text(rows, chapter, lab=True):
    """The section's markdown, or None when the run has no final kernel of the chapter. lab: whether
    the run timed the chapter's lab steps (the text says which steps the finals were held against);
    None for a chapter without a lab."""
    cs = [c for c in cells(rows, chapter) if c["ratio"] is not None]
    if not cs:
        return None
    held = sum(1 for c in cs if c["ratio"] >= BAR)
    worst = min(cs, key=lambda c: c["ratio"])
    lines = ["At %d of the %d cells (a final kernel on one shape) the final kernel is at least %.2fx the fastest "
             "of the chapter's %s, of the same pass, dtype and mode; the smallest ratio is "
             "%.3fx (%s, %s against %s)." % (held, len(cs), BAR, "steps" if lab is None else
                                             "steps, the lab's included" if lab else
                                             "main-path steps (this run did not time the lab)", worst["ratio"], worst["final"][5:],
                                             _shape(worst["row"]), worst["step"][5:]), ""]
    shown = sorted((c for c in cs if c["ratio"] < SHOWN), key=lambda c: c["ratio"])
    if not shown:
        lines.append("No step is faster than a final kernel by more than %d%% at any shape." % round(100 * (1 - SHOWN)))
        return "\n".join(lines) + "\n"
    lines += ["The cells where a step is faster by more than %d%% (below %.2fx: **bold**):" % (
        round(100 * (1 - SHOWN)), BAR), "",
              "| final kernel | shape | final | fastest step | step | final / step |", "|---|---|---|---|---|---|"]
    unit = lambda c: "%.0f" % c
    for c in shown:
        ratio = "%.3fx" % c["ratio"]
        if c["ratio"] < BAR:
            ratio = "**%s**" % ratio
        lines.append("| %s | %s | %s | %s | %s | %s |" % (c["final"][5:], _shape(c["row"]), unit(c["final_speed"]),
                                                      c["step"][5:], unit(c["step_speed"]), ratio))
    return "\n".join(lines) + "\n"
