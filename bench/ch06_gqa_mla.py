#!/usr/bin/env python3
"""Chapter 06, part gqa_mla: our kernels next to their peers, in one run on one GPU.

    python3 bench/ch06_gqa_mla.py --binary build/bin/ch06_variants [--budget 55] [--part gqa|mla|both]

1. GQA/MQA. `ch06_variants gqa --sweep --json`: the packed and unpacked Hopper forward
   (packed_fwd.cu), and the chapter 04-derived packed forward (ampere_packed.cu,
   "sm_80" columns), over G in {1, 2, 4, 8} (8 KV heads) and MQA (32 query heads, 1 KV
   head), Nq in {1, 4, 16, 64, 128, 4096}, Nk = 8192, d = 128, bf16, not causal, with the
   K/V bytes each one streams. The peers on the same shapes: SDPA's cuDNN backend with
   enable_gqa=True and FlashAttention-4 (flash_attn.cute.flash_attn_func, pack_gqa=True).
2. MLA. `ch06_variants mla --sweep --lab --json`: the absorbed decode (mla_decode.cu; at H = 128
   the 64-row tile on wgmma + TMA, mla_decode_sm90.cu, with the mma.sync tile of the same
   process in the "other 64-row kernel" column) in the memory-bound (H = 16) and
   compute-bound (H = 128) regimes, with the read and bf16 GEMM
   ceilings measured in the same process. The peer: SDPA (the fastest of its cuDNN, flash
   and efficient backends) on the decompressed tensors, q [B][H][1][192], K [B][H][Nk][192],
   V [B][H][Nk][128]: what a user without an MLA kernel runs; alone, and with the
   decompression of K and V (c W_UK, c W_UV, two batched GEMMs) in front of it.

Every peer output is checked against an fp32 reference (batch 0, the first and last head,
up to 64 query rows) before it is timed; a failed check is a cell saying FAIL, never a
speed. A peer that is missing, fails, or is not reached within --budget seconds is a
cell saying so. The peers are set up in --workers processes while our sweeps run (FA4
compiles a kernel for each group size, 3-8 s each); every timed loop, ours or a peer's,
holds one lock, so no two timings overlap. Times are medians of 20 with the L2 flushed
and left clean before each repeat (ours: common/cuda/timing.cuh; the peers: bench/peer_timer.py).
Prints markdown tables, then one line `BENCH_JSON {...}`.
"""
import argparse
import json
import queue
import re
import subprocess
import sys
import time

# The shapes of the binary's sweeps (gqa_mla_main.cpp: gqa_sweep(), mla_sweep()); the
# tables are keyed on the shapes the binary prints, these only start the peers early.
GQA_HEADS = [(8, 8), (16, 8), (32, 8), (64, 8), (32, 1)]
GQA_SIZES = [(1, 1), (16, 1), (16, 4), (16, 16), (16, 64), (16, 128), (1, 4096)]
GQA_NK = 8192
MLA_CASES = [(16, 1, 4096), (16, 8, 4096), (16, 64, 4096), (16, 1, 65536), (16, 8, 65536), (16, 32, 32768),
             (16, 64, 16384), (16, 64, 65536), (128, 1, 4096), (128, 8, 4096), (128, 32, 4096), (128, 8, 16384),
             (128, 64, 8192)]
MLA_MAX_BYTES = 16e9  # decompressed K + V above this: not run


def log(*a):
    print(*a, file=sys.stderr, flush=True)


def run_binary(binary, args, lock, timeout=240):
    """(report, error) of `binary args --json`, holding the GPU lock."""
    try:
        with lock:
            r = subprocess.run([binary] + args + ["--json"], capture_output=True, text=True, timeout=timeout)
    except (subprocess.TimeoutExpired, OSError) as e:
        return None, f"{type(e).__name__}"
    try:
        return json.loads(r.stdout), None if r.returncode in (0, 1) else r.stderr.strip()[:200]
    except json.JSONDecodeError:
        return None, (r.stderr.strip() or f"exit {r.returncode}, no JSON")[:200]


