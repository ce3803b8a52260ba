#!/usr/bin/env python3
"""Chapter 05's forward next to cuDNN by kernel duration (Nsight Compute), not by events.

    python3 chapters/05_fa3_hopper/scripts/ncu_fwd.py --bin build/bin/ch05_fa3_hopper \\
        --shape 128:0:10 --shape 128:1:6,11 --shape 64:1:11 ...   # d:causal:steps[:N]
        [--n 8192] [--launches 3]                                 # B = 16384 / N, H = 2048 / d

Nsight Compute (`ncu --metrics gpu__time_duration.sum --clock-control none`:
the GPU at its own clocks, the caches flushed before every profiled kernel, as the
chapter's event timing flushes the L2) run

  * per shape, the chapter binary with `--step S1,S2,... --launch-only K`: the chosen steps'
    kernels launched K times on inputs written on the device, nothing uploaded, checked or timed
    (a process takes seconds, not the minutes of an fp64 check under the profiler), the
    chosen steps' kernels profiled (one profiler run per shape: ncu's CSV does not list
    processes in the order they ran);
  * one Python process per peer, K calls per shape (after ours, so that our durations are
    printed even if PyTorch's start runs out of time): PyTorch SDPA's cuDNN backend, and
    with `--peers cudnn,fa4` FlashAttention-4 (`flash_attn.cute.flash_attn_func`, [B, N, H, d];
    its JIT compilation runs on the host before the first launch, so it does not touch the
    kernel's duration).

Only the attention kernels are profiled (`-k regex:`): ours are `attn::ch05::vN::kernel`,
cuDNN's and FA4's carry "sdpa", "fmha" or "flash" in their names (every name is printed). Each shape's duration is the
median of its K launches; the table shows both, their ratio and ours as TFLOP/s by the
kernel's duration (FlashAttention's FLOP count). A rate from events and one from ncu
differ by launch gaps and clocks; the ratio of the two kernels is the claim that does
not depend on the timing method.
"""
import argparse
import csv
import glob
import io
import re
import os
import shlex
import shutil
import statistics
import subprocess
import sys
import time

CUDNN = r'''
import sys, torch
from torch.nn.attention import SDPBackend, sdpa_kernel
k = int(sys.argv[1])
for spec in sys.argv[2:]:
    b, h, n, d, causal = (int(x) for x in spec.split(","))
    q, kk, v = (torch.randn(b, h, n, d, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
        for _ in range(k):
            torch.nn.functional.scaled_dot_product_attention(q, kk, v, is_causal=bool(causal))
    torch.cuda.synchronize()
    print(f"cudnn-done {spec}", file=sys.stderr, flush=True)
    del q, kk, v
'''

FA4 = r'''
import sys, torch
from flash_attn.cute import flash_attn_func
k = int(sys.argv[1])
for spec in sys.argv[2:]:
    b, h, n, d, causal = (int(x) for x in spec.split(","))
    q, kk, v = (torch.randn(b, n, h, d, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    for _ in range(k):
        flash_attn_func(q, kk, v, causal=bool(causal))
    torch.cuda.synchronize()
    print(f"fa4-done {spec}", file=sys.stderr, flush=True)
    del q, kk, v
'''

PEERS = {"cudnn": ("cuDNN", CUDNN), "fa4": ("FA4", FA4)}
PEER = r"sdpa|fmha|flash|cudnn"   # cuDNN's generated attention kernels, FA4's CuTe DSL kernels


def ncu_binary():
    for c in [shutil.which("ncu"), "/usr/local/cuda/bin/ncu", *sorted(glob.glob("/opt/nvidia/nsight-compute/*/ncu"))]:
        if c and os.path.exists(c):
            return c
    raise SystemExit("ncu not found")


def step_of(kernel):
    """The step of one of our kernel names, mangled (`_ZN4attn4ch053v1050_GLOBAL...`: the
    namespace `v10` after its length 3) or demangled (`void v10::<unnamed>::kernel<...>`)."""
    m = re.search(r"4ch05(\d)(v\d+)", kernel)
    if m:
        return int(m.group(2)[1:int(m.group(1))])
    m = re.search(r"\bv(\d+)::", kernel)
    return int(m.group(1)) if m else None


