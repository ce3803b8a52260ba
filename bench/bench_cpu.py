"""./tutorial bench --cpu: the IO argument in pictures, from the CPU models alone (no GPU).

Every chapter's CPU model runs with the kernel's loop structure and counts the HBM
bytes it moves; each run is also checked against the fp64 reference. This runs them
over N (at a fixed on-chip budget M) and over M (at a fixed N), and plots the counted
traffic and the extra memory next to the papers' formulas:

* naive attention (chapter 01) moves Θ(N d + N²) bytes (S and P go through HBM);
* FlashAttention-1 (chapter 03) moves Θ(N² d² / M) (Theorem 2 of the paper);
* the lower bound: Q, K, V read once and O written once, 4 N d elements.

The formula lines are the papers' shapes scaled through one counted point (named in the
legend); the points are what the models counted. Outputs in BUILD_DIR/bench/cpu/:
io.json, io.md, io_traffic.png, io_extra.png, io_softmax_decode.png.
"""
import json
import os
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_common import read_json  # noqa: E402

B, H, D = 1, 1, 64
ELEM = 2  # bf16 inputs and outputs


def run(binary, args):
    r = subprocess.run([binary] + args + ["--device", "cpu", "--json"], capture_output=True, text=True, timeout=600)
    if r.returncode not in (0, 1):
        return None, (r.stderr.strip().splitlines() or ["exit %d" % r.returncode])[-1]
    try:
        return json.loads(r.stdout), None
    except ValueError:
        return None, "no JSON"


def attention_points(bins, ns, ms, n_fixed, m_fixed, log):
    """[{chapter, impl, pass, N, M, bytes, extra, pass_check}] from every attention chapter's model."""
    pts, notes = [], []
    runs = [(n, m_fixed, "N") for n in ns] + [(n_fixed, m, "M") for m in ms]
    for c in ("01", "03", "04", "05"):
        if c not in bins:
            continue
        for n, m, sweep in runs:
            args = ["--n", str(n), "--batch", str(B), "--heads", str(H), "--d", str(D), "--sram-bytes", str(m)]
            rep, err = run(bins[c], args)
            log("  ch%s N=%d M=%d%s" % (c, n, m, "" if rep else ": " + err))
            if not rep:
                notes.append("ch%s N=%d M=%d: %s" % (c, n, m, err))
                continue
            for r in rep.get("results", []):
                if r.get("device") != "cpu" or r.get("hbm_read_bytes") is None:
                    continue
                impl = r["impl"]
                if impl.startswith("ch01") and c != "01":
                    if "backward" not in impl:
                        continue  # chapter 01's own model gives its forward
                    impl = impl.replace("ch01 ", "") + " by ch03"  # chapter 01 has no backward binary row
                    c_row = "01"
                else:
                    c_row = c
                counted = "not run" not in (r.get("note") or "")
                pts.append({"chapter": c_row, "impl": impl, "pass": "bwd" if "backward" in impl else "fwd", "N": n,
                            "M": m, "sweep": sweep, "bytes": r["hbm_read_bytes"] + r["hbm_write_bytes"],
                            "extra": r.get("extra_bytes"), "check": r.get("pass"), "counted": counted})
    return pts, notes


def softmax_points(bins, ns, log):
    pts = []
    if "02" not in bins:
        return pts
    for n in ns:
        rows = 256
        rep, err = run(bins["02"], ["--n", str(rows), "--nk", str(n), "--batch", "1", "--heads", "1", "--d", "64"])
        log("  ch02 rows of %d%s" % (n, "" if rep else ": " + err))
        for r in (rep or {}).get("results", []):
            if r.get("device") == "cpu" and r.get("hbm_read_bytes") is not None:
                pts.append({"chapter": "02", "impl": r["impl"], "N": n, "rows": rows,
                            "bytes_per_score": (r["hbm_read_bytes"] + r["hbm_write_bytes"]) / (rows * n),
                            "check": r.get("pass")})
    return pts


def decode_points(bins, lens, log):
    pts = []
    if "07" not in bins:
        return pts
    for L in lens:
        rep, err = run(bins["07"], ["decode", "--nk", str(L), "--batch", "1", "--heads", "32", "--kv-heads", "8",
                                    "--lengths", "equal"])
        log("  ch07 decode L=%d%s" % (L, "" if rep else ": " + err))
        for r in (rep or {}).get("results", []):
            if r.get("device") == "cpu" and r.get("hbm_read_bytes") is not None:
                kv = 2.0 * L * 8 * 128 * ELEM
                pts.append({"chapter": "07", "impl": r["impl"].split(",")[0], "splits": r["impl"].split("S=")[-1]
                            if "S=" in r["impl"] else "1", "N": L, "bytes": r["hbm_read_bytes"] +
                            r["hbm_write_bytes"], "kv_bytes": kv, "extra": r.get("extra_bytes"),
                            "check": r.get("pass")})
    return pts


