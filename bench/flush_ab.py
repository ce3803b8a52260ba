#!/usr/bin/env python3
"""What the L2 flush before a timed call changes for the peers: the flush of bench/peer_timer.py in
each of its modes, and one more, interleaved round by round on the same prepared calls.

    write        the scrap buffer written (the flush before 2026-12-01 evening)
    clean        the scrap buffer written, then a second buffer of twice L2 read (PeerTimer's default)
    write+idle   the write, then a GPU spin (torch.cuda._sleep) about as long as the clean flush's read

A Python call (SDPA, FA4) needs tens of microseconds of CPU time to launch its kernel; when the GPU
has finished the flush before the launch arrives, the timed interval holds that idle time too.
`write+idle` keeps the GPU as busy as `clean` without touching L2: where it matches `clean`, the
difference is the launch's idle time, not the dirty lines.

    python3 bench/flush_ab.py [--n 1024,8192] [--rounds 3]       B = 16K / N, H = 16, d = 128, causal
"""
import argparse
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from peer_timer import PeerTimer, spin_cycles  # noqa: E402


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--n", default="1024,8192")
    ap.add_argument("--rounds", type=int, default=3)
    a = ap.parse_args()
    import torch
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel
    clean, write = PeerTimer(torch, mode="clean"), PeerTimer(torch, mode="write")
    # the spin: as long as the clean flush's read, measured once
    s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    clean.second.sum()
    torch.cuda.synchronize()
    s.record()
    clean.second.sum()
    e.record()
    e.synchronize()
    read_us = s.elapsed_time(e) * 1e3
    cycles = spin_cycles(torch, read_us)
    idle = PeerTimer(torch, mode="write", spin_cycles=cycles)  # the write, then the spin in place of the read
    print("# %s, torch %s; the clean flush's read %.1f us, the spin %d cycles" % (
        torch.cuda.get_device_name(), torch.__version__, read_us, cycles))
    print("| call | N | write us | clean us | write+idle us | clean - write | idle - write | rounds |")
    print("|---|---|---|---|---|---|---|---|")
    for n in [int(x) for x in a.n.split(",")]:
        b, h, d = max(1, 16384 // n), 16, 128
        q, k, v = (torch.randn(b, h, n, d, device="cuda", dtype=torch.bfloat16) for _ in range(3))
        calls = {}
        for name, be in (("sdpa_cudnn", SDPBackend.CUDNN_ATTENTION), ("sdpa_flash", SDPBackend.FLASH_ATTENTION)):
            def f(be=be):
                with sdpa_kernel([be]):
                    return F.scaled_dot_product_attention(q, k, v, is_causal=True)
            calls[name] = f
        try:
            from flash_attn.cute import flash_attn_func
            qt, kt, vt = (x.transpose(1, 2).contiguous() for x in (q, k, v))
            calls["fa4"] = lambda: flash_attn_func(qt, kt, vt, causal=True)
        except Exception:  # noqa: BLE001 - FA4 is optional
            pass
        for name, fn in calls.items():
            fn()
            res = {"write": [], "clean": [], "idle": []}
            for r in range(a.rounds):
                for mode, t in (("write", write), ("clean", clean), ("idle", idle))[::1 if r % 2 == 0 else -1]:
                    res[mode].append(t(fn) * 1e3)
            m = {k2: statistics.median(v2) for k2, v2 in res.items()}
            print("| %s | %d | %.1f | %.1f | %.1f | %+.1f | %+.1f | %s |" % (
                name, n, m["write"], m["clean"], m["idle"], m["clean"] - m["write"], m["idle"] - m["write"],
                " ".join("%.0f/%.0f/%.0f" % x for x in zip(res["write"], res["clean"], res["idle"]))), flush=True)
        del q, k, v
    return 0


if __name__ == "__main__":
    t0 = time.time()
    rc = main()
    print("# %.1f s" % (time.time() - t0))
    sys.exit(rc)