GQA_RE = re.compile(r"sweep B=(\d+) Hq=(\d+) Hkv=(\d+) G=(\d+) Nq=(\d+) Nk=(\d+)\s+([\d.]+)\s+([\d.]+)\s+([\d.]+)x\s+(.+) / (.+)$")
GQA80_RE = re.compile(r"sweep80 B=(\d+) Hq=(\d+) Hkv=(\d+) G=(\d+) Nq=(\d+) Nk=(\d+)\s+([\d.]+)\s+([\d.]+)\s+([\d.]+)x")
TILE64_RE = re.compile(r"tile64 (\S+)\s+(\d+)\s+(\d+)\s+(\d+)\s+(\d+)\s+([\d.]+)\s+([\d.]+) TFLOP/s\s+([\d.]+)% of GEMM")
GENERAL_RE = re.compile(r"(general|cluster|separate)\s+(\d+)\s+(\d+)\s+(\d+)\s+(\d+)\s+([\d.]+)")
# The 64-row form set beside the default in the table (mla_decode_sm90.cu): P released by
# bar.arrive, the former default, which racecheck reports.
ARRIVE_FORMS = ["wgmma-arrive"]
MLA_RE = re.compile(r"sweep\s+(\d+)\s+(\d+)\s+(\d+)\s+(\d+)\s+([\d.]+)\s+([\d.]+)\s+([\d.]+)\s+([\d.]+)%\s+([\d.]+)\s+([\d.]+)%")


# ----------------------------------------------------------------------------- peer workers

