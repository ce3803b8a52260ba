#!/usr/bin/env python3
"""How much of a short decode step's time is the L2 flush's dirty lines (chapter 07, B = 1).

Every timed repeat of the project (common/cuda/runtime.cu's time_gpu(), bench_peers.py's
_time()) first *writes* a buffer twice the L2's size, so the timed kernel starts with an
L2 full of dirty lines: each line it misses on evicts one, and the write-back shares DRAM
with the kernel's reads. For a 134 MB read (one 32K-token sequence, GQA 32/8, d = 128) that
can be tens of MB of writes. This probe times one plain streaming read (torch.sum over a
bf16 tensor of the step's size) after three flushes:

    dirty : fill_ a 2 x L2 buffer (what the harness does)
    clean : fill_ it, then read it (the dirty lines are written back before the timer starts)
    none  : no flush (part of the tensor may still be in L2)

    python3 chapters/07_paged_radix/scripts/flush_probe.py [MB ...]      default: 134 268 537 (L = 32K, 64K, 128K)
"""
import statistics
import sys

import torch


def main():
    sizes = [float(x) for x in sys.argv[1:]] or [134.2, 268.4, 536.9]
    dev = torch.cuda.current_device()
    l2 = torch.cuda.get_device_properties(dev).L2_cache_size
    flush = torch.empty(max(2 * l2, 64 << 20), dtype=torch.uint8, device="cuda")
    print("%s; L2 %d MB; flush buffer %d MB" % (torch.cuda.get_device_name(dev), l2 >> 20, flush.numel() >> 20))
    print("| MB read | dirty flush us | clean flush us | no flush us | dirty GB/s | clean GB/s | dirty - clean us |")
    print("|---|---|---|---|---|---|---|")
    for mb in sizes:
        x = torch.ones(int(mb * 1e6 / 2), dtype=torch.bfloat16, device="cuda")
        res = {}
        for mode in ("dirty", "clean", "none"):
            s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            ts = []
            for r in range(25):
                if mode != "none":
                    flush.fill_(r & 0xFF)
                if mode == "clean":
                    flush.sum(dtype=torch.int64)
                s.record()
                torch.sum(x, dtype=torch.float32)
                e.record()
                e.synchronize()
                ts.append(s.elapsed_time(e) * 1e3)
            res[mode] = statistics.median(ts[3:])
        nbytes = x.numel() * 2
        print("| %.0f | %.1f | %.1f | %.1f | %.0f | %.0f | %.1f |" % (
            nbytes / 1e6, res["dirty"], res["clean"], res["none"], nbytes / res["dirty"] / 1e3,
            nbytes / res["clean"] / 1e3, res["dirty"] - res["clean"]))
        del x


if __name__ == "__main__":
    main()
