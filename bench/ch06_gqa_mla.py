#!/usr/bin/env python3
"""Chapter 06, part gqa_mla: our kernels next to their peers, in one run on one GPU.

    python3 bench/ch06_gqa_mla.py --binary build/bin/ch06_variants [--markdown]

1. GQA/MQA. Runs `ch06_variants gqa --sweep --json`: the packed and unpacked Hopper
   forward (packed_fwd.cu) over G in {1, 2, 4, 8} (8 KV heads) and MQA (32 query heads,
   1 KV head), Nq in {1, 4, 16, 64, 128, 4096}, Nk = 8192, d = 128, bf16, with the K/V
   bytes each one streams. Then times, on the same shapes, SDPA's cuDNN backend with
   enable_gqa=True and FlashAttention-4 (flash_attn.cute.flash_attn_func, pack_gqa=True)
   where it is importable; a missing peer is a column that says so.
2. MLA. Runs `ch06_variants mla --sweep --json`: the absorbed decode kernel (mla_decode.cu)
   in the memory-bound (H = 16) and compute-bound (H = 128) regimes, with the read and
   bf16 GEMM ceilings measured in the same process. Then times SDPA on the decompressed
   tensors (q [B][H][1][192], K [B][H][Nk][192], V [B][H][Nk][128]): what a user without an
   MLA kernel runs.

Every time is a median of >= 20 with the L2 flushed before each repeat (ours:
common/cuda/timing.cuh; the peers: the same protocol here). Peers get torch.randn
values: the work does not depend on them.
"""
import argparse
import datetime
import json
import os
import re
import statistics
import subprocess
import sys
import time


def run_binary(binary, args):
    proc = subprocess.run([binary] + args, capture_output=True, text=True)
    if proc.returncode not in (0, 1):
        sys.exit("bench: %s %s failed (exit %d): %s" % (binary, " ".join(args), proc.returncode, proc.stderr.strip()))
    return json.loads(proc.stdout)


def sweep_rows(report):
    return [n for n in report.get("notes", []) if n.lstrip().startswith("sweep ")]


def load_torch():
    try:
        import torch
    except ImportError:
        return None, "PyTorch is not installed"
    if not torch.cuda.is_available():
        return None, "PyTorch has no CUDA device"
    return torch, None


def load_fa4():
    try:
        from flash_attn.cute import flash_attn_func  # noqa: F401
        return flash_attn_func, None
    except Exception as e:  # noqa: BLE001 - any import failure means "not importable here"
        return None, "FA4 not importable (%s)" % type(e).__name__


def timer(torch, call, repeats=20, warmup=3):
    dev = torch.device("cuda")
    l2 = getattr(torch.cuda.get_device_properties(dev), "L2_cache_size", 64 << 20)
    flush = torch.empty(max(2 * l2, 64 << 20), dtype=torch.uint8, device=dev)
    for _ in range(warmup):
        call()
    torch.cuda.synchronize()
    start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    times = []
    for r in range(repeats):
        flush.fill_(r & 0xFF)
        start.record()
        call()
        stop.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(stop))
    return statistics.median(times)


def sdpa_ms(torch, q, k, v, backend, **kw):
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel
    which = {"cudnn": SDPBackend.CUDNN_ATTENTION, "flash": SDPBackend.FLASH_ATTENTION,
             "efficient": SDPBackend.EFFICIENT_ATTENTION}[backend]

    def call():
        with sdpa_kernel([which]):
            return F.scaled_dot_product_attention(q, k, v, **kw)
    try:
        return timer(torch, call), None
    except (RuntimeError, TypeError, ValueError) as e:
        return None, (str(e).splitlines() or ["unavailable"])[0][:60]


GQA_RE = re.compile(r"sweep B=(\d+) Hq=(\d+) Hkv=(\d+) G=(\d+) Nq=(\d+) Nk=(\d+)\s+([\d.]+)\s+([\d.]+)\s+([\d.]+)x\s+(.+) / (.+)$")
MLA_RE = re.compile(r"sweep\s+(\d+)\s+(\d+)\s+(\d+)\s+(\d+)\s+([\d.]+)\s+([\d.]+)\s+([\d.]+)\s+([\d.]+)%\s+([\d.]+)\s+([\d.]+)%")