# ============================================================================ plots

def nice(ax, xs, bytes_y=True, kb=False):
    from matplotlib.ticker import FixedLocator, FuncFormatter, LogLocator, NullFormatter
    ax.xaxis.set_major_locator(FixedLocator(sorted(xs)))
    ax.xaxis.set_major_formatter(FuncFormatter(
        lambda v, _: ("%g KB" % v) if kb else ("%dK" % (v // 1024) if v >= 1024 else "%d" % v)))
    ax.xaxis.set_minor_formatter(NullFormatter())
    if bytes_y:
        def b(v, _):
            for unit, f in (("GB", 1e9), ("MB", 1e6), ("KB", 1e3)):
                if v >= f:
                    return "%g %s" % (v / f, unit)
            return "%g B" % v
        ax.yaxis.set_major_locator(LogLocator(base=10, subs=(1.0, 2.0, 5.0)))
        ax.yaxis.set_major_formatter(FuncFormatter(b))
        ax.yaxis.set_minor_formatter(NullFormatter())


COLORS = {"01": "#d62728", "02": "#ff7f0e", "03": "#9467bd", "04": "#1f77b4", "05": "#2ca02c", "07": "#e377c2"}


def plot(data, out_dir):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    pts = data["attention"]
    m_fixed, n_fixed = data["M_fixed"], data["N_fixed"]
    paths = []
    ideal = lambda n: 4.0 * B * H * n * D * ELEM  # noqa: E731

    def series(pss, sweep):
        out = {}
        for p in pts:
            if p["pass"] == pss and p["sweep"] == sweep:
                out.setdefault((p["chapter"], p["impl"]), []).append(p)
        return out

    fig, axes = plt.subplots(2, 2, figsize=(12.5, 9.5))
    for i, pss in enumerate(("fwd", "bwd")):
        for j, sweep in enumerate(("N", "M")):
            ax = axes[i][j]
            S = series(pss, sweep)
            x_of = (lambda p: p["N"]) if sweep == "N" else (lambda p: p["M"] / 1024)
            for (c, impl), ps in sorted(S.items()):
                ps = sorted(ps, key=x_of)
                ok = [p for p in ps if p["check"] is not False]
                ax.plot([x_of(p) for p in ok], [p["bytes"] for p in ok], marker="o", ms=4, color=COLORS.get(c),
                        label="ch%s %s" % (c, impl))
                bad = [p for p in ps if p["check"] is False]
                if bad:
                    ax.scatter([x_of(p) for p in bad], [p["bytes"] for p in bad], marker="x", color="red", s=50,
                               label="failed its fp64 check")
            # the papers' formulas through one counted point
            naive = sorted(S.get(("01", next((k[1] for k in S if k[0] == "01"), "")), []), key=x_of)
            fa1 = sorted(next((v for k, v in S.items() if k[0] == "03"), []), key=x_of)
            if sweep == "N":
                xs = sorted({p["N"] for p in pts if p["sweep"] == "N"})
                if naive:
                    r = naive[-1]
                    ax.plot(xs, [r["bytes"] * (x / r["N"]) ** 2 for x in xs], ls="--", color=COLORS["01"], lw=1,
                            label="Θ(N²), through N = %d" % r["N"])
                if fa1:
                    r = fa1[-1]
                    ax.plot(xs, [r["bytes"] * (x / r["N"]) ** 2 for x in xs], ls=":", color=COLORS["03"], lw=1.5,
                            label="Θ(N²d²/M) at M = %d KB, through N = %d" % (m_fixed // 1024, r["N"]))
                if pss == "fwd":
                    ax.plot(xs, [ideal(x) for x in xs], color="black", lw=1, label="ideal 4Nd (Q, K, V, O once)")
                ax.set_xscale("log", base=2)
                ax.set_xlabel("N (B = %d, H = %d, d = %d, M = %d KB)" % (B, H, D, m_fixed // 1024))
            else:
                xs = sorted({p["M"] / 1024 for p in pts if p["sweep"] == "M"})
                if fa1:
                    r = fa1[0]
                    ax.plot(xs, [r["bytes"] * (r["M"] / 1024) / x for x in xs], ls=":", color=COLORS["03"], lw=1.5,
                            label="Θ(N²d²/M), through M = %d KB" % (r["M"] // 1024))
                if pss == "fwd":
                    ax.axhline(ideal(n_fixed), color="black", lw=1, label="ideal 4Nd")
                ax.set_xscale("log", base=2)
                ax.set_xlabel("on-chip budget M, N = %d, d = %d" % (n_fixed, D))
            ax.set_yscale("log")
            nice(ax, xs, kb=sweep == "M")
            ax.set_ylabel("HBM bytes moved (counted)")
            ax.set_title("%s, against %s%s" % ("forward" if pss == "fwd" else "backward", sweep,
                                               " (chapters 04, 05: the kernels' fixed tiles, which M must hold)"
                                               if sweep == "M" else ""), fontsize=9.5)
            ax.grid(True, which="both", alpha=0.25)
            ax.legend(fontsize=6.5, loc="upper left")
    fig.suptitle("Counted HBM traffic of every chapter's CPU model, with the papers' formulas", fontsize=12)
    fig.tight_layout(rect=(0, 0, 1, 0.97))
    p = os.path.join(out_dir, "io_traffic.png")
    fig.savefig(p, dpi=110)
    plt.close(fig)
    paths.append(p)

    # extra memory against N
    fig, axes = plt.subplots(1, 2, figsize=(12.5, 4.8))
    for ax, pss in zip(axes, ("fwd", "bwd")):
        S = series(pss, "N")
        none = []
        for (c, impl), ps in sorted(S.items()):
            ps = sorted(ps, key=lambda p: p["N"])
            if all(not p["extra"] for p in ps):
                none.append("ch%s %s" % (c, impl))
                continue
            ax.plot([p["N"] for p in ps], [p["extra"] for p in ps], marker="o", ms=4, color=COLORS.get(c),
                    label="ch%s %s" % (c, impl))
        xs = sorted({p["N"] for p in pts if p["sweep"] == "N"})
        ax.plot(xs, [2.0 * x * x * 4 for x in xs], ls="--", color="#999999", lw=1, label="N² fp32 (S and P)")
        ax.plot(xs, [2.0 * x * 4 for x in xs], ls=":", color="#999999", lw=1, label="N fp32 (m and ℓ)")
        if none:
            ax.text(0.98, 0.03, "no extra memory at any N:\n" + "\n".join(none), transform=ax.transAxes,
                    ha="right", va="bottom", fontsize=7.5, bbox=dict(fc="white", ec="#cccccc"))
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        nice(ax, xs)
        ax.set_xlabel("N (d = %d)" % D)
        ax.set_ylabel("extra HBM bytes (beyond inputs and outputs)")
        ax.set_title("extra memory, %s" % ("forward" if pss == "fwd" else "backward"), fontsize=10)
        ax.grid(True, which="both", alpha=0.25)
        ax.legend(fontsize=7, loc="upper left")
    fig.tight_layout()
    p = os.path.join(out_dir, "io_extra.png")
    fig.savefig(p, dpi=110)
    plt.close(fig)
    paths.append(p)

    if data["softmax"] or data["decode"]:
        fig, axes = plt.subplots(1, 2, figsize=(12.5, 4.8))
        ax = axes[0]
        S = {}
        for q in data["softmax"]:
            S.setdefault(q["impl"], []).append(q)
        cmap = plt.get_cmap("Oranges")
        for i, (impl, ps) in enumerate(S.items()):
            ps = sorted(ps, key=lambda q: q["N"])
            ax.plot([q["N"] for q in ps], [q["bytes_per_score"] for q in ps], marker="o",
                    color=cmap(0.35 + 0.65 * (i + 1) / max(1, len(S))), label=impl)
        ax.set_xscale("log", base=2)
        nice(ax, sorted({q["N"] for q in data["softmax"]}), bytes_y=False)
        ax.set_xlabel("row length N (256 rows; the fused pass also reads V and writes O, d = 64)")
        ax.set_ylabel("HBM bytes per score (counted)")
        ax.set_title("chapter 02: softmax sweeps over S (fp32 scores)", fontsize=10)
        ax.grid(True, which="both", alpha=0.25)
        ax.legend(fontsize=7)
        ax = axes[1]
        S = {}
        for q in data["decode"]:
            S.setdefault(q["impl"], []).append(q)
        cmap = plt.get_cmap("RdPu")
        for i, (impl, ps) in enumerate(S.items()):
            ps = sorted(ps, key=lambda q: q["N"])
            ax.plot([q["N"] for q in ps], [q["bytes"] / q["kv_bytes"] for q in ps], marker="o",
                    color=cmap(0.4 + 0.6 * (i + 1) / max(1, len(S))), label=impl)
        ax.axhline(1.0, color="black", lw=1, label="ideal: every cached K, V byte once")
        ax.set_xscale("log", base=2)
        nice(ax, sorted({q["N"] for q in data["decode"]}), bytes_y=False)
        ax.set_xlabel("context length L (B = 1, 32/8 heads, d = 128; v2 splits the keys, and merges)")
        ax.set_ylabel("bytes moved / KV bytes")
        ax.set_title("chapter 07: decode traffic over the KV cache", fontsize=10)
        ax.grid(True, which="both", alpha=0.25)
        ax.legend(fontsize=7)
        fig.tight_layout()
        p = os.path.join(out_dir, "io_softmax_decode.png")
        fig.savefig(p, dpi=110)
        plt.close(fig)
        paths.append(p)
    return paths


def markdown(data):
    out = ["# Counted HBM traffic of the CPU models", "",
           "B = %d, H = %d, d = %d, bf16; M = %d bytes for the N sweep, N = %d for the M sweep. Bytes are what each "
           "chapter's CPU model counted while it computed the answer (checked against fp64)." % (
               B, H, D, data["M_fixed"], data["N_fixed"]), ""]
    ns = sorted({p["N"] for p in data["attention"] if p["sweep"] == "N"})
    impls = []
    for p in data["attention"]:
        if p["sweep"] == "N" and (p["chapter"], p["impl"]) not in impls:
            impls.append((p["chapter"], p["impl"]))
    by = {(p["chapter"], p["impl"], p["N"]): p for p in data["attention"] if p["sweep"] == "N"}
    out.append("| model | " + " | ".join("N = %d" % n for n in ns) + " |")
    out.append("|---|" + "---|" * len(ns))
    for c, impl in impls:
        cells = []
        for n in ns:
            p = by.get((c, impl, n))
            cells.append("-" if not p else ("FAIL" if p["check"] is False else "%.3g MB" % (p["bytes"] / 1e6)))
        out.append("| ch%s %s | %s |" % (c, impl, " | ".join(cells)))
    out.append("")
    if data["notes"]:
        out += ["Notes:", ""] + ["- " + n for n in data["notes"]] + [""]
    return "\n".join(out)


def main(build_dir, out_dir, chapters, quick=False):
    def log(s):
        print(s, file=sys.stderr, flush=True)
    bins = {c: os.path.join(build_dir, "bin", n) for c, n in chapters.items()
            if os.access(os.path.join(build_dir, "bin", n), os.X_OK)}
    if not bins:
        log("bench --cpu: no chapter binary in %s/bin" % build_dir)
        return 2
    os.makedirs(out_dir, exist_ok=True)
    ns = [256, 512, 1024, 2048] + ([] if quick else [4096])
    ms = [32 << 10, 48 << 10, 64 << 10, 96 << 10, 128 << 10, 192 << 10, 256 << 10]
    n_fixed, m_fixed = 1024, 224 << 10  # chapter 04's own default budget
    log("bench --cpu: the CPU models over N and M (%s)" % ", ".join("ch" + c for c in sorted(bins)))
    att, notes = attention_points(bins, ns, ms, n_fixed, m_fixed, log)
    data = {"B": B, "H": H, "d": D, "M_fixed": m_fixed, "N_fixed": n_fixed, "attention": att,
            "softmax": softmax_points(bins, [1024, 4096, 16384], log),
            "decode": decode_points(bins, [1024, 4096, 16384, 65536], log), "notes": notes}
    with open(os.path.join(out_dir, "io.json"), "w") as f:
        json.dump(data, f, indent=1)
    with open(os.path.join(out_dir, "io.md"), "w") as f:
        f.write(markdown(data))
    paths = [os.path.join(out_dir, "io.json"), os.path.join(out_dir, "io.md")]
    try:
        import matplotlib  # noqa: F401
        paths += plot(data, out_dir)
    except ImportError:
        py = "/usr/bin/python3"
        if os.path.exists(py) and os.path.realpath(py) != os.path.realpath(sys.executable):
            r = subprocess.run([py, os.path.abspath(__file__), "--plot", out_dir], capture_output=True, text=True)
            if r.returncode:
                log("bench --cpu: plots failed: " + r.stderr.strip()[-300:])
                return 1
            paths += r.stdout.split()
        else:
            log("bench --cpu: no plots: matplotlib is not importable (Debian: apt-get install python3-matplotlib)")
            return 1
    failed = [p for p in att if p["check"] is False]
    for p in paths:
        print(p)
    if failed:
        log("bench --cpu: %d model run(s) failed the fp64 check" % len(failed))
        return 1
    return 0


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "--plot":
        for p in plot(read_json(os.path.join(sys.argv[2], "io.json")), sys.argv[2]):
            print(p)
    else:
        sys.exit("usage: bench_cpu.py --plot OUT_DIR (or ./tutorial bench --cpu)")
