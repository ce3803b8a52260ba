#!/usr/bin/env python3
"""Chapter 07's decode kernels next to their peers: a thin call of ./tutorial bench (bench/lineage.py).

    python3 bench/ch07_decode.py                                   same as: ./tutorial bench --chapters 07
    python3 bench/ch07_decode.py --binary B/bin/ch07_paged_radix    the binaries of build folder B
    python3 bench/ch07_decode.py --markdown                         also print the decode table

Runs `ch07_paged_radix decode --sweep --json` (every kernel checked against the fp64
reference, then timed) and SDPA's cuDNN and flash backends and FlashAttention-4 on the same
shapes (K/V contiguous, bf16), with the read ceiling of the same run. Results in
BUILD_DIR/bench/: the table ch07-decode of results.md, decode_gbps.png, results.json/.csv.
Other options pass through to ./tutorial bench (--quick, --out, ...).
"""
import os
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)


def main():
    args, extra, markdown = sys.argv[1:], [], False
    if "--markdown" in args:
        args.remove("--markdown")
        markdown = True
    if "--binary" in args:
        i = args.index("--binary")
        extra = ["--build-dir", os.path.dirname(os.path.dirname(os.path.abspath(args[i + 1])))]
        args = args[:i] + args[i + 2:]
    cmd = [sys.executable, os.path.join(HERE, "lineage.py"), "--chapters", "07"] + extra + args
    r = subprocess.run(cmd, stdout=subprocess.PIPE, text=True)
    sys.stdout.write(r.stdout)
    if markdown:
        import bench_report
        md = [p for p in r.stdout.split() if p.endswith("results.md")]
        table = bench_report.extract_section(open(md[0]).read(), "ch07-decode") if md else None
        print(table or "no decode table in this run (see the notes of results.md)")
    return r.returncode


if __name__ == "__main__":
    sys.exit(main())
