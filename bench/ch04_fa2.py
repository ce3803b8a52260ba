#!/usr/bin/env python3
"""Chapter 04 next to its peers, in one run on one GPU.

Runs build/bin/ch04_fa2 (--json) at the FlashAttention paper's shapes (B*N = 16K
tokens, H*d = 2048) and, where PyTorch with CUDA is importable, times
torch.nn.functional.scaled_dot_product_attention with its FLASH_ATTENTION
(FlashAttention-2) and CUDNN_ATTENTION backends on the same shapes, the same way:
median of 30 CUDA-event-timed calls, an L2 flush before each. FLOPs as
FlashAttention counts them (forward 4*B*H*N*N*d, halved for causal; backward 2.5x).

    python3 bench/ch04_fa2.py                  # forward sweep + backward at d=128
    python3 bench/ch04_fa2.py --quick          # N in {2K, 8K} only
    python3 bench/ch04_fa2.py --json out.json  # also write every number

The C++ binary never needs Python; without PyTorch this prints our numbers only.
"""
import argparse
import json
import os
import statistics
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
BIN = os.environ.get("BIN_CH04", os.path.join(HERE, "..", "build", "bin", "ch04_fa2"))
# The chapter's final forward step (steps/v9_per_dim_tiles.cu); STEP_CH04 selects another.
FINAL_STEP = int(os.environ.get("STEP_CH04", "9"))


def ours(n, b, h, d, causal, backward, step=FINAL_STEP, bench=False):
    args = [BIN, "--n", str(n), "--batch", str(b), "--heads", str(h), "--d", str(d), "--no-model", "--json",
            "--device", "cuda"]
    if causal:
        args.append("--causal")
    if step:
        args += ["--step", str(step)]
    if not backward:
        args.append("--no-backward")
    if bench:
        args.append("--bench")
    out = subprocess.run(args, capture_output=True, text=True)
    if out.returncode not in (0, 1):
        raise RuntimeError(f"{' '.join(args)}: {out.stderr.strip()}")
    return json.loads(out.stdout)


def torch_peers():
    try:
        import torch
        from torch.nn.attention import SDPBackend, sdpa_kernel
    except Exception as e:  # no PyTorch here: our numbers only
        return None, f"PyTorch not importable ({e.__class__.__name__})"
    if not torch.cuda.is_available():
        return None, "PyTorch sees no CUDA device"
    flush = torch.empty(256 << 20, dtype=torch.uint8, device="cuda")

    def timed(fn, reps=30):
        for _ in range(3):
            fn()
        torch.cuda.synchronize()
        ms = []
        for _ in range(reps):
            flush.zero_()
            s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            s.record()
            fn()
            e.record()
            e.synchronize()
            ms.append(s.elapsed_time(e))
        return statistics.median(ms)

    def run(backend, n, b, h, d, causal, backward):
        be = {"flash": SDPBackend.FLASH_ATTENTION, "cudnn": SDPBackend.CUDNN_ATTENTION}[backend]
        g = torch.Generator(device="cuda").manual_seed(0)
        q, k, v = (torch.randn(b, h, n, d, device="cuda", dtype=torch.bfloat16, generator=g,
                               requires_grad=backward) for _ in range(3))
        try:
            with sdpa_kernel(be):
                if not backward:
                    return timed(lambda: torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=causal))
                o = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=causal)
                do = torch.randn_like(o)
                return timed(lambda: torch.autograd.grad(o, (q, k, v), do, retain_graph=True))
        except RuntimeError:
            return None

    return run, f"PyTorch {torch.__version__}, cuDNN {torch.backends.cudnn.version()}"


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--json", help="write all numbers here")
    ap.add_argument("--no-backward", action="store_true")
    ap.add_argument("--ns", help="comma-separated sequence lengths (default: 512 ... 16384)")
    args = ap.parse_args()
    peers, peer_note = torch_peers()
    ns = [2048, 8192] if args.quick else [512, 1024, 2048, 4096, 8192, 16384]
    if args.ns:
        ns = [int(x) for x in args.ns.split(",")]
    rows, first = [], True
    gemm = None
    for d in (64, 128):
        h = 2048 // d
        for causal in (False, True):
            for n in ns:
                b = 16384 // n
                flops = 4.0 * b * h * n * n * d * (0.5 if causal else 1.0)
                r = ours(n, b, h, d, causal, False, bench=first)
                first = False
                gemm = gemm or r["ceilings"]["gemm_tflops"]
                res = r["results"][0]
                row = {"pass": "fwd", "d": d, "N": n, "B": b, "H": h, "causal": causal,
                       "ours": res["tflops"], "ours_ok": res["pass"]}
                if peers:
                    for name in ("flash", "cudnn"):
                        ms = peers(name, n, b, h, d, causal, False)
                        row[name] = flops / (ms * 1e-3) / 1e12 if ms else None
                rows.append(row)
                print(json.dumps(row), flush=True)
    if not args.no_backward:
        for d, n, causal in ((128, 2048, False), (128, 8192, False), (128, 8192, True), (64, 8192, False)):
            h, b = 2048 // d, 16384 // n
            flops = 2.5 * 4.0 * b * h * n * n * d * (0.5 if causal else 1.0)
            r = ours(n, b, h, d, causal, True)
            bw = [x for x in r["results"] if x["impl"].startswith("backward")]
            row = {"pass": "bwd", "d": d, "N": n, "B": b, "H": h, "causal": causal,
                   "ours": bw[0]["tflops"], "ours_ok": bw[0]["pass"],
                   "ours_det": bw[1]["tflops"], "ours_det_ok": bw[1]["pass"]}
            if peers:
                for name in ("flash", "cudnn"):
                    ms = peers(name, n, b, h, d, causal, True)
                    row[name] = flops / (ms * 1e-3) / 1e12 if ms else None
            rows.append(row)
            print(json.dumps(row), flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"peers": peer_note, "gemm_tflops": gemm, "rows": rows}, f, indent=1)
    # The table, last.
    print(f"\npeers: {peer_note}; bf16 GEMM ceiling {gemm:.0f} TFLOP/s (cuBLAS, same run)")
    print(f"{'pass':4} {'d':>4} {'N':>6} {'causal':>6} {'ours':>7} {'flash':>7} {'cudnn':>7} {'ours/flash':>10} {'check':>5}")
    for r in rows:
        f = lambda x: f"{x:7.1f}" if x else "      -"
        ratio = f"{r['ours'] / r['flash']:10.2f}" if peers and r.get("flash") and r["ours"] else "         -"
        ok = "pass" if r["ours_ok"] else "FAIL"
        print(f"{r['pass']:4} {r['d']:>4} {r['N']:>6} {str(r['causal']):>6} {f(r['ours'])} {f(r.get('flash'))} "
              f"{f(r.get('cudnn'))} {ratio} {ok:>5}")


if __name__ == "__main__":
    sys.exit(main())
