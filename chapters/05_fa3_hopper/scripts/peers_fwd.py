#!/usr/bin/env python3
"""Chapter 05's forward next to cuDNN and FlashAttention-4, by events, in one run that fits a short request.

    python3 chapters/05_fa3_hopper/scripts/peers_fwd.py --bin build/bin/ch05_fa3_hopper \\
        --shape 8192:128:0:10,18 --shape 8192:128:1:6,19 --shape 2048:128:1:6,19 ...   # N:d:causal:steps
        [--peers cudnn,fa4]                                          # B = 16384 / N, H = 2048 / d

Our kernels: the chapter binary once per shape, `--step S1,S2,... --json` (the inputs uploaded
once; each step's kernel checked against the fp64 reference on sampled rows, then the median of
>= 20 event-timed runs with the L2 flushed before each). They run first, in a thread, while this process imports PyTorch and
FlashAttention-4 (CPU work only: no peer touches the GPU until ours are done). Then the peers
on the same shapes: PyTorch SDPA with the cuDNN backend and `flash_attn.cute.flash_attn_func`
([B, N, H, d]), each checked finite, then 3 warm-ups and the median of 20 event-timed calls
with the L2 flushed and left clean before each, as for ours (bench/peer_timer.py). TFLOP/s by
FlashAttention's count (4 B H N^2 d, halved when causal). Prints one Markdown table, a row
as soon as its peers are timed.
"""
import argparse
import json
import os
import re
import subprocess
import sys
import threading
import time


def flops(b, h, n, d, causal):
    f = 4.0 * b * h * n * n * d
    return f / 2 if causal else f


