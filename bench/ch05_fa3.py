#!/usr/bin/env python3
"""Chapter 05 next to its peers: a thin call of ./tutorial bench --chapters 05 (bench/lineage.py).

    python3 bench/ch05_fa3.py --bin build/bin/ch05_fa3_hopper [--n 8192] [--shapes all|quick]

For each of the FlashAttention-3 paper's forward shapes (16K tokens per batch at N = 8K: batch 2;
hidden 2048, so heads = 2048 / d; --shapes all: d = 128, 64, 256, causal and not; quick: d = 128)
the bench runs every step of ch05_fa3_hopper and its backward (each checked against the fp64
reference before it is timed) and, on the same shapes in the same run, the peers: PyTorch SDPA's
cuDNN and flash (FlashAttention-2) backends and FlashAttention-4 where importable (--peers also
takes efficient and flex). It prints, as before, a "# shape: ..." line per shape on stderr and a
Markdown table last: TFLOP/s by FlashAttention's count (4 B H N^2 d, halved when causal), the
cuBLAS GEMM ceiling of the same run, and the best bf16 step over cuDNN and FA4. The whole run is
in the bench's outputs (results.json, .csv, .md and the plots; --json copies results.json).

    python3 bench/ch05_fa3.py --bin NEW/ch05_fa3_hopper --before OLD/ch05_fa3_hopper [--rounds 2]

compares two builds of the chapter instead (no peers): the same shapes, each binary run --rounds
times in alternation, the best time of each kernel kept, and every kernel of NEW next to the same
kernel (by name) of OLD: `./tutorial bench --before OLD_BUILD`.

Options kept from the chapter's own script, and what they became in ./tutorial bench:
  --steps 8,10     --steps 8,10 (one launch with the list; forward only unless the plan has a backward here)
  --no-peers       --no-peers
  --peers a,b      --peers a,b (cudnn, fa4, flash, efficient, flex)
  --dims, --mask   --d, --mask
  --n, --batch     --n, --batch
  --extra FLAGS    --extra FLAGS (--no-backward becomes the bench's own --no-backward)
  --timeout S      --timeout S
Other options pass through to ./tutorial bench (--out, --budget, --verbose, --lab ...): the binary runs
its main path and final kernels, and with --lab (a binary built with -DTUTORIAL_LAB=ON) the lab's steps too.
"""
import argparse
import os
import shutil
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)


def bench_command(a, rest):
    """The ./tutorial bench command line (as bench/lineage.py arguments) for these options."""
    dims = a.dims or ("128" if a.shapes == "quick" else "128,64,256")
    cmd = ["--chapters", "05", "--n", str(a.n), "--d", dims, "--mask", a.mask, "--no-build", "--timeout",
           str(a.timeout)]
    binp = os.path.abspath(a.bin)
    if os.path.basename(os.path.dirname(binp)) == "bin":
        cmd += ["--build-dir", os.path.dirname(os.path.dirname(binp))]
    cmd += ["--binary", binp]
    if a.batch:
        cmd += ["--batch", str(a.batch)]
    if a.steps:
        cmd += ["--steps", a.steps]
    extra = a.extra.split()
    if "--no-backward" in extra:
        extra.remove("--no-backward")
        cmd.append("--no-backward")
    if extra:
        cmd.append("--extra=" + " ".join(extra))
    if a.before:
        cmd += ["--before", a.before, "--rounds", str(a.rounds)]
    elif a.no_peers:
        cmd.append("--no-peers")
    else:
        cmd += ["--peers", a.peers]
    return cmd + rest


def step_of(kernel):
    """A forward row's step: "v8", or the final kernels, "final" and "final-fp8"."""
    from bench_common import step_token
    t = step_token(kernel) if kernel.startswith("ch05 ") else None
    return t if t and not t.startswith("b") else None


def step_key(k):
    return int(k[1:]) if k[1:].isdigit() else {"final": 100, "final-fp8": 101}.get(k, 99)