def ref_rows(torch, q, k, v, scale, heads, rows):
    """fp32 attention of batch 0, query heads `heads`, query rows `rows`; K/V head h // G."""
    g = q.shape[1] // k.shape[1]
    out = []
    for h in heads:
        s = q[0, h, rows].float() @ k[0, h // g].float().T * scale
        out.append(torch.softmax(s, dim=-1) @ v[0, h // g].float())
    return torch.stack(out)


def check(torch, o_bhnd, ref, heads, rows):
    got = o_bhnd[0, heads][:, rows].float()
    if torch.isnan(got).any().item():
        return False, float("nan")
    err = (got - ref).abs().max().item()
    return err <= 2e-2 * max(1.0, ref.abs().max().item()), err


def worker(wid, tasks, results, lock):
    try:
        import torch
        if not torch.cuda.is_available():
            raise RuntimeError("PyTorch has no CUDA device")
    except Exception as e:  # noqa: BLE001
        results.put(("ready", wid, {"torch_why": f"PyTorch not usable: {e}"[:100]}))
        return
    info = {"torch": torch.__version__, "cudnn": str(torch.backends.cudnn.version())}
    fa4 = None
    try:
        from flash_attn.cute import flash_attn_func
        fa4 = flash_attn_func
        try:
            from importlib.metadata import version
            info["fa4"] = version("flash-attn-4")
        except Exception:  # noqa: BLE001
            info["fa4"] = "?"
    except Exception as e:  # noqa: BLE001
        info["fa4_why"] = f"FA4 not importable ({type(e).__name__})"
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel
    backends = {"cudnn": SDPBackend.CUDNN_ATTENTION, "flash": SDPBackend.FLASH_ATTENTION,
                "efficient": SDPBackend.EFFICIENT_ATTENTION}
    results.put(("ready", wid, info))
    from peer_timer import PeerTimer  # the peers' shared timer (bench/peer_timer.py)
    timer = PeerTimer(torch)
    gen = torch.Generator(device="cuda").manual_seed(1)

    def sdpa(backend, q, k, v, **kw):
        def fn():
            with sdpa_kernel([backends[backend]]):
                return F.scaled_dot_product_attention(q, k, v, **kw)
        return fn

    while True:
        task = tasks.get()
        if task is None:
            return
        key, kind = task[0], task[1]
        r = {}
        t0 = time.time()
        try:
            if kind in ("cudnn", "fa4"):
                _, _, b, hq, hkv, nq, nk = task
                if kind == "fa4" and fa4 is None:
                    raise LookupError(info["fa4_why"])
                q = torch.randn(b, hq, nq, 128, device="cuda", dtype=torch.bfloat16, generator=gen)
                k = torch.randn(b, hkv, nk, 128, device="cuda", dtype=torch.bfloat16, generator=gen)
                v = torch.randn(b, hkv, nk, 128, device="cuda", dtype=torch.bfloat16, generator=gen)
                heads, rows = [0, hq - 1], torch.arange(min(nq, 64), device="cuda")
                ref = ref_rows(torch, q, k, v, 128 ** -0.5, heads, rows)
                if kind == "cudnn":
                    fn = sdpa("cudnn", q, k, v, enable_gqa=True)
                    o = fn()
                else:
                    qt, kt, vt = (x.transpose(1, 2).contiguous() for x in (q, k, v))  # FA4: [B][N][H][d]

                    def fn():
                        out = fa4(qt, kt, vt, pack_gqa=True)
                        return out[0] if isinstance(out, tuple) else out
                    o = fn().transpose(1, 2)
                ok, err = check(torch, o, ref, heads, rows)
                r.update({"pass": ok, "err": err, "setup_s": round(time.time() - t0, 1)})
                if ok:
                    with lock:
                        r["ms"] = timer(fn)
            elif kind == "mla":
                _, _, h, b, nk = task
                # decompressed tensors, DeepSeek-V3 dims: d_qk = 192 (128 nope + 64 rope), d_v = 128
                c = torch.randn(b, nk, 512, device="cuda", dtype=torch.bfloat16, generator=gen)
                k_rope = torch.randn(b, 1, nk, 64, device="cuda", dtype=torch.bfloat16, generator=gen)
                w_uk = torch.randn(h, 512, 128, device="cuda", dtype=torch.bfloat16, generator=gen) * 512 ** -0.5
                w_uv = torch.randn(h, 512, 128, device="cuda", dtype=torch.bfloat16, generator=gen) * 512 ** -0.5
                q = torch.randn(b, h, 1, 192, device="cuda", dtype=torch.bfloat16, generator=gen)

                def decompress():
                    kn = torch.einsum("bnc,hcd->bhnd", c, w_uk)
                    kk = torch.cat([kn, k_rope.expand(b, h, nk, 64)], dim=-1)
                    vv = torch.einsum("bnc,hcd->bhnd", c, w_uv)
                    return kk, vv
                k, v = decompress()
                heads, rows = [0, h - 1], torch.arange(1, device="cuda")
                ref = ref_rows(torch, q, k, v, 192 ** -0.5, heads, rows)
                best = None
                for be in ("cudnn", "flash", "efficient"):
                    try:
                        fn = sdpa(be, q, k, v, scale=192 ** -0.5)
                        ok, err = check(torch, fn(), ref, heads, rows)
                    except Exception as e:  # noqa: BLE001
                        r.setdefault("tried", {})[be] = f"{type(e).__name__}"
                        continue
                    if not ok:
                        r.setdefault("tried", {})[be] = "FAIL (check)"
                        continue
                    with lock:
                        ms = timer(fn)
                    r.setdefault("tried", {})[be] = round(ms, 4)
                    if best is None or ms < best[1]:
                        best = (be, ms, err)
                if best is None:
                    r["why"] = "no SDPA backend passed: " + json.dumps(r.get("tried", {}))[:80]
                else:
                    r.update({"backend": best[0], "ms": best[1], "err": best[2], "pass": True})

                    def both():
                        kk, vv = decompress()
                        with sdpa_kernel([backends[best[0]]]):
                            return F.scaled_dot_product_attention(q, kk, vv, scale=192 ** -0.5)
                    with lock:
                        r["with_decompress_ms"] = timer(both)
                del c, k, v, q
                torch.cuda.empty_cache()
        except LookupError as e:
            r = {"why": str(e)}
        except Exception as e:  # noqa: BLE001
            r = {"why": f"error: {type(e).__name__}: {(str(e).splitlines() or [''])[0][:80]}"}
            try:
                torch.cuda.empty_cache()
            except Exception:  # noqa: BLE001
                pass
        results.put(("result", key, kind, r))


# ----------------------------------------------------------------------------- main

def cell(r):
    if not r:
        return "-"
    if r.get("why"):
        return "n/a: " + r["why"]
    if r.get("pass") is False:
        return "FAIL (check)"
    return "%.4f" % r["ms"] if r.get("ms") is not None else "-"


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--binary", default="build/bin/ch06_variants")
    ap.add_argument("--part", choices=["gqa", "mla", "both"], default="both")
    ap.add_argument("--budget", type=float, default=1e9, help="seconds: peers not done by then are reported so")
    ap.add_argument("--workers", type=int, default=5, help="peer processes (one per FA4 group size)")
    ap.add_argument("--no-peers", action="store_true")
    ap.add_argument("--markdown", action="store_true", help="(kept for compatibility: the output is markdown)")
    a = ap.parse_args()
    t0 = time.time()
    out = {"date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "command": "python3 " + " ".join(sys.argv)}
    try:
        out["gpu"] = subprocess.run(["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"], capture_output=True,
                                    text=True).stdout.strip().splitlines()[0]
    except Exception:  # noqa: BLE001
        out["gpu"] = "?"

    import multiprocessing as mp
    ctx = mp.get_context("spawn")
    lock, results = ctx.Lock(), ctx.Queue()
    queues, procs = [], []
    if not a.no_peers:
        for w in range(max(1, a.workers)):
            qw = ctx.Queue()
            p = ctx.Process(target=worker, args=(w, qw, results, lock), daemon=True)
            p.start()
            queues.append(qw)
            procs.append(p)
    sent = []

    def send(wi, task):
        if queues:
            queues[wi % len(queues)].put(task)
            sent.append((task[0], task[1]))
    # FA4 compiles per group size: all shapes of one G go to one worker (its compile cache).
    gs = sorted({hq // hkv for hq, hkv in GQA_HEADS})
    rr = 0
    if a.part in ("gqa", "both"):
        for hq, hkv in GQA_HEADS:
            for b, nq in GQA_SIZES:
                key = (b, hq, hkv, nq, GQA_NK)
                send(gs.index(hq // hkv), (key, "fa4", b, hq, hkv, nq, GQA_NK))
    if a.part in ("mla", "both"):
        for h, b, nk in MLA_CASES:
            if 2.0 * b * h * nk * (192 + 128) <= MLA_MAX_BYTES:
                send(rr, ((h, b, nk), "mla", h, b, nk))
                rr += 1
    if a.part in ("gqa", "both"):
        for hq, hkv in GQA_HEADS:
            for b, nq in GQA_SIZES:
                key = (b, hq, hkv, nq, GQA_NK)
                send(rr, (key, "cudnn", b, hq, hkv, nq, GQA_NK))
                rr += 1

    # ours, holding the lock (the peers keep setting up meanwhile)
    if a.part in ("gqa", "both"):
        rep, err = run_binary(a.binary, ["gqa", "--device", "cuda", "--sweep", "--no-table"], lock)
        out["gqa"], out["gqa_error"] = [], err
        sm80 = {}
        for line in (rep or {}).get("notes", []):
            m = GQA80_RE.search(line.strip())
            if m:
                b, hq, hkv, g, nq, nk = (int(m.group(i)) for i in range(1, 7))
                sm80[(b, hq, hkv, nq, nk)] = {"packed_ms": float(m.group(7)), "unpacked_ms": float(m.group(8)),
                                              "speedup": float(m.group(9))}
                continue
            m = GQA_RE.search(line.strip())
            if m:
                b, hq, hkv, g, nq, nk = (int(m.group(i)) for i in range(1, 7))
                out["gqa"].append({"key": [b, hq, hkv, nq, nk], "G": g, "packed_ms": float(m.group(7)),
                                   "unpacked_ms": float(m.group(8)), "speedup": float(m.group(9)),
                                   "kv_packed": m.group(10).strip(), "kv_unpacked": m.group(11).strip()})
        for row in out["gqa"]:
            row["sm80"] = sm80.get(tuple(row["key"]), {})
        log(f"ours, gqa: {time.time() - t0:.0f} s")
    if a.part in ("mla", "both"):
        # --lab: the lab's forms of LAB.md beside the default in the same process (the extra columns)
        rep, err = run_binary(a.binary, ["mla", "--device", "cuda", "--sweep", "--lab", "--form", "absorb"], lock)
        out["mla"], out["mla_error"] = [], err
        out["ceilings"] = (rep or {}).get("ceilings", {})
        other, general = {}, {}
        for line in (rep or {}).get("notes", []):
            m = GENERAL_RE.search(line)
            if m:  # the combine's two-trip form, or the 2 ranges merged in a cluster, on the same case
                general.setdefault(tuple(int(m.group(i)) for i in range(2, 5)), {})[m.group(1)] = float(m.group(6))
                continue
            m = TILE64_RE.search(line)
            if m:
                h, b, nk = (int(m.group(i)) for i in range(2, 5))
                t = {"kernel": m.group(1), "attn_ms": float(m.group(6)), "tflops": float(m.group(7)),
                     "gemm_share": float(m.group(8))}
                # the "other 64-row kernel" column is the mma.sync tile; the other wgmma form
                # (P released by bar.sync, wgmma-sync) goes into the JSON only
                other.setdefault((h, b, nk), {})[t["kernel"]] = t
                continue
            m = MLA_RE.search(line)
            if m:
                h, b, nk, splits = (int(m.group(i)) for i in range(1, 5))
                out["mla"].append({"key": [h, b, nk], "splits": splits, "attn_ms": float(m.group(5)),
                                   "total_ms": float(m.group(6)), "gbps": float(m.group(7)),
                                   "read_share": float(m.group(8)), "tflops": float(m.group(9)),
                                   "gemm_share": float(m.group(10))})
        for row in out["mla"]:
            kernels = other.get(tuple(row["key"]), {})
            row["tile64_other"] = kernels.get("mma", next(iter(kernels.values()), {}))
            row["tile64_all"] = kernels
            for form, ms in general.get(tuple(row["key"]), {}).items():
                row["combine_%s_ms" % form] = ms
        log(f"ours, mla: {time.time() - t0:.0f} s")

    # Without our rows (the binary failed) the peers' rows still print.
    if a.part in ("gqa", "both") and not out["gqa"]:
        out["gqa"] = [{"key": [b, hq, hkv, nq, GQA_NK], "G": hq // hkv} for hq, hkv in GQA_HEADS for b, nq in GQA_SIZES]
    if a.part in ("mla", "both") and not out["mla"]:
        out["mla"] = [{"key": [h, b, nk]} for h, b, nk in MLA_CASES]
    got, ready = {}, {}
    while procs and len(got) < len(sent) and time.time() - t0 < a.budget:
        if not any(p.is_alive() for p in procs):
            break
        try:
            msg = results.get(timeout=0.5)
        except queue.Empty:
            continue
        if msg[0] == "ready":
            ready[msg[1]] = msg[2]
        else:
            got[(msg[1], msg[2])] = msg[3]
    while True:  # what is left in the queue (a worker that stopped early said why)
        try:
            msg = results.get(timeout=0.2)
        except queue.Empty:
            break
        (ready.__setitem__(msg[1], msg[2]) if msg[0] == "ready" else got.__setitem__((msg[1], msg[2]), msg[3]))
    for p in procs:
        if p.is_alive():
            p.terminate()
    info = next(iter(ready.values()), {})
    out["peer_versions"] = {k: v for k, v in info.items() if not k.endswith("_why")}
    missing = info.get("torch_why") or ("not measured (time budget of this run)" if procs else "peers off")
    for row in out.get("gqa", []):
        k = tuple(row["key"])
        row["cudnn"] = got.get((k, "cudnn"), {"why": missing})
        row["fa4"] = got.get((k, "fa4"), {"why": info.get("fa4_why") or missing})
    for row in out.get("mla", []):
        h, b, nk = row["key"]
        if 2.0 * b * h * nk * (192 + 128) > MLA_MAX_BYTES:
            row["sdpa"] = {"why": "not run: decompressed K/V would be %.0f GB" % (2.0 * b * h * nk * 320 / 1e9)}
        else:
            row["sdpa"] = got.get(((h, b, nk), "mla"), {"why": missing})
    out["duration_s"] = round(time.time() - t0, 1)
    print_tables(out)
    print("BENCH_JSON " + json.dumps(out, default=lambda o: None))
    return 0


def print_tables(out):
    print(f"# ch06 gqa_mla bench: {out['gpu']}, {out['date']}, `{out['command']}` ({out['duration_s']} s; "
          f"peers {out.get('peer_versions', {})})")
    if "gqa" in out:
        if out.get("gqa_error"):
            print("ours, gqa: " + out["gqa_error"])
        print("\n## GQA/MQA, Nk = 8192, d = 128, bf16, not causal (ms; K/V bytes streamed; peer / packed > 1: ours faster)\n")
        print("| B | Hq | Hkv | G | Nq | packed | unpacked | speed-up | K/V packed | K/V unpacked | cuDNN enable_gqa "
              "| FA4 pack_gqa | cuDNN / packed | FA4 / packed | sm_80 packed | sm_80 unpacked | sm_80 speed-up |")
        print("|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
        f4 = lambda x, f="%.4f": f % x if isinstance(x, (int, float)) else "-"
        for r in out["gqa"]:
            b, hq, hkv, nq, _ = r["key"]
            rat = lambda p: "%.2fx" % (p["ms"] / r["packed_ms"]) if p.get("ms") and r.get("packed_ms") else "-"
            print(f"| {b} | {hq} | {hkv} | {r['G']} | {nq} | {f4(r.get('packed_ms'))} | {f4(r.get('unpacked_ms'))} | "
                  f"{f4(r.get('speedup'), '%.2fx')} | {r.get('kv_packed', '-')} | {r.get('kv_unpacked', '-')} | "
                  f"{cell(r['cudnn'])} | {cell(r['fa4'])} | {rat(r['cudnn'])} | {rat(r['fa4'])} | "
                  f"{f4(r.get('sm80', {}).get('packed_ms'))} | {f4(r.get('sm80', {}).get('unpacked_ms'))} | "
                  f"{f4(r.get('sm80', {}).get('speedup'), '%.2fx')} |")
    if "mla" in out:
        if out.get("mla_error"):
            print("ours, mla: " + out["mla_error"])
        c = out.get("ceilings") or {}
        print("\n## MLA decode, DeepSeek-V3 dims, Nq = 1, bf16 (ceilings of the same run: read %s GB/s, %s %s TFLOP/s)\n"
              % (c.get("read_gbps") and "%.0f" % c["read_gbps"], c.get("gemm_what", "GEMM"),
                 c.get("gemm_tflops") and "%.0f" % c["gemm_tflops"]))
        print("| H | B | Nk | splits | ours attn ms | ours total ms | latent GB/s | of read ceiling | TFLOP/s | of GEMM "
              "ceiling | SDPA decompressed ms (backend) | SDPA + decompression ms | SDPA / ours attn | (SDPA + decompr.) / ours total "
              "| other 64-row kernel attn ms (TFLOP/s) | ours / other | bar.arrive form attn ms | ours / it "
              "| two-trip combine attn ms | ours / it | separate combine attn ms (ours: the cluster merge) | ours / it |")
        print("|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|---:|---:|---:|---|---:|---:|---:|---:|---:|---:|---:|")
        f = lambda x, spec: spec % x if isinstance(x, (int, float)) else "-"
        for r in out["mla"]:
            h, b, nk = r["key"]
            s = r["sdpa"]
            sd = cell(s) + (f" ({s['backend']})" if s.get("backend") else "")
            wd = "%.4f" % s["with_decompress_ms"] if s.get("with_decompress_ms") else "-"
            r1 = "%.2fx" % (s["ms"] / r["attn_ms"]) if s.get("ms") and r.get("attn_ms") else "-"
            r2 = ("%.2fx" % (s["with_decompress_ms"] / r["total_ms"])
                  if s.get("with_decompress_ms") and r.get("total_ms") else "-")
            print(f"| {h} | {b} | {nk} | {f(r.get('splits'), '%d')} | {f(r.get('attn_ms'), '%.4f')} | "
                  f"{f(r.get('total_ms'), '%.4f')} | {f(r.get('gbps'), '%.0f')} | {f(r.get('read_share'), '%.1f%%')} | "
                  f"{f(r.get('tflops'), '%.1f')} | {f(r.get('gemm_share'), '%.1f%%')} | {sd} | {wd} | {r1} | {r2} | "
                  + (f"{t['attn_ms']:.4f} ({t['tflops']:.1f}, {t['kernel']}) | {t['attn_ms'] / r['attn_ms']:.2f}x |"
                     if (t := r.get("tile64_other")) and r.get("attn_ms") else "- | - |")
                  + (f" {w['attn_ms']:.4f} ({w['kernel']}) | {w['attn_ms'] / r['attn_ms']:.2f}x |"
                     if (w := next((r.get("tile64_all", {})[k] for k in ARRIVE_FORMS if k in r.get("tile64_all", {})),
                                   None)) and r.get("attn_ms") else " - | - |")
                  + "".join(f" {r[k]:.4f} | {r[k] / r['attn_ms']:.2f}x |" if r.get(k) and r.get("attn_ms") else " - | - |"
                            for k in ("combine_general_ms", "combine_separate_ms")))


if __name__ == "__main__":
    sys.exit(main())
