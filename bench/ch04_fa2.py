#!/usr/bin/env python3
"""Chapter 04 next to its peers: a thin call of ./tutorial bench --chapters 04 (bench/lineage.py).

    python3 bench/ch04_fa2.py                  # d = 64 and 128, N = 512 ... 16K, causal and not, with the backward
    python3 bench/ch04_fa2.py --quick          # N in {2K, 8K} only
    python3 bench/ch04_fa2.py --ns 2048,8192   # these sequence lengths
    python3 bench/ch04_fa2.py --no-backward    # forward only
    python3 bench/ch04_fa2.py --json out.json  # also copy the run's results.json there

The main path of ch04_fa2 (v1-v6 and the final kernel; with --lab the lab's v7-v9 too, from a
build with -DTUTORIAL_LAB=ON) and its backward, each checked against the fp64 reference before it is
timed, at the FlashAttention papers' shapes (B*N = 16K tokens, H*d = 2048), next to PyTorch
SDPA's flash, cuDNN and efficient backends, FlexAttention and FlashAttention-4 where
importable, with the ceilings of the same run. The binary comes from build/bin, or from the
folder of $BIN_CH04. Prints the chapter's tables (ch04-fwd, ch04-bwd of results.md) last.
Other options pass through to ./tutorial bench (--out, --budget, --verbose, ...).
"""
import argparse
import os
import shutil
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="N in {2K, 8K}")
    ap.add_argument("--ns", help="comma-separated sequence lengths (default: 512 ... 16384)")
    ap.add_argument("--no-backward", action="store_true")
    ap.add_argument("--json", help="copy results.json here")
    a, rest = ap.parse_known_args()
    ns = a.ns or ("2048,8192" if a.quick else "512,1024,2048,4096,8192,16384")
    cmd = [sys.executable, os.path.join(HERE, "lineage.py"), "--chapters", "04", "--d", "64,128", "--n", ns]
    if a.no_backward:
        cmd.append("--no-backward")
    if os.environ.get("BIN_CH04"):
        cmd += ["--build-dir", os.path.dirname(os.path.dirname(os.path.abspath(os.environ["BIN_CH04"]))),
                "--no-build"]
    if os.environ.get("STEP_CH04"):
        print("bench/ch04_fa2.py: STEP_CH04 is no longer read: every step runs", file=sys.stderr)
    r = subprocess.run(cmd + rest, stdout=subprocess.PIPE, text=True)
    sys.stdout.write(r.stdout)
    paths = r.stdout.split()
    md = [p for p in paths if p.endswith("results.md")]
    if a.json:
        js = [p for p in paths if p.endswith("results.json")]
        if js:
            shutil.copyfile(js[0], a.json)
    if md:
        import bench_report
        text = open(md[0]).read()
        for name in ("ch04-fwd", "ch04-bwd"):
            table = bench_report.extract_section(text, name)
            if table:
                print("\n" + table)
    return r.returncode


if __name__ == "__main__":
    sys.exit(main())
