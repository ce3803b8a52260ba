#!/usr/bin/env python3
"""Why a peer's event time moves between runs at short shapes: four timings of the same call,
interleaved round by round in one process.

    clean        bench/peer_timer.py as the tables use it: L2 flushed (written, then a second
                 buffer read), an event, the call, an event; the median of 20
    clean+spin   the same flush, then a GPU spin of --spin-us before the first event, so that the
                 call is already queued when the GPU reaches the event: the event pair holds the
                 kernel (on a cold L2) and no host time
    loop         no flush: --loop calls back to back between one pair of events, divided by --loop
                 (the queue stays full; a warm L2 between calls)
    host         the host's time to enqueue one call while the GPU is busy (perf_counter, median)

Where `clean` exceeds `clean+spin`, the timed interval held idle GPU time: the host had not yet
enqueued the call when the flush ended, and what the table shows then depends on the host's speed
in that run, not on the kernel.

    python3 chapters/05_fa3_hopper/scripts/peer_gap.py [--shape 2048:128:1 ...] [--peers cudnn,fa4]
                                                       [--rounds 3]     N:d:causal; B = 16K / N, H = 2048 / d
"""
import argparse
import contextlib
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "..", "bench"))
from peer_timer import PeerTimer, spin_cycles  # noqa: E402


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shape", action="append", help="N:d:causal (default 2048:128:0 and 2048:128:1)")
    ap.add_argument("--peers", default="cudnn,fa4")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--spin-us", type=float, default=300.0)
    ap.add_argument("--loop", type=int, default=20)
    a = ap.parse_args()
    shapes = [tuple(int(x) for x in s.split(":")) for s in (a.shape or ["2048:128:0", "2048:128:1"])]
    t0 = time.time()
    import torch
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel
    fa4 = None
    if "fa4" in a.peers:
        try:
            from flash_attn.cute import flash_attn_func as fa4
        except Exception as e:  # noqa: BLE001 - FA4 is optional
            print("# fa4 not importable: %s" % (str(e).splitlines()[0][:160] if str(e) else type(e).__name__))
    cycles = spin_cycles(torch, a.spin_us)  # the spin's cycles for --spin-us, measured once
    timer, spun = PeerTimer(torch), PeerTimer(torch, spin_cycles=cycles)

    def clean(fn, spin):
        return (spun if spin else timer).median(fn) * 1e3

    def loop(fn):
        fn()
        torch.cuda.synchronize()
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record()
        for _ in range(a.loop):
            fn()
        e.record()
        e.synchronize()
        return s.elapsed_time(e) * 1e3 / a.loop

    def host(fn):
        fn()
        torch.cuda.synchronize()
        ts = []
        for _ in range(10):
            torch.cuda._sleep(cycles)  # the GPU busy: the enqueue never waits for it
            t = time.perf_counter()
            fn()
            ts.append((time.perf_counter() - t) * 1e6)
            torch.cuda.synchronize()
        return statistics.median(ts)

    print("# %s, torch %s, imports %.1f s; flush: %s; spin %.0f us (%d cycles)" % (
        torch.cuda.get_device_name(), torch.__version__, time.time() - t0, timer.describe(), a.spin_us, cycles))
    print("| call | shape | clean us | clean+spin us | loop us | host us | clean - spin | "
          "TFLOP/s clean / spin | rounds (clean/spin/loop) |")
    print("|---|---|---|---|---|---|---|---|---|", flush=True)
    for n, d, c in shapes:
        b, h = max(1, 16384 // n), 2048 // d
        fl = 4.0 * b * h * n * n * d / (2 if c else 1)
        q, k, v = (torch.randn(b, h, n, d, device="cuda", dtype=torch.bfloat16) for _ in range(3))
        calls = {}
        if "cudnn" in a.peers:  # the backend chosen once, around all its timings, as peers_fwd.py does
            calls["cudnn"] = lambda: F.scaled_dot_product_attention(q, k, v, is_causal=bool(c))
        if fa4 is not None:
            qt, kt, vt = (x.transpose(1, 2).contiguous() for x in (q, k, v))
            calls["fa4"] = lambda: fa4(qt, kt, vt, causal=bool(c))
        for name, fn in calls.items():
            ctx = sdpa_kernel([SDPBackend.CUDNN_ATTENTION]) if name == "cudnn" else contextlib.nullcontext()
            ctx.__enter__()
            res = {"clean": [], "spin": [], "loop": []}
            for r in range(a.rounds):
                order = [("clean", lambda: clean(fn, False)), ("spin", lambda: clean(fn, True)), ("loop", lambda: loop(fn))]
                for mode, t in order[::1 if r % 2 == 0 else -1]:
                    res[mode].append(t())
            hu = host(fn)
            ctx.__exit__(None, None, None)
            m = {k2: statistics.median(v2) for k2, v2 in res.items()}
            print("| %s | N=%d d=%d B=%d H=%d%s | %.1f | %.1f | %.1f | %.1f | %+.1f | %.0f / %.0f | %s |" % (
                name, n, d, b, h, " causal" if c else "", m["clean"], m["spin"], m["loop"], hu,
                m["clean"] - m["spin"], fl / (m["clean"] * 1e-6) / 1e12, fl / (m["spin"] * 1e-6) / 1e12,
                " ".join("%.0f/%.0f/%.0f" % x for x in zip(res["clean"], res["spin"], res["loop"]))), flush=True)
        del q, k, v
    print("# %.1f s" % (time.time() - t0))
    return 0


if __name__ == "__main__":
    sys.exit(main())
