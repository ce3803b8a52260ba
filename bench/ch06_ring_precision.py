#!/usr/bin/python3
"""Ring attention's precision study: the merge in bf16 against fp32 accumulators as P grows.

Runs `ch06_variants ring --precision-study` (the CPU model, against the fp64 reference),
reads the `csv,` lines it prints, writes the plot and prints the table in Markdown.

    /usr/bin/python3 bench/ch06_ring_precision.py [--binary build/bin/ch06_variants]
        [--out chapters/06_variants/ring/precision.png] [--from-text saved_output.txt]
        [-- extra ring options, default: --n 2048 --heads 1 --kv-heads 1 --d 64 --no-causal]
"""
import argparse
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DEFAULT_ARGS = ["--n", "2048", "--heads", "1", "--kv-heads", "1", "--d", "64", "--no-causal"]
FIELDS = ["P", "o_f32", "o_bf16", "o_naive", "o_tol", "dkv_f32", "dkv_bf16", "dkv_naive", "dkv_tol", "pass_f32",
          "pass_bf16"]


def parse(text):
    rows = []
    for line in text.splitlines():
        if not line.startswith("csv,"):
            continue
        vals = line.split(",")[1:]
        if len(vals) != len(FIELDS):
            raise SystemExit("unexpected csv line: " + line)
        r = dict(zip(FIELDS, vals))
        r["P"] = int(r["P"])
        for k in FIELDS[1:9]:
            r[k] = float(r[k])
        r["pass_f32"], r["pass_bf16"] = r["pass_f32"] == "1", r["pass_bf16"] == "1"
        rows.append(r)
    if not rows:
        raise SystemExit("no csv lines in the output (is it `ch06_variants ring --precision-study`?)")
    return rows


def table(rows):
    out = ["| P | O, fp32 acc | O, bf16 acc | O, naive bf16 | O tolerance | dK/dV, fp32 acc | dK/dV, bf16 acc | "
           "dK/dV, naive | dK/dV tolerance | passes (fp32 / bf16) |",
           "|---:|---:|---:|---:|---:|---:|---:|---:|---:|:---:|"]
    for r in rows:
        out.append("| %d | %.2e | %.2e | %.2e | %.2e | %.2e | %.2e | %.2e | %.2e | %s / %s |" % (
            r["P"], r["o_f32"], r["o_bf16"], r["o_naive"], r["o_tol"], r["dkv_f32"], r["dkv_bf16"], r["dkv_naive"],
            r["dkv_tol"], "yes" if r["pass_f32"] else "**no**", "yes" if r["pass_bf16"] else "**no**"))
    return "\n".join(out)


def plot(rows, out, title):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    P = [r["P"] for r in rows]
    fig, axes = plt.subplots(1, 2, figsize=(10, 4), sharex=True)
    for ax, key, name in ((axes[0], "o", "forward: O"), (axes[1], "dkv", "backward: dK, dV")):
        ax.plot(P, [r[key + "_bf16"] for r in rows], "o-", color="#e15759", label="bf16 accumulator")
        ax.plot(P, [r[key + "_f32"] for r in rows], "s-", color="#4e79a7", label="fp32 accumulator")
        ax.plot(P, [r[key + "_naive"] for r in rows], ":", color="gray", label="naive, same precision")
        ax.plot(P, [r[key + "_tol"] for r in rows], "--", color="black", label="acceptance tolerance")
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("ranks P (merges per row: P - 1)")
        ax.set_ylabel("max |error| against fp64")
        ax.set_title(name)
        ax.grid(True, which="both", alpha=0.3)
    axes[0].legend(fontsize=8)
    fig.suptitle(title, fontsize=9)
    fig.tight_layout()
    fig.savefig(out, dpi=120)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--binary", default=os.environ.get("BIN_CH06", os.path.join(ROOT, "build", "bin", "ch06_variants")))
    ap.add_argument("--out", default=os.path.join(ROOT, "chapters", "06_variants", "ring", "precision.png"))
    ap.add_argument("--from-text", help="parse a saved output instead of running the binary")
    ap.add_argument("extra", nargs="*", help="ring options (after --)")
    a = ap.parse_args()
    args = a.extra or DEFAULT_ARGS
    cmd = " ".join(["ch06_variants", "ring", "--precision-study"] + args)
    if a.from_text:  # the saved output of that command
        text = open(a.from_text).read()
    else:
        text = subprocess.run([a.binary, "ring", "--precision-study"] + args, check=True, capture_output=True,
                              text=True).stdout
    rows = parse(text)
    first = next((l for l in text.splitlines() if l.startswith("precision")), "")
    plot(rows, a.out, first + "\n" + cmd)
    print(table(rows))
    print("\nplot: " + os.path.relpath(a.out, ROOT))
    return 0


if __name__ == "__main__":
    sys.exit(main())
