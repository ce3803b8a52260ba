#!/usr/bin/env python3
"""Chapter 05 next to its peers, in one run on one GPU.

    python3 bench/ch05_fa3.py --bin build/bin/ch05_fa3_hopper [--n 8192] [--shapes all|quick]

For each of the FlashAttention-3 paper's forward shapes (16K tokens per batch at
N = 8K: batch 2; hidden 2048, so heads = 2048 / d) it runs

  * PyTorch SDPA with the cuDNN backend and with the flash backend (FlashAttention-2),
  * FlashAttention-4 (flash_attn.cute, [B, N, H, d]) where it is importable,
  * every step of ch05_fa3_hopper (its own --bench --json report: checked, then timed),

and prints TFLOP/s with FlashAttention's FLOP convention (4 B H N^2 d, halved when
causal), the share of the cuBLAS GEMM ceiling that the chapter binary measured in the
same run, and the best step relative to cuDNN. Timing: CUDA events, 3 warm-ups, the
median of 20, a 256 MB buffer written between repeats to flush the L2 (the chapter
binary times the same way). Prints a Markdown table last; --json writes the raw numbers.

    python3 bench/ch05_fa3.py --bin NEW/ch05_fa3_hopper --before OLD/ch05_fa3_hopper [--rounds 2]

compares two builds of the chapter instead (no peers): the same shapes, each binary
run --rounds times in alternation, the best TFLOP/s of each step kept, and every step
of NEW next to the step of OLD that computes the same kernel. OLD is the landed tree
before the steps were split (seven steps: its v6 is NEW's v8, its v7 NEW's v9); NEW's
v6 and v7 have no counterpart there.
"""
import argparse
import json
import subprocess
import sys


def flops(b, h, n, d, causal):
    f = 4.0 * b * h * n * n * d
    return f / 2 if causal else f