def tag_steps(rows, steps, launches):
    """Each row's step in a "Step" field: from its kernel's name, or, where ncu reported the name
    without our namespace (seen on the H200 when a process launched one step: "void
    (anonymous namespace)::kernel<...>"), from its launch's place: the binary launches the chosen
    steps in ascending order, each `launches` times, so launch k (in ID order) is step k // launches."""
    ids = []
    for r in rows:
        if r.get("ID") not in ids:
            ids.append(r.get("ID"))
    order = sorted(steps)
    for r in rows:
        st = step_of(r.get("Kernel Name", ""))
        if st is None and len(ids) == launches * len(order):
            st = order[ids.index(r.get("ID")) // launches]
        r["Step"] = st
    return rows


# --profile: where a kernel's time goes, the same metrics for ours and the peers' kernels.
PROFILE = ["gpu__time_duration.sum", "sm__cycles_elapsed.avg.per_second",
           "sm__inst_issued.avg.pct_of_peak_sustained_active",      # issue slots busy
           "smsp__issue_active.avg.pct_of_peak_sustained_active",   # cycles with an instruction issued
           "smsp__warps_active.avg.per_cycle_active", "smsp__warps_eligible.avg.per_cycle_active",
           r"regex:sm__pipe_tensor.*cycles_active\.avg\.pct_of_peak_sustained_active",
           r"regex:smsp__warp_issue_stalled_.*_per_warp_active\.pct",
           # what the kernel is: its launch, its instruction count, its other pipes (MUFU, FMA, ALU)
           "launch__grid_size", "launch__block_size", "launch__registers_per_thread",
           "launch__shared_mem_per_block_dynamic", "smsp__inst_executed.sum",
           "sm__inst_executed_pipe_xu.avg.pct_of_peak_sustained_active",
           "sm__pipe_fma_cycles_active.avg.pct_of_peak_sustained_active",
           "sm__pipe_alu_cycles_active.avg.pct_of_peak_sustained_active"]
METRICS = ["gpu__time_duration.sum"]


def ncu(cmd, regex, timeout, what):
    """The METRICS rows (by default gpu__time_duration.sum) of every kernel matching `regex` that `cmd` runs."""
    args = [ncu_binary(), "--metrics", ",".join(METRICS), "--clock-control", "none", "--csv",
            "--print-units", "base", "--kernel-name-base", "mangled", "--target-processes", "all",
            "-k", "regex:" + regex] + cmd
    t0 = time.time()
    try:
        r = subprocess.run(args, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired as e:
        out = e.stdout.decode() if isinstance(e.stdout, bytes) else (e.stdout or "")
        print(f"# ncu ({what}) ran past {timeout} s; its last output: {out[-600:]}", flush=True)
        return []
    print(f"# ncu ({what}): rc {r.returncode}, {time.time() - t0:.1f} s: {' '.join(args[1:14])}", flush=True)
    text = r.stdout[r.stdout.find('"ID"'):] if '"ID"' in r.stdout else ""
    rows = [row for row in csv.DictReader(io.StringIO(text))
            if row.get("Metric Name") == "gpu__time_duration.sum" or (len(METRICS) > 1 and row.get("Metric Name"))]
    if not rows or r.returncode != 0:
        print(f"# ncu ({what}) profiled {len(rows)} kernels; its last output:\n" + (r.stdout + r.stderr)[-1500:], flush=True)
    return rows


def print_profile(what, rows):
    """One line per profiled kernel launch: its duration, SM clock, issue, warps, tensor pipe and
    the five largest stall reasons (% of the active warps' cycles), in the order ncu ran them."""
    by_id = {}
    for r in rows:
        by_id.setdefault(r.get("ID"), {"name": r.get("Kernel Name", ""), "step": r.get("Step")})[r["Metric Name"]] = r["Metric Value"]
    for m in by_id.values():
        num = lambda k: float(m[k].replace(",", "")) if m.get(k) not in (None, "", "n/a") else float("nan")
        st = m.get("step") or step_of(m["name"])
        tensor = ", ".join(f"{k.split('__pipe_')[1].split('_cycles')[0]} {num(k):.1f}%" for k in sorted(m)
                           if k.startswith("sm__pipe_tensor"))
        stalls = sorted(((num(k), k.split("stalled_")[1].split("_per_warp")[0]) for k in m if "issue_stalled" in k),
                        reverse=True)[:5]
        print(f"# profile {what} | {'v' + str(st) if st else m['name'][:70]} | "
              f"{num('gpu__time_duration.sum') / 1e3:.1f} us at {num('sm__cycles_elapsed.avg.per_second') / 1e9:.2f} GHz | "
              f"issue slots {num('sm__inst_issued.avg.pct_of_peak_sustained_active'):.1f}%, "
              f"issued in {num('smsp__issue_active.avg.pct_of_peak_sustained_active'):.1f}% of cycles | "
              f"warps a scheduler: active {num('smsp__warps_active.avg.per_cycle_active'):.2f}, "
              f"eligible {num('smsp__warps_eligible.avg.per_cycle_active'):.2f} | tensor pipe: {tensor} | "
              f"stalls: {', '.join(f'{n} {v:.1f}' for v, n in stalls)} | "
              f"grid {num('launch__grid_size'):.0f} x {num('launch__block_size'):.0f} threads, "
              f"{num('launch__registers_per_thread'):.0f} registers, "
              f"{num('launch__shared_mem_per_block_dynamic') / 1024:.0f} KB dynamic smem | "
              f"{num('smsp__inst_executed.sum') / 1e6:.1f} M warp instructions | "
              f"xu {num('sm__inst_executed_pipe_xu.avg.pct_of_peak_sustained_active'):.1f}%, "
              f"fma {num('sm__pipe_fma_cycles_active.avg.pct_of_peak_sustained_active'):.1f}%, "
              f"alu {num('sm__pipe_alu_cycles_active.avg.pct_of_peak_sustained_active'):.1f}%", flush=True)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--bin", required=True)
    ap.add_argument("--shape", action="append", required=True,
                    help="d:causal:steps[:N], e.g. 128:1:6,11 or 128:0:10:2048 (N: --n unless given)")
    ap.add_argument("--n", type=int, default=8192)
    ap.add_argument("--batch", type=int, help="default 16384 / N")
    ap.add_argument("--launches", type=int, default=3, help="launches of each kernel (the median is kept)")
    ap.add_argument("--no-peer", action="store_true", help="our kernels only")
    ap.add_argument("--no-ours", action="store_true", help="the peers' kernels only")
    ap.add_argument("--peers", default="cudnn", help="peers to profile after ours: cudnn, fa4 (comma-separated)")
    ap.add_argument("--timeout", type=int, default=60, help="seconds for our kernels' profiler run")
    ap.add_argument("--peer-timeout", type=int, default=60, help="seconds for each peer's profiler run")
    ap.add_argument("--profile", action="store_true",
                    help="not durations alone: issue slots, tensor pipe, warps active and eligible, stall reasons "
                         "(one launch of each kernel: --launches 1)")
    ap.add_argument("--metrics", help="with --profile: these metrics (comma-separated) in place of the profile's")
    a = ap.parse_args()
    if a.profile:
        METRICS[:] = a.metrics.split(",") if a.metrics else PROFILE
    shapes = []  # (d, causal, steps, H, N, B)
    for s in a.shape:
        d, c, steps, *rest = s.split(":")
        n = int(rest[0]) if rest else a.n
        shapes.append((int(d), int(c), [int(x) for x in steps.split(",")], 2048 // int(d), n,
                       a.batch or max(1, 16384 // n)))

    # Ours: one profiler run per shape (ncu's CSV does not list processes in the order they ran),
    # each over one process launching the chosen steps alone. (With `--step all`, every step of the
    # shape, a process once took about 8 s under the profiler against 2.5 s in another run; why
    # was not measured, but fewer launches leave the profiler less to intercept.)
    rows, per_shape = [], []
    for d, c, steps, h, n, b in ([] if a.no_ours else shapes):
        cmd = [a.bin, "--n", str(n), "--batch", str(b), "--heads", str(h), "--kv-heads", str(h), "--d", str(d),
               "--step", ",".join(str(st) for st in steps), "--no-fp8-table", "--no-backward", "--launch-only", str(a.launches)]
        regex = "4ch05(" + "|".join(f"{len('v' + str(st))}v{st}" for st in steps) + r")[0-9]+_GLOBAL.*6kernelI"
        what = f"d={d}{'' if n == a.n else f' N={n}'}{' causal' if c else ''}"
        got = tag_steps(ncu(cmd + (["--causal"] if c else []), regex, a.timeout, what), steps, a.launches)
        per_shape.append(got)
        rows += got
        if a.profile:
            print_profile(what, got)
    if a.no_ours:
        per_shape = [[] for _ in shapes]
    if a.profile:
        for peer in ([] if a.no_peer else [x for x in a.peers.split(",") if x]):
            label, script = PEERS[peer]
            specs = [f"{b},{h},{n},{d},{c}" for d, c, _, h, n, b in shapes]
            print_profile(label + " " + " ".join(specs),
                          ncu([sys.executable, "-c", script, str(a.launches)] + specs, PEER, a.peer_timeout, label))
        return 0
    # Ours at once (median us per shape and step), in case the peer's run does not end in time.
    print("# ours by ncu (median us): " + "; ".join(
        f"d={d}{'' if n == a.n else f' N={n}'}{' causal' if c else ''} v{st}: " +
        (f"{statistics.median(ts) / 1e3:.1f}" if (ts := [float(r['Metric Value'].replace(',', '')) for r in got
                                                        if r.get('Step') == st]) else "-")
        for (d, c, steps, _, n, _), got in zip(shapes, per_shape) for st in steps), flush=True)
    peers = [] if a.no_peer else [x for x in a.peers.split(",") if x]
    peer_ns = {}  # peer -> [median ns per shape] (None where its kernels could not be split by shape)
    for peer in peers:
        label, script = PEERS[peer]
        specs = [f"{b},{h},{n},{d},{c}" for d, c, _, h, n, b in shapes]
        got = ncu([sys.executable, "-c", script, str(a.launches)] + specs, PEER, a.peer_timeout, label)
        rows += got
        kernels = [(r["Kernel Name"], float(r["Metric Value"].replace(",", ""))) for r in got]
        names = sorted({k[:90] for k, _ in kernels})
        print(f"# {label}: {len(kernels)} kernels ({'; '.join(names[:3])})", flush=True)
        # k kernels a call (one, unless the peer splits the attention): a call's durations summed.
        per = len(kernels) // (a.launches * len(shapes)) if kernels else 0
        if per and len(kernels) == per * a.launches * len(shapes):
            peer_ns[peer] = [statistics.median(
                sum(t for _, t in kernels[(i * a.launches + j) * per:(i * a.launches + j + 1) * per])
                for j in range(a.launches)) for i in range(len(shapes))]
        elif kernels:
            print(f"# {label}: {len(kernels)} kernels for {len(shapes)} shapes x {a.launches} calls: not split by shape")
    if not rows:
        return 1
    print(f"# {len(rows)} kernels profiled", flush=True)
    head = ["shape", "step", "ours, ncu (us)"]
    for peer in peers:
        head += [f"{PEERS[peer][0]}, ncu (us)", f"{PEERS[peer][0]} / ours"]
    head += ["ours TFLOP/s by ncu"] + [f"{PEERS[peer][0]} TFLOP/s by ncu" for peer in peers]
    print("| " + " | ".join(head) + " |")
    print("|" + "---|" * len(head))
    for i, (d, c, steps, h, n, b) in enumerate(shapes):
        fl = 4.0 * b * h * n * n * d / (2 if c else 1)
        pv = {peer: (peer_ns[peer][i] if peer in peer_ns else None) for peer in peers}
        label = f"d={d} N={n} B={b} H={h}{' causal' if c else ''}"
        for st in steps:
            ks = [float(r["Metric Value"].replace(",", "")) for r in per_shape[i] if r.get("Step") == st]
            o = statistics.median(ks) if ks else None
            cells = [label, f"v{st}", f"{o / 1e3:.1f}" if o else "-"]
            for peer in peers:
                p = pv[peer]
                cells += [f"{p / 1e3:.1f}" if p else "-", f"{p / o:.3f}" if o and p else "-"]
            cells += [f"{fl / (o * 1e-9) / 1e12:.0f}" if o else "-"]
            cells += [f"{fl / (pv[peer] * 1e-9) / 1e12:.0f}" if pv[peer] else "-" for peer in peers]
            print("| " + " | ".join(cells) + " |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
