#!/usr/bin/env python3
"""The peers of chapter 05's backward, by events, for the same request as our backward rows.

    python3 chapters/05_fa3_hopper/scripts/peers_bwd.py --shape 128:1 --shape 128:0 --shape 64:1 \\
        [--peers fa4,sdpa_cudnn,sdpa_flash] [--n 8192]                    # d:causal; B = 2, H = 2048 / d

Each peer through bench/bench_peers.py's Peers.attention(..., backward=True), as the README's
tables always were: batch 0, head 0 of O, dQ, dK and dV checked against fp32 autograd first, then
the backward alone (torch.autograd.grad on the graph of one forward) timed by the bench's peer
timer (3 warm-ups, the L2 flushed and left clean before each of 20 repeats, CUDA events, the
median). TFLOP/s by FlashAttention's count: 2.5 x the forward's 4 B H N^2 d, halved when causal.
Run it after our rows, in the same request, so that ours and the peers share a GPU and a day.
"""
import argparse
import os
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "..", "bench"))


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shape", action="append", required=True, help="d:causal, e.g. 128:1")
    ap.add_argument("--peers", default="fa4,sdpa_cudnn,sdpa_flash")
    ap.add_argument("--n", type=int, default=8192)
    ap.add_argument("--batch", type=int, default=2)
    a = ap.parse_args()
    t0 = time.time()
    from bench_common import PEER_LABEL
    from bench_peers import Peers
    peers = Peers(repeats=20)
    print("# torch %s, cuDNN %s (%.1f s to import)" % (peers.versions.get("torch"), peers.versions.get("cudnn"),
                                                        time.time() - t0), flush=True)
    print("| peer | d | causal | B x H x N | ms | TFLOP/s | status |")
    print("|---|---|---|---|---|---|---|")
    for s in a.shape:
        d, c = (int(x) for x in s.split(":"))
        h = 2048 // d
        for p in a.peers.split(","):
            t1 = time.time()
            r = peers.attention(p, a.batch, h, h, a.n, a.n, d, bool(c), backward=True)
            ms, tf = r.get("time_ms"), r.get("tflops")
            print("| %s | %d | %s | %d x %d x %d | %s | %s | %s (%.1f s) |" % (
                PEER_LABEL.get(p, p), d, "yes" if c else "no", a.batch, h, a.n,
                "%.3f" % ms if ms else "-", "%.1f" % tf if tf else "-",
                r.get("status") if r.get("status") == "ok" else "%s: %s" % (r.get("status"), r.get("note", "")[:120]),
                time.time() - t1), flush=True)


if __name__ == "__main__":
    main()