def time_torch(fn, torch, repeats=20):
    flush = torch.empty(256 << 20, dtype=torch.uint8, device="cuda")
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    times = []
    for r in range(repeats):
        flush.fill_(r & 0xFF)
        start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        stop.record()
        stop.synchronize()
        times.append(start.elapsed_time(stop))
    times.sort()
    return times[len(times) // 2]


PEERS = ["cudnn", "fa4", "flash"]  # --peers


def peers(b, h, n, d, causal):
    """TFLOP/s of SDPA's cuDNN and flash backends and of FA4 (None when one refuses the shape)."""
    import torch
    from torch.nn.attention import SDPBackend, sdpa_kernel

    q, k, v = (torch.randn(b, h, n, d, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    out = {}
    try:
        if "fa4" not in PEERS:
            raise RuntimeError("not asked for (--peers)")
        from flash_attn.cute import flash_attn_func
        qt, kt, vt = (x.transpose(1, 2).contiguous() for x in (q, k, v))  # FA4 takes [B, N, H, d]

        def fa4():
            o = flash_attn_func(qt, kt, vt, causal=causal)
            return o[0] if isinstance(o, tuple) else o
        if not torch.isfinite(fa4()).all():
            raise RuntimeError("non-finite output")
        out["fa4"] = flops(b, h, n, d, causal) / (time_torch(fa4, torch) * 1e-3) / 1e12
    except Exception as e:  # not importable here, or no kernel for the shape
        print(f"  fa4: {str(e).splitlines()[0][:160] if str(e) else type(e).__name__}", file=sys.stderr)
        out["fa4"] = None
    for name, backend in (("cudnn", SDPBackend.CUDNN_ATTENTION), ("flash", SDPBackend.FLASH_ATTENTION)):
        if name not in PEERS:
            out[name] = None
            continue
        try:
            with sdpa_kernel(backend):
                fn = lambda: torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=causal)
                o = fn()
                if not torch.isfinite(o).all():
                    raise RuntimeError("non-finite output")
                ms = time_torch(fn, torch)
            out[name] = flops(b, h, n, d, causal) / (ms * 1e-3) / 1e12
        except Exception as e:  # a backend that does not take the shape is reported, not fatal
            print(f"  {name}: {e}", file=sys.stderr)
            out[name] = None
    return out


EXTRA = []  # more flags for the chapter binary (--extra)


def ours(binary, b, h, n, d, causal, timeout, steps=None):
    """The binary's --json report; with `steps` (e.g. ["8", "10"]) one run per step, merged."""
    rep = None
    for step in steps or ["all"]:
        args = [binary, "--n", str(n), "--batch", str(b), "--heads", str(h), "--kv-heads", str(h), "--d", str(d),
                "--bench", "--no-fp8-table", "--json", "--step", step] + (["--causal"] if causal else []) + EXTRA
        r = subprocess.run(args, capture_output=True, text=True, timeout=timeout)
        if r.returncode not in (0, 1):
            raise RuntimeError(f"{' '.join(args)} exited {r.returncode}: {r.stderr.strip()}")
        one = json.loads(r.stdout)
        if rep is None:
            rep = one
        else:
            rep["results"] += [x for x in one["results"] if x["device"] == "cuda"]
    return rep


# The landed seven-step numbering -> this chapter's nine steps (the same kernels).
BEFORE_TO_AFTER = {"v1": "v1", "v2": "v2", "v3": "v3", "v4": "v4", "v5": "v5", "v6": "v8", "v7": "v9"}


def forward_row(r):
    """A forward step's row of the report ("v10 ..."; the backward's rows are "b1 ...")."""
    return r["device"] == "cuda" and r["impl"].startswith("v")


def step_key(k):
    return int(k[1:]) if k[1:].isdigit() else 99


def step_rates(rep):
    """{"v3": (TFLOP/s, pass)} of the GPU rows of one --json report."""
    return {r["impl"].split()[0]: (r["tflops"], r["pass"]) for r in rep["results"] if forward_row(r)}


def before_after(a, shapes, b):
    print("| shape | step | before (TFLOP/s) | after (TFLOP/s) | after / before |")
    print("|---|---|---|---|---|")
    raw = []
    for d, causal in shapes:
        h = 2048 // d
        label = f"d={d} N={a.n} B={b} H={h}{' causal' if causal else ''}"
        best = {"before": {}, "after": {}}
        for rnd in range(a.rounds):
            for which, binary in (("before", a.before), ("after", a.bin)):
                rates = step_rates(ours(binary, b, h, a.n, d, causal, a.timeout, a.steps))
                for k, (t, ok) in rates.items():
                    key = BEFORE_TO_AFTER.get(k, k) if which == "before" else k
                    if not ok:
                        print(f"  {which} {key} {label}: FAILED its check", file=sys.stderr)
                    if t is not None:
                        best[which].setdefault(key, []).append(t)
        raw.append({"shape": label, "rounds": best})
        for k in sorted(best["after"], key=step_key):
            after = max(best["after"][k])
            before = max(best["before"][k]) if k in best["before"] else None
            ratio = f"{after / before:.3f}" if before else "- (new step)"
            print(f"| {label} | {k} | {before:.1f} | {after:.1f} | {ratio} |" if before else
                  f"| {label} | {k} | - | {after:.1f} | {ratio} |", flush=True)
    if a.json:
        with open(a.json, "w") as f:
            json.dump(raw, f, indent=1)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--bin", required=True, help="path to ch05_fa3_hopper")
    ap.add_argument("--n", type=int, default=8192)
    ap.add_argument("--batch", type=int, help="default: 16384 / N")
    ap.add_argument("--shapes", choices=["all", "quick"], default="all")
    ap.add_argument("--json", help="write the raw numbers here")
    ap.add_argument("--timeout", type=int, default=300)
    ap.add_argument("--before", help="an older ch05_fa3_hopper: compare the two builds, no peers")
    ap.add_argument("--rounds", type=int, default=1, help="with --before: runs of each binary, best kept")
    ap.add_argument("--dims", help="only these head dims, e.g. 64,256")
    ap.add_argument("--mask", choices=["both", "causal", "none"], default="both", help="causal shapes, others, or both")
    ap.add_argument("--steps", help="only these steps of the binary, e.g. 8,10 (one run each)")
    ap.add_argument("--no-peers", action="store_true", help="time the steps only")
    ap.add_argument("--extra", default="", help="more flags for the binary, e.g. --no-backward")
    ap.add_argument("--peers", default="cudnn,fa4,flash", help="which peers to time (cudnn, fa4, flash)")
    a = ap.parse_args()
    a.steps = a.steps.split(",") if a.steps else None
    EXTRA.extend(a.extra.split())
    PEERS[:] = a.peers.split(",")
    shapes = [(128, False), (128, True), (64, False), (64, True), (256, False), (256, True)]
    if a.shapes == "quick":
        shapes = [(128, False), (128, True)]
    if a.dims:  # in the order given
        shapes = [(int(d), c) for d in a.dims.split(",") for dd, c in shapes if dd == int(d)]
    if a.mask != "both":
        shapes = [(d, c) for d, c in shapes if c == (a.mask == "causal")]
    b = a.batch or max(1, 16384 // a.n)
    if a.before:
        before_after(a, shapes, b)
        return
    rows, raw, names, fp8_names = [], [], set(), set()
    for d, causal in shapes:
        h = 2048 // d
        label = f"d={d} N={a.n} B={b} H={h}{' causal' if causal else ''}"
        print(f"== {label}", file=sys.stderr)
        p = {} if a.no_peers else peers(b, h, a.n, d, causal)
        rep = ours(a.bin, b, h, a.n, d, causal, a.timeout, a.steps)
        gemm = rep["ceilings"]["gemm_tflops"]
        steps, fp8 = {}, set()
        for r in rep["results"]:
            if forward_row(r):
                steps[r["impl"].split()[0]] = (r["tflops"], r["pass"], r.get("ceiling_share"))
                if "fp8" in r["impl"]:
                    fp8.add(r["impl"].split()[0])
        names.update(steps)
        fp8_names.update(fp8)
        raw.append({"shape": label, "peers": p, "steps": steps, "gemm_tflops": gemm, "device": rep["device_name"],
                    "results": rep["results"], "notes": rep["notes"]})
        bf16 = [v[0] for k, v in steps.items() if k not in fp8 and v[0] and v[1]]
        best = max(bf16) if bf16 else None
        ratios = [f"{best / p[k]:.3f}x" if best and p.get(k) else "-" for k in ("cudnn", "fa4")]
        rows.append((label, gemm, p, steps, ratios))
        print(f"# {label}: " + ", ".join(f"{k} {v:.1f}" for k, v in p.items() if v) + "; " +
              ", ".join(f"{k} {t[0]:.1f}{'' if t[1] else ' FAIL'}" for k, t in sorted(steps.items(), key=lambda kv: step_key(kv[0]))
                        if t[0] is not None), file=sys.stderr, flush=True)
    if a.json:
        with open(a.json, "w") as f:
            json.dump(raw, f, indent=1)
    order = sorted(names, key=step_key)
    head = ["shape", "cuBLAS GEMM", "cuDNN", "FA4", "FA2 (flash)"] + [k + (" fp8" if k in fp8_names else "") for k in order] + [
        "best bf16 / cuDNN", "best bf16 / FA4"]
    print("| " + " | ".join(head) + " |")
    print("|" + "---|" * len(head))
    for label, gemm, p, steps, ratios in rows:
        cells = [label, f"{gemm:.0f}" if gemm else "-", *(f"{p[k]:.0f}" if p.get(k) else "-" for k in ("cudnn", "fa4", "flash"))]
        for k in order:
            t = steps.get(k)
            cells.append("-" if not t or t[0] is None else (f"{t[0]:.1f}" + ("" if t[1] else " FAIL")))
        print("| " + " | ".join(cells + ratios) + " |")


if __name__ == "__main__":
    main()