def run_ours(a, shapes, out):
    """Our steps of each shape in one run of the chapter binary (`--step 17,21,...`: the inputs
    uploaded once, each step's row checked and timed in turn); rows told apart by their step."""
    for n, d, c, steps in shapes:
        b, h = max(1, 16384 // n), 2048 // d
        cmd = [a.bin, "--n", str(n), "--batch", str(b), "--heads", str(h), "--kv-heads", str(h), "--d", str(d),
               "--step", ",".join(str(st) for st in steps), "--no-fp8-table", "--no-backward", "--json"] + \
              (["--causal"] if c else [])
        t0 = time.time()
        for st in steps:
            out[(n, d, c, st)] = (None, False)
        try:
            r = subprocess.run(cmd, capture_output=True, text=True, timeout=a.timeout)
            for x in json.loads(r.stdout)["results"]:
                m = re.match(r"v(\d+) ", x.get("impl", ""))
                if x["device"] != "cuda" or not m or int(m.group(1)) not in steps:
                    continue
                out[(n, d, c, int(m.group(1)))] = (x["tflops"] if x["pass"] else None, bool(x["pass"]))
            for st in steps:
                if not out[(n, d, c, st)][1]:
                    print(f"# ours v{st} N={n} d={d} causal={c}: FAILED its check or no row: {r.stderr.strip()[-200:]}",
                          file=sys.stderr, flush=True)
        except Exception as e:  # reported, not fatal
            print(f"# ours N={n} d={d} causal={c}: {type(e).__name__} {str(e)[:200]}", file=sys.stderr)
        print(f"# ours N={n} d={d} causal={c}: " + ", ".join(f"v{st} {out[(n, d, c, st)][0]}" for st in steps) +
              f" TFLOP/s ({time.time() - t0:.1f} s)", file=sys.stderr, flush=True)


FP8_STEPS = {9, 12, 15, 26, 27, 29}  # their rows are printed, but the best / peer ratios are of the bf16 steps

_TIMER = []  # the shared peer timer (bench/peer_timer.py), made on first use


def time_call(fn, torch, repeats=20):
    """The median (ms) by the bench's peer timer: 3 warm-ups, L2 flushed and left clean, events."""
    if not _TIMER:
        sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "..", "bench"))
        from peer_timer import PeerTimer
        _TIMER.append(PeerTimer(torch, repeats=repeats))
    return _TIMER[0](fn)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--bin", required=True)
    ap.add_argument("--shape", action="append", required=True, help="N:d:causal:steps, e.g. 8192:128:1:6,19")
    ap.add_argument("--peers", default="cudnn,fa4")
    ap.add_argument("--timeout", type=int, default=60, help="seconds for one run of the chapter binary")
    a = ap.parse_args()
    shapes = []
    for s in a.shape:
        n, d, c, steps = s.split(":")
        shapes.append((int(n), int(d), int(c), [int(x) for x in steps.split(",")]))
    t0 = time.time()
    ours = {}
    worker = threading.Thread(target=run_ours, args=(a, shapes, ours))
    worker.start()
    import torch
    from torch.nn.attention import SDPBackend, sdpa_kernel
    fa4 = None
    if "fa4" in a.peers:
        try:
            from flash_attn.cute import flash_attn_func as fa4
        except Exception as e:
            print(f"# fa4 not importable: {str(e).splitlines()[0][:160] if str(e) else type(e).__name__}", file=sys.stderr)
    print(f"# imports {time.time() - t0:.1f} s", file=sys.stderr, flush=True)
    worker.join()
    print(f"# ours done at {time.time() - t0:.1f} s", file=sys.stderr, flush=True)
    dev = torch.cuda.get_device_name()
    print(f"# {dev}, torch {torch.__version__}; each row printed as soon as its peers are timed")
    print("| shape | FA4 | cuDNN | " + "ours (step: TFLOP/s) | best | best / cuDNN | best / FA4 |")
    print("|---|---|---|---|---|---|---|", flush=True)
    for n, d, c, steps in shapes:
        b, h = max(1, 16384 // n), 2048 // d
        q, k, v = (torch.randn(b, h, n, d, device="cuda", dtype=torch.bfloat16) for _ in range(3))
        f = flops(b, h, n, d, c)
        p = {}
        if "cudnn" in a.peers:
            try:
                with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
                    call = lambda: torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=bool(c))
                    if not torch.isfinite(call()).all():
                        raise RuntimeError("non-finite output")
                    p["cudnn"] = f / (time_call(call, torch) * 1e-3) / 1e12
            except Exception as e:
                print(f"# cudnn N={n} d={d}: {str(e)[:200]}", file=sys.stderr)
        if fa4 is not None:
            try:
                qt, kt, vt = (x.transpose(1, 2).contiguous() for x in (q, k, v))

                def call():
                    o = fa4(qt, kt, vt, causal=bool(c))
                    return o[0] if isinstance(o, tuple) else o
                if not torch.isfinite(call()).all():
                    raise RuntimeError("non-finite output")
                p["fa4"] = f / (time_call(call, torch) * 1e-3) / 1e12
                del qt, kt, vt
            except Exception as e:
                print(f"# fa4 N={n} d={d}: {str(e).splitlines()[0][:200] if str(e) else type(e).__name__}", file=sys.stderr)
        del q, k, v
        mine = {st: ours.get((n, d, c, st), (None, False)) for st in steps}
        cells = ", ".join(f"v{st}: {t:.1f}" if t else f"v{st}: {'FAIL' if not ok else '-'}" for st, (t, ok) in mine.items())
        good = [(t, st) for st, (t, ok) in mine.items() if t and ok and st not in FP8_STEPS]  # bf16 against bf16
        best = max(good) if good else None
        row = [f"d={d} N={n} B={b} H={h}{' causal' if c else ''}", f"{p['fa4']:.1f}" if p.get("fa4") else "-",
               f"{p['cudnn']:.1f}" if p.get("cudnn") else "-", cells,
               f"{best[0]:.1f} (v{best[1]})" if best else "-",
               f"{best[0] / p['cudnn']:.3f}" if best and p.get("cudnn") else "-",
               f"{best[0] / p['fa4']:.3f}" if best and p.get("fa4") else "-"]
        print("| " + " | ".join(row) + " |", flush=True)
    print(f"# {time.time() - t0:.1f} s in all")
    return 0


if __name__ == "__main__":
    sys.exit(main())