def fmt(x, spec="%.4f"):
    return spec % x if x is not None else "-"


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--binary", default="build/bin/ch06_variants")
    ap.add_argument("--markdown", action="store_true")
    ap.add_argument("--part", choices=["gqa", "mla", "both"], default="both")
    ap.add_argument("--budget-s", type=float, default=1e9, help="stop timing peers after this many seconds")
    a = ap.parse_args()
    t_start = time.time()

    def over_budget():
        return time.time() - t_start > a.budget_s
    torch, why_torch = load_torch()
    fa4, why_fa4 = load_fa4() if torch else (None, why_torch)
    gpu = torch.cuda.get_device_name() if torch else "?"
    print("# ch06 gqa_mla bench: %s, %s, `python3 bench/ch06_gqa_mla.py --binary %s`" %
          (gpu, datetime.date.today().isoformat(), a.binary))
    if not torch:
        print("peers: %s" % why_torch)
    elif not fa4:
        print("FA4: %s (its column says so)" % why_fa4)

    if a.part in ("gqa", "both"):
        rep = run_binary(a.binary, ["gqa", "--device", "cuda", "--sweep", "--no-table", "--json"])
        print("\n## GQA/MQA, Nk = 8192, d = 128, bf16, not causal (ms; K/V bytes streamed)\n")
        print("| B | Hq | Hkv | G | Nq | packed | unpacked | speed-up | K/V packed | K/V unpacked | cuDNN enable_gqa | FA4 pack_gqa |")
        print("|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
        for line in sweep_rows(rep):
            m = GQA_RE.search(line.strip())
            if not m:
                continue
            b, hq, hkv, g, nq, nk = (int(m.group(i)) for i in range(1, 7))
            packed, unpacked, sp = float(m.group(7)), float(m.group(8)), float(m.group(9))
            cud = f4 = None
            cud_why = f4_why = why_torch
            if torch and over_budget():
                cud_why = f4_why = "time budget of this run spent"
            elif torch:
                q = torch.randn(b, hq, nq, 128, device="cuda", dtype=torch.bfloat16)
                k = torch.randn(b, hkv, nk, 128, device="cuda", dtype=torch.bfloat16)
                v = torch.randn(b, hkv, nk, 128, device="cuda", dtype=torch.bfloat16)
                cud, cud_why = sdpa_ms(torch, q, k, v, "cudnn", enable_gqa=True)
                if fa4:
                    qt, kt, vt = (x.transpose(1, 2).contiguous() for x in (q, k, v))  # FA4: [B][N][H][d]
                    try:
                        f4 = timer(torch, lambda: fa4(qt, kt, vt, pack_gqa=True))
                    except Exception as e:  # noqa: BLE001
                        f4_why = (str(e).splitlines() or ["failed"])[0][:50]
                else:
                    f4_why = why_fa4
                del q, k, v
            print("| %d | %d | %d | %d | %d | %.4f | %.4f | %.2fx | %s | %s | %s | %s |" % (
                b, hq, hkv, g, nq, packed, unpacked, sp, m.group(10).strip(), m.group(11).strip(),
                fmt(cud) if cud is not None else "n/a: " + str(cud_why),
                fmt(f4) if f4 is not None else "n/a: " + str(f4_why)))

    if a.part in ("mla", "both"):
        rep = run_binary(a.binary, ["mla", "--device", "cuda", "--sweep", "--json"])
        c = rep.get("ceilings", {})
        print("\n## MLA decode, DeepSeek-V3 dims, Nq = 1, bf16 (ceilings of the same run: read %s GB/s, %s %s TFLOP/s)\n"
              % (fmt(c.get("read_gbps"), "%.0f"), c.get("gemm_what", "GEMM"), fmt(c.get("gemm_tflops"), "%.0f")))
        print("| H | B | Nk | splits | ours attn ms | ours total ms | latent GB/s | of read ceiling | TFLOP/s | of GEMM ceiling | SDPA decompressed ms | SDPA backend | SDPA / ours |")
        print("|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|---:|")
        for line in sweep_rows(rep):
            m = MLA_RE.search(line)
            if not m:
                continue
            h, b, nk, splits = (int(m.group(i)) for i in range(1, 5))
            attn, total = float(m.group(5)), float(m.group(6))
            best, which = None, why_torch
            dec_bytes = 2.0 * b * h * nk * (192 + 128)
            if torch and over_budget():
                which = "time budget of this run spent"
            elif torch and dec_bytes > 16e9:
                which = "not run: decompressed K/V would be %.0f GB" % (dec_bytes / 1e9)
            elif torch:
                q = torch.randn(b, h, 1, 192, device="cuda", dtype=torch.bfloat16)
                k = torch.randn(b, h, nk, 192, device="cuda", dtype=torch.bfloat16)
                v = torch.randn(b, h, nk, 128, device="cuda", dtype=torch.bfloat16)
                for backend in ("cudnn", "flash", "efficient"):
                    t, why = sdpa_ms(torch, q, k, v, backend, scale=192 ** -0.5)
                    if t is not None and (best is None or t < best):
                        best, which = t, backend
                    elif best is None:
                        which = why
                del q, k, v
                torch.cuda.empty_cache()
            print("| %d | %d | %d | %d | %.4f | %.4f | %s | %s%% | %s | %s%% | %s | %s | %s |" % (
                h, b, nk, splits, attn, total, m.group(7), m.group(8), m.group(9), m.group(10),
                fmt(best), which, ("%.2fx" % (best / attn)) if best else "-"))


if __name__ == "__main__":
    main()