def tables(res):
    """The chapter script's own table (stdout) and shape lines (stderr), from the bench's results."""
    from bench_common import speed
    rows = res.get("rows", [])
    shapes = []
    for r in rows:
        if r.get("chapter") == "05" and r.get("pass") == "fwd" and r.get("kind") == "ours":
            k = (r["d"], r["N"], r["B"], r["H"], bool(r.get("causal")))
            if k not in shapes:
                shapes.append(k)
    gemm = (res.get("ceilings") or {}).get("bf16_gemm_tflops")
    names, fp8 = set(), set()
    body = []
    for d, n, b, h, causal in shapes:
        def same(r):
            return r.get("pass") == "fwd" and (r["d"], r["N"], r["B"], r["H"], bool(r.get("causal"))) == (d, n, b, h,
                                                                                                       causal)
        steps = {}
        for r in rows:
            if r.get("kind") == "ours" and r.get("chapter") == "05" and same(r) and step_of(r["kernel"]):
                s = step_of(r["kernel"])
                steps[s] = r
                if r.get("dtype") == "fp8":
                    fp8.add(s)
        names.update(steps)
        peers = {r["kernel"]: speed(r) for r in rows if r.get("kind") == "peer" and same(r)}
        label = "d=%d N=%d B=%d H=%d%s" % (d, n, b, h, " causal" if causal else "")
        bf16 = [speed(r) for s, r in steps.items() if s not in fp8 and speed(r)]
        best = max(bf16) if bf16 else None
        print("# %s: " % label + ", ".join("%s %.1f" % (k, v) for k, v in peers.items() if v) + "; " +
              ", ".join("%s %s" % (s, "%.1f" % speed(r) if speed(r) else r.get("status", "?").upper())
                        for s, r in sorted(steps.items(), key=lambda kv: step_key(kv[0]))),
              file=sys.stderr, flush=True)
        body.append((label, steps, peers, best))
    order = sorted(names, key=step_key)
    head = ["shape", "cuBLAS GEMM", "cuDNN", "FA4", "FA2 (flash)"] + [
        k + (" fp8 (kernel alone)" if k in fp8 else "") for k in order] + ["best bf16 / cuDNN", "best bf16 / FA4"]
    out = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for label, steps, peers, best in body:
        cells = [label, "%.0f" % gemm if gemm else "-"]
        cells += ["%.0f" % peers[p] if peers.get(p) else "-" for p in ("sdpa_cudnn", "fa4", "sdpa_flash")]
        for k in order:
            r = steps.get(k)
            v = speed(r) if r else None
            cells.append("-" if r is None else ("%.1f" % v if v else {"failed": "FAIL"}.get(r.get("status"), "-")))
        cells += ["%.3fx" % (best / peers[p]) if best and peers.get(p) else "-" for p in ("sdpa_cudnn", "fa4")]
        out.append("| " + " | ".join(cells) + " |")
    if fp8:
        out.append("")
        out.append("fp8 columns: the attention kernel alone, without the separate pass that prepares its inputs "
                   "(Hadamard, scales, V^T); the binary times that pass too and gives both, and the rate with it, "
                   "in the row's note. The ratios to cuDNN and FA4 use bf16 steps only.")
    return "\n".join(out)


def parser():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], epilog=__doc__.split("\n\n", 1)[1],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--bin", required=True, help="path to ch05_fa3_hopper")
    ap.add_argument("--n", type=int, default=8192)
    ap.add_argument("--batch", type=int, help="default: 16384 / N")
    ap.add_argument("--shapes", choices=["all", "quick"], default="all")
    ap.add_argument("--json", help="copy the run's results.json here")
    ap.add_argument("--timeout", type=int, default=300)
    ap.add_argument("--before", help="an older ch05_fa3_hopper (or its build folder): compare the two builds, no peers")
    ap.add_argument("--rounds", type=int, default=1, help="with --before: runs of each binary, best kept")
    ap.add_argument("--dims", help="only these head dims, e.g. 64,256")
    ap.add_argument("--mask", choices=["both", "causal", "none"], default="both", help="causal shapes, others, or both")
    ap.add_argument("--steps", help="only these steps of the binary, e.g. 8,10 (one run each)")
    ap.add_argument("--no-peers", action="store_true", help="time the steps only")
    ap.add_argument("--extra", default="", help="more flags for the binary, e.g. --no-backward")
    ap.add_argument("--peers", default="cudnn,fa4,flash", help="which peers to time (cudnn, fa4, flash, efficient, flex)")
    ap.add_argument("--print-command", action="store_true", help=argparse.SUPPRESS)
    return ap


def main():
    ap = parser()
    a, rest = ap.parse_known_args()
    cmd = [sys.executable, os.path.join(HERE, "lineage.py")] + bench_command(a, rest)
    if a.print_command:
        print(" ".join(cmd[1:]))
        return 0
    r = subprocess.run(cmd, stdout=subprocess.PIPE, text=True)
    paths = r.stdout.split()
    js = [p for p in paths if p.endswith("results.json")]
    if not js:
        sys.stdout.write(r.stdout)
        return r.returncode or 1
    from bench_common import read_json
    import bench_report
    res = read_json(js[0])
    if a.json:
        shutil.copyfile(js[0], a.json)
    if a.before:
        print(bench_report.before_after_table(res, bench_report.enrich(res)) or "(no kernel ran in both builds)")
    else:
        print(tables(res))
    print("\n" + "\n".join(paths), file=sys.stderr)
    return r.returncode


if __name__ == "__main__":
    sys.exit(main())
