#!/usr/bin/env python3
"""Chapter 05's forward next to cuDNN by kernel duration (Nsight Compute), not by events.

    python3 chapters/05_fa3_hopper/scripts/ncu_fwd.py --bin build/bin/ch05_fa3_hopper \\
        --shape 128:0:13 --shape 128:1:13 ...      # d:causal:step, B = 16384 / N, H = 2048 / d

For each shape it runs, under `ncu --metrics gpu__time_duration.sum --clock-control none`
(the GPU at its own clocks; caches flushed before every profiled kernel, as the chapter's
event timing flushes the L2), the chapter binary with that one step (`--step S`, one
checked launch) and PyTorch SDPA with the cuDNN backend (three calls, the last one kept),
and prints both kernels' durations and their ratio. A rate from events and one from
ncu's duration differ by the launch gaps and the clocks; the ratio of the two kernels is
the claim that does not depend on the timing method.
"""
import argparse
import csv
import io
import os
import subprocess
import sys

CUDNN = r'''
import sys, torch
from torch.nn.attention import SDPBackend, sdpa_kernel
for spec in sys.argv[1:]:
    b, h, n, d, causal = (int(x) for x in spec.split(","))
    q, k, v = (torch.randn(b, h, n, d, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    torch.cuda.nvtx.range_push(spec)
    with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
        for _ in range(3):
            torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=bool(causal))
    torch.cuda.synchronize()
    torch.cuda.nvtx.range_pop()
    del q, k, v
'''


def ncu(cmd, kernel_regex, timeout):
    args = ["ncu", "--metrics", "gpu__time_duration.sum", "--clock-control", "none", "--csv", "--print-units", "base",
            "--kernel-name-base", "mangled", "-k", "regex:" + kernel_regex] + cmd
    r = subprocess.run(args, capture_output=True, text=True, timeout=timeout)
    rows = []
    text = r.stdout[r.stdout.find('"ID"'):] if '"ID"' in r.stdout else ""
    for row in csv.DictReader(io.StringIO(text)):
        if row.get("Metric Name") == "gpu__time_duration.sum":
            rows.append((row["Kernel Name"], float(row["Metric Value"].replace(",", ""))))
    if not rows:
        print(f"  ncu found no kernel ({' '.join(cmd[:3])} ...): {r.stderr.strip()[-300:]}", file=sys.stderr)
    return rows


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--bin", required=True)
    ap.add_argument("--shape", action="append", required=True, help="d:causal:step, e.g. 128:1:13")
    ap.add_argument("--n", type=int, default=8192)
    ap.add_argument("--timeout", type=int, default=60)
    a = ap.parse_args()
    b = max(1, 16384 // a.n)
    shapes = []
    for s in a.shape:
        d, c, step = (int(x) for x in s.split(":"))
        shapes.append((d, c, step, 2048 // d))
    # cuDNN: one process for every shape; its attention kernel is the longest of each group of three calls.
    specs = [f"{b},{h},{a.n},{d},{c}" for d, c, _, h in shapes]
    peer = ncu([sys.executable, "-c", CUDNN] + specs, "(?i)sdpa|fmha|attn|flash|cudnn", a.timeout * len(shapes))
    per_shape = [peer[3 * i: 3 * i + 3] for i in range(len(shapes))] if len(peer) == 3 * len(shapes) else None
    if per_shape is None and peer:
        print(f"  cuDNN: {len(peer)} kernels for {len(shapes)} shapes; names: {sorted(set(k for k, _ in peer))[:4]}",
              file=sys.stderr)
    print("| shape | our kernel (step) | ours, ncu (us) | cuDNN, ncu (us) | cuDNN / ours | ours TFLOP/s by ncu |")
    print("|---|---|---|---|---|---|")
    for i, (d, c, step, h) in enumerate(shapes):
        cmd = [a.bin, "--n", str(a.n), "--batch", str(b), "--heads", str(h), "--kv-heads", str(h), "--d", str(d),
               "--step", str(step), "--no-fp8-table", "--json"] + (["--causal"] if c else [])
        ours = [t for k, t in ncu(cmd, "4ch05.*kernel", a.timeout) if "kernel" in k]
        o = ours[-1] if ours else None
        p = per_shape[i][-1][1] if per_shape else None
        fl = 4.0 * b * h * a.n * a.n * d / (2 if c else 1)
        label = f"d={d} N={a.n} B={b} H={h}{' causal' if c else ''}"
        cells = [label, f"v{step}", f"{o / 1e3:.1f}" if o else "-", f"{p / 1e3:.1f}" if p else "-",
                 f"{p / o:.3f}" if o and p else "-", f"{fl / (o * 1e-9) / 1e12:.0f}" if o else "-"]
        print("| " + " | ".join(cells) + " |", flush=True)


if __name__ == "__main__":
    main()
