#!/usr/bin/python3
"""Ring attention's cost model: when does a K/V rotation hide behind a step's compute?

    T_comm(n) = alpha + 2 B Hkv n d e / beta                 (one K/V shard, one direction)
    T_comp(n) = 4 B Hq n^2 d f / R                           (one step's block, f = its share)
    hidden when T_comm <= T_comp;  without alpha:  n* = (Hkv / Hq) e R / (2 f beta)

The backward moves K/V (e bytes) and the fp32 dK/dV accumulator (4 bytes) per element,
against 2.5x the FLOPs at its own rate R_bwd.

    /usr/bin/python3 bench/ch06_ring_cost_model.py --r-fwd 330 --r-bwd 200 [--check ...]

--r-fwd / --r-bwd are measured TFLOP/s of the per-step kernel (chapter 04's forward and
backward at the shard size, from the queue log); --check N P H D COPY_GBPS prints the
one-GPU prediction of a step's compute and copy time for the in-process comparison.
"""
import argparse
import math


def threshold(hq, hkv, d, e, f, r_tflops, beta_gbps, alpha_us, flop_factor=1.0, byte_factor=1.0):
    """Smallest n (tokens per rank) with T_comm <= T_comp; B cancels."""
    R = r_tflops * 1e12
    beta = beta_gbps * 1e9
    a = 4.0 * hq * d * f * flop_factor / R         # s per token^2
    b = 2.0 * hkv * d * e * byte_factor / beta     # s per token
    alpha = alpha_us * 1e-6
    return (b + math.sqrt(b * b + 4 * a * alpha)) / (2 * a), b / a


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--r-fwd", type=float, required=True, help="measured forward TFLOP/s of the step kernel")
    ap.add_argument("--r-bwd", type=float, required=True, help="measured backward TFLOP/s of the step kernel")
    ap.add_argument("--check", nargs=5, metavar=("N", "P", "H", "D", "COPY_GBPS"),
                    help="one-GPU check: per-step compute (one rank alone) and copy time")
    a = ap.parse_args()
    links = [("8 x H200, NVLink 4 (450 GB/s per direction)", 450.0, 10.0),
             ("64 GPUs, 400 Gb/s InfiniBand per GPU (50 GB/s)", 50.0, 20.0)]
    models = [("MHA Hq = Hkv = 32", 32, 32), ("GQA Hq = 32, Hkv = 8", 32, 8)]
    e, d = 2, 128
    print("| link | heads | causal zigzag fwd n* | bwd n* | non-causal fwd n* | without latency (fwd causal) |")
    print("|---|---|---:|---:|---:|---:|")
    for name, beta, alpha in links:
        for mname, hq, hkv in models:
            fwd, fwd0 = threshold(hq, hkv, d, e, 0.5, a.r_fwd, beta, alpha)
            bwd, _ = threshold(hq, hkv, d, e, 0.5, a.r_bwd, beta, alpha, flop_factor=2.5, byte_factor=(e + 4) / e)
            nc, _ = threshold(hq, hkv, d, e, 1.0, a.r_fwd, beta, alpha)
            print("| %s | %s | %.0f | %.0f | %.0f | %.0f |" % (name, mname, fwd, bwd, nc, fwd0))
    if a.check:
        n, p, h, dd, gbps = int(a.check[0]), int(a.check[1]), int(a.check[2]), int(a.check[3]), float(a.check[4])
        shard = n // p
        bytes_ = 2 * h * shard * dd * e
        comm = bytes_ / (gbps * 1e9) * 1e3
        comp = 4 * h * shard * shard * dd * 0.5 / (a.r_fwd * 1e12) * 1e3
        print("\none-GPU check: N=%d P=%d H=%d d=%d: K/V shard %.1f MB, copy %.4f ms at %.0f GB/s; "
              "step compute (causal zigzag, one rank alone at %.0f TFLOP/s) %.4f ms; ratio %.1f"
              % (n, p, h, dd, bytes_ / 1e6, comm, gbps, a.r_fwd, comp, comp / comm))


if __name__ == "__main__":
    main()
