#!/usr/bin/env python3
"""Chapter 07's decode kernels next to PyTorch SDPA (cuDNN and flash backends), in one run on one GPU.

    python3 bench/ch07_decode.py                    # repo root; binary from build/bin
    python3 bench/ch07_decode.py --binary build-ch07/bin/ch07_paged_radix --markdown

1. Runs `ch07_paged_radix decode --sweep --json`: every configuration of the chapter's
   table, our kernels (v1 and v2, paged and contiguous) each checked against the fp64
   reference and timed (median of >= 20, L2 flushed between repeats), and the read
   ceiling (a streaming kernel) measured in the same process.
2. Times torch.nn.functional.scaled_dot_product_attention on the same shapes with K/V
   contiguous, [B, Hkv, L, d] bf16 (GQA through enable_gqa), once per backend, with
   the same protocol: warm-up, the L2 flushed before every repeat, the median of 30.
3. Prints one table: KV bytes read per second (every cached key and value, bf16,
   divided by the time) and its share of the read ceiling.

The peers get the same shapes, dtype and layout, with values from torch.randn: a
decode step does the same work whatever the values. Without PyTorch (or without a
CUDA device in it) the script prints our numbers alone and says so. The C++ binary
never needs Python.
"""
import argparse
import json
import os
import statistics
import subprocess
import sys


def run_binary(binary, extra):
    cmd = [binary, "decode", "--sweep", "--json"] + extra
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode not in (0, 1):  # 1: a check failed; the JSON still says which
        sys.exit("bench: %s failed (exit %d): %s" % (" ".join(cmd), proc.returncode, proc.stderr.strip()))
    return json.loads(proc.stdout), proc.returncode


def load_torch():
    try:
        import torch  # noqa: F401
    except ImportError:
        return None, "PyTorch is not installed"
    import torch
    if not torch.cuda.is_available():
        return None, "PyTorch has no CUDA device"
    return torch, None


def time_sdpa(torch, cfg, backend, repeats=30, warmup=3):
    """Median ms of one SDPA decode call on contiguous K/V, or None with the reason."""
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel

    b, length, hq, hkv, d = cfg["batch"], cfg["len"], cfg["heads"], cfg["kv_heads"], cfg["d"]
    dev = torch.device("cuda")
    q = torch.randn(b, hq, 1, d, device=dev, dtype=torch.bfloat16)
    k = torch.randn(b, hkv, length, d, device=dev, dtype=torch.bfloat16)
    v = torch.randn(b, hkv, length, d, device=dev, dtype=torch.bfloat16)
    which = {"cudnn": SDPBackend.CUDNN_ATTENTION, "flash": SDPBackend.FLASH_ATTENTION}[backend]
    kwargs = {"enable_gqa": True} if hq != hkv else {}
    l2 = getattr(torch.cuda.get_device_properties(dev), "L2_cache_size", 64 << 20)
    flush = torch.empty(max(2 * l2, 64 << 20), dtype=torch.uint8, device=dev)

    def call():
        with sdpa_kernel([which]):
            return F.scaled_dot_product_attention(q, k, v, **kwargs)

    try:
        for _ in range(warmup):
            call()
        torch.cuda.synchronize()
    except (RuntimeError, TypeError) as e:  # no kernel for this shape, or no enable_gqa in this PyTorch
        return None, (str(e).splitlines() or ["unavailable"])[0][:80]
    times = []
    start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    for r in range(repeats):
        flush.fill_(r & 0xFF)
        start.record()
        call()
        stop.record()
        stop.synchronize()
        times.append(start.elapsed_time(stop))
    del q, k, v, flush
    torch.cuda.empty_cache()
    return statistics.median(times), None


