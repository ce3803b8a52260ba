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
import glob
import shutil
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


def ncu_binary():
    for c in [shutil.which("ncu"), "/usr/local/cuda/bin/ncu", *sorted(glob.glob("/opt/nvidia/nsight-compute/*/ncu"))]:
        if c and os.path.exists(c):
            return c
    raise SystemExit("ncu not found")


def ncu(cmd, kernel_regex, timeout):
    args = [ncu_binary(), "--metrics", "gpu__time_duration.sum", "--clock-control", "none", "--csv", "--print-units", "base",
            "--kernel-name-base", "mangled", "-k", "regex:" + kernel_regex] + cmd
    try:
        r = subprocess.run(args, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        print(f"  ncu: {' '.join(cmd[:3])} ... ran past {timeout} s", flush=True)
        return []
    rows = []
    text = r.stdout[r.stdout.find('"ID"'):] if '"ID"' in r.stdout else ""
    for row in csv.DictReader(io.StringIO(text)):
        if row.get("Metric Name") == "gpu__time_duration.sum":
            rows.append((row["Kernel Name"], float(row["Metric Value"].replace(",", ""))))
    if not rows:
        print(f"  ncu found no kernel ({' '.join(cmd[:3])} ...): {(r.stdout + r.stderr).strip()[-400:]}", flush=True)
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
    peer = ncu([sys.executable, "-c", CUDNN] + specs, "sdpa|fmha|attn|Attn|flash|cudnn", a.timeout * len(shapes))
    # k kernels a call (cuDNN may split one attention into several): the last call's k, summed.
    k = len(peer) // (3 * len(shapes)) if peer and len(peer) % (3 * len(shapes)) == 0 else 0
    per_shape = [sum(t for _, t in peer[3 * k * i + 2 * k: 3 * k * (i + 1)]) for i in range(len(shapes))] if k else None
    if per_shape is None and peer:
        print(f"  cuDNN: {len(peer)} kernels for {len(shapes)} shapes; names: {sorted(set(k for k, _ in peer))[:4]}",
              flush=True)
    print("| shape | our kernel (step) | ours, ncu (us) | cuDNN, ncu (us) | cuDNN / ours | ours TFLOP/s by ncu |")
    print("|---|---|---|---|---|---|")
    for i, (d, c, step, h) in enumerate(shapes):
        cmd = [a.bin, "--n", str(a.n), "--batch", str(b), "--heads", str(h), "--kv-heads", str(h), "--d", str(d),
               "--step", str(step), "--no-fp8-table", "--json"] + (["--causal"] if c else [])
        ours = [t for k, t in ncu(cmd, "4ch05.*kernel", a.timeout) if "kernel" in k]
        o = ours[-1] if ours else None
        p = per_shape[i] if per_shape else None
        fl = 4.0 * b * h * a.n * a.n * d / (2 if c else 1)
        label = f"d={d} N={a.n} B={b} H={h}{' causal' if c else ''}"
        cells = [label, f"v{step}", f"{o / 1e3:.1f}" if o else "-", f"{p / 1e3:.1f}" if p else "-",
                 f"{p / o:.3f}" if o and p else "-", f"{fl / (o * 1e-9) / 1e12:.0f}" if o else "-"]
        print("| " + " | ".join(cells) + " |", flush=True)


if __name__ == "__main__":
    main()
