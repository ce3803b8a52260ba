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

For Nsight Compute, the peers' kernels alone (nothing timed by events):

    ncu --profile-from-start off --metrics gpu__time_duration.sum --clock-control none \\
        python3 chapters/05_fa3_hopper/scripts/peers_bwd.py --profile --shape 128:1 ... > ncu.txt
    python3 chapters/05_fa3_hopper/scripts/peers_bwd.py --parse-ncu ncu.txt

`--profile` runs each (shape, peer)'s backward once between cudaProfilerStart and cudaProfilerStop,
after a 1-thread marker kernel (torch.cuda._sleep), so that `--parse-ncu` can split ncu's kernel
list by call (the call's backward runs once unprofiled before, unless --warm-n compiled it).

So that a request can do the slow parts beside other work, a run goes in phases: the imports
(no CUDA call); `--warm-after FILE` waits for FILE; then the peers' CUDA state and, with
`--warm-n N`, one forward and backward of every (shape, peer) at B = 1 and length N (FA4 compiles
once per head dim and mask, whatever the length; microseconds of GPU time each); `--ready FILE`
is written; `--wait-for FILE` waits for FILE; then the measured (or profiled) calls, alone.
"""
import argparse
import os
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "..", "bench"))


def wait_file(path):
    while path and not os.path.exists(path):
        time.sleep(0.2)


def shapes(a):
    """(d, causal, heads) of each --shape d:causal, H = 2048 / d."""
    for s in a.shape:
        d, c = (int(x) for x in s.split(":"))
        yield d, bool(c), 2048 // d


def start(a, t0, repeats):
    """The phases before the measured calls: the imports (no CUDA call), --warm-after, the
    peers' CUDA state, one forward and backward of every (shape, peer) at B = 1, N = --warm-n
    (FA4 compiles once per head dim and mask, whatever the length), --ready, --wait-for."""
    import importlib
    for m in ("torch", "torch.nn.attention.flex_attention", "torch._dynamo", "flash_attn.cute"):
        try:
            importlib.import_module(m)
        except Exception:
            pass  # Peers() says why
    t1 = time.time()
    wait_file(a.warm_after)
    t2 = time.time()
    from bench_peers import Peers
    peers = Peers(repeats=repeats)
    print("# torch %s, cuDNN %s, FA4 %s: imports %.1f s, waited %.1f s for --warm-after" % (
        peers.versions.get("torch"), peers.versions.get("cudnn"), peers.versions.get("fa4"), t1 - t0, t2 - t1), flush=True)
    if a.warm_n and peers.torch is not None:
        torch = peers.torch
        for d, c, h in shapes(a):
            for p in a.peers.split(","):
                if peers.avail.get(p, "unknown peer"):
                    continue
                t3 = time.time()
                try:
                    shape = (1, a.warm_n, h, d) if p == "fa4" else (1, h, a.warm_n, d)
                    q, k, v = (torch.randn(*shape, device="cuda", dtype=torch.bfloat16).requires_grad_(True) for _ in range(3))
                    o = peers._call(p, q, k, v, c)()
                    torch.autograd.grad(o, (q, k, v), torch.randn_like(o))
                    torch.cuda.synchronize()
                    print("# warm-up %s d=%d causal=%d N=%d: %.1f s" % (p, d, c, a.warm_n, time.time() - t3), flush=True)
                except Exception as e:
                    print("# warm-up %s d=%d causal=%d: %s" % (p, d, c, (str(e).splitlines() or [type(e).__name__])[0][:120]))
    if a.ready:
        open(a.ready, "w").write("ready\n")
    t4 = time.time()
    wait_file(a.wait_for)
    print("# ready at %.1f s, waited %.1f s for --wait-for" % (t4 - t0, time.time() - t4), flush=True)
    return peers


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shape", action="append", required=True, help="d:causal, e.g. 128:1")
    ap.add_argument("--peers", default="fa4,sdpa_cudnn,sdpa_flash")
    ap.add_argument("--n", type=int, default=8192)
    ap.add_argument("--batch", type=int, default=2)
    ap.add_argument("--profile", action="store_true", help="for ncu --profile-from-start off: each backward once, profiled")
    ap.add_argument("--warm-n", type=int, default=0,
                    help="first one forward and backward of every (shape, peer) at B = 1 and this length (FA4 compiles)")
    ap.add_argument("--warm-after", help="wait for this file after the imports, before any CUDA call")
    ap.add_argument("--ready", help="write this file when the warm-ups are done")
    ap.add_argument("--wait-for", help="wait for this file before the measured (or profiled) calls")
    a = ap.parse_args()
    t0 = time.time()
    peers = start(a, t0, repeats=1 if a.profile else 20)
    if a.profile:
        return profile(a, t0, peers)
    from bench_common import PEER_LABEL
    print("| peer | d | causal | B x H x N | ms | TFLOP/s | status |")
    print("|---|---|---|---|---|---|---|")
    for d, c, h in shapes(a):
        for p in a.peers.split(","):
            t1 = time.time()
            r = peers.attention(p, a.batch, h, h, a.n, a.n, d, c, backward=True)
            ms, tf = r.get("time_ms"), r.get("tflops")
            print("| %s | %d | %s | %d x %d x %d | %s | %s | %s (%.1f s) |" % (
                PEER_LABEL.get(p, p), d, "yes" if c else "no", a.batch, h, a.n,
                "%.3f" % ms if ms else "-", "%.1f" % tf if tf else "-",
                r.get("status") if r.get("status") == "ok" else "%s: %s" % (r.get("status"), r.get("note", "")[:120]),
                time.time() - t1), flush=True)


def profile(a, t0, peers):
    """Each peer's backward once between cudaProfilerStart/Stop, after a marker kernel."""
    from bench_common import PEER_LABEL
    torch = peers.torch
    if torch is None:
        print("# no PyTorch: nothing profiled")
        return
    n = 0
    for d, c, h in shapes(a):
        for p in a.peers.split(","):
            label = "%s d=%d %s B=%d H=%d N=%d" % (PEER_LABEL.get(p, p), d, "causal" if c else "not-causal", a.batch, h, a.n)
            why = peers.avail.get(p, "unknown peer")
            if why:
                print("# %s: %s" % (label, why), flush=True)
                continue
            shape = (a.batch, a.n, h, d) if p == "fa4" else (a.batch, h, a.n, d)
            q, k, v = (torch.randn(*shape, device="cuda", dtype=torch.bfloat16).requires_grad_(True) for _ in range(3))
            try:
                o = peers._call(p, q, k, v, c)()
                do = torch.randn_like(o)
                if not a.warm_n:  # FA4 compiles its backward on the first call
                    torch.autograd.grad(o, (q, k, v), do, retain_graph=True)
                torch.cuda.synchronize()
                print("# profiled: %s" % label, flush=True)
                torch.cuda.profiler.start()
                torch.cuda._sleep(1000)  # the marker: one thread, a few microseconds
                torch.autograd.grad(o, (q, k, v), do)
                torch.cuda.synchronize()
                torch.cuda.profiler.stop()
                n += 1
            except Exception as e:
                print("# %s: unsupported (%s)" % (label, (str(e).splitlines() or [type(e).__name__])[0][:120]), flush=True)
            q = k = v = o = do = None
            torch.cuda.empty_cache()
    print("# %d calls profiled (%.1f s in all)" % (n, time.time() - t0), flush=True)


UNIT_MS = {"nsecond": 1e-6, "usecond": 1e-3, "msecond": 1.0, "second": 1e3, "ns": 1e-6, "us": 1e-3, "ms": 1.0, "s": 1e3}


def parse_ncu(path):
    """ncu's details output of a --profile run: one table row per call, its kernels and their sum."""
    import re
    head = re.compile(r"^  (\S.*?) \((\d+), (\d+), (\d+)\)x\((\d+), (\d+), (\d+)\), Context")
    dur = re.compile(r"gpu__time_duration\.sum\s+(\w+)\s+([\d.,]+)")
    labels = [l.split("# profiled: ", 1)[1].strip() for l in open(path, errors="replace") if l.startswith("# profiled: ")]
    groups, name = [], None
    for line in open(path, errors="replace"):
        m = head.match(line)
        if m:
            name = m.group(1)
            continue
        m = dur.search(line)
        if m and name is not None:
            ms = float(m.group(2).replace(",", "")) * UNIT_MS.get(m.group(1), float("nan"))
            if "spin_kernel" in name or "sleep" in name.lower():
                groups.append([])
            elif groups:
                groups[-1].append((name, ms))
            name = None
    if not groups:
        print("# no marker kernel found: ncu's kernels in order")
        for line in open(path, errors="replace"):
            if head.match(line) or dur.search(line):
                print(line.rstrip()[:160])
        return
    print("| call | kernels (ncu gpu__time_duration.sum) | sum ms |")
    print("|---|---|---|")
    for i, g in enumerate(groups):
        label = labels[i] if i < len(labels) else "call %d" % i
        ks = "; ".join("%s %.4g ms" % (re.sub(r"[(<].*", "", n).replace("void ", "")[:56], ms) for n, ms in g)
        print("| %s | %s | %.4g |" % (label, ks, sum(ms for _, ms in g)))
    if len(groups) != len(labels):
        print("# %d marker groups, %d profiled calls: the split is not to be trusted" % (len(groups), len(labels)))


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "--parse-ncu":
        parse_ncu(sys.argv[2])
    else:
        main()