def pick(results, kernel=None, layout="paged", chosen=None):
    for r in results:
        if layout and r["layout"] != layout:
            continue
        if kernel and r["kernel"] != kernel:
            continue
        if chosen is not None and r["chosen"] != chosen:
            continue
        return r
    return None


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--binary", default=os.path.join("build", "bin", "ch07_paged_radix"))
    ap.add_argument("--markdown", action="store_true", help="print the table as Markdown (for the README)")
    ap.add_argument("--no-torch", action="store_true", help="our kernels only")
    ap.add_argument("extra", nargs="*", help="more options for the binary, e.g. --seed 3")
    args = ap.parse_args()

    ours, rc = run_binary(args.binary, args.extra)
    torch, why_not = (None, "--no-torch") if args.no_torch else load_torch()
    ceiling = ours["read_gbps"]
    rows = []
    for cfg in ours["configs"]:
        res = cfg["results"]
        v1, v2 = pick(res, "v1"), pick(res, "v2")
        chosen = pick(res, chosen=True)
        chosen_contig = pick(res, kernel=chosen["kernel"], layout="contiguous") if chosen else None
        peers = {}
        if torch is not None and cfg["page_size"] == 16:
            for backend in ("cudnn", "flash"):
                ms, err = time_sdpa(torch, cfg, backend)
                peers[backend] = (cfg["kv_bytes"] / (ms * 1e-3) / 1e9, None) if ms else (None, err)
        rows.append((cfg, v1, v2, chosen, chosen_contig, peers))

    def gb(x):
        return "%.0f" % x if x is not None else "-"

    def share(x):
        return "%.0f%%" % (100.0 * x / ceiling) if x is not None else "-"

    head = ["B", "L", "Hq/Hkv", "P", "v1 GB/s", "v2 GB/s (S)", "chosen", "share", "contiguous", "paging cost",
            "cuDNN GB/s", "share", "flash GB/s", "chosen / cuDNN", "check"]
    table = []
    for cfg, v1, v2, chosen, contig, peers in rows:
        cud = peers.get("cudnn", (None, None))[0]
        fl = peers.get("flash", (None, None))[0]
        cost = "-"
        if chosen and contig:
            cost = "%+.1f%%" % (100.0 * (contig["kv_gbps"] / chosen["kv_gbps"] - 1.0))
        checks = all(r["pass"] for r in cfg["results"])
        table.append([
            str(cfg["batch"]), str(cfg["len"]), "%d/%d" % (cfg["heads"], cfg["kv_heads"]), str(cfg["page_size"]),
            gb(v1["kv_gbps"]), "%s (%d)" % (gb(v2["kv_gbps"]), v2["splits"]),
            chosen["kernel"] if chosen else "-", share(chosen["kv_gbps"] if chosen else None),
            gb(contig["kv_gbps"]) if contig else "-", cost, gb(cud), share(cud), gb(fl),
            "%.2f" % (chosen["kv_gbps"] / cud) if (chosen and cud) else "-", "pass" if checks else "FAIL"])

    print("device : %s, %s" % (ours["device_name"], ours["date"]))
    print("ceiling: read %.0f GB/s, measured by the binary in this run" % ceiling)
    if torch is None:
        print("peers  : none (%s): our kernels only" % why_not)
    else:
        import torch as t
        print("peers  : PyTorch %s SDPA (cuDNN %s), same shapes, K/V contiguous [B, Hkv, L, d] bf16"
              % (t.__version__, t.backends.cudnn.version()))
    print()
    if args.markdown:
        print("| " + " | ".join(head) + " |")
        print("|" + "---|" * len(head))
        for r in table:
            print("| " + " | ".join(r) + " |")
    else:
        w = [max(len(h), *(len(r[i]) for r in table)) for i, h in enumerate(head)]
        print("  ".join(h.rjust(w[i]) for i, h in enumerate(head)))
        for r in table:
            print("  ".join(c.rjust(w[i]) for i, c in enumerate(r)))
    for cfg, v1, v2, chosen, contig, peers in rows:
        for backend, (x, err) in peers.items():
            if err:
                print("note: %s unavailable for B=%d L=%d %d/%d: %s" % (backend, cfg["batch"], cfg["len"], cfg["heads"],
                                                                      cfg["kv_heads"], err))
    print("\nKV GB/s = bytes of every cached K and V row (bf16) / median time. 'chosen' is the kernel the\n"
          "v1/v2 heuristic picks; 'paging cost' is the contiguous copy's speed over the paged one's, minus 1.")
    return 1 if rc else 0


if __name__ == "__main__":
    sys.exit(main())
