#!/usr/bin/env python3
"""Chapter 07's decode kernels next to their peers: a thin call of ./tutorial bench (bench/lineage.py).

    python3 bench/ch07_decode.py                                   same as: ./tutorial bench --chapters 07
    python3 bench/ch07_decode.py --binary B/bin/ch07_paged_radix    the binaries of build folder B
    python3 bench/ch07_decode.py --markdown                         also print the decode table

Runs `ch07_paged_radix decode --sweep --json` (every kernel checked against the fp64
reference, then timed) and SDPA's cuDNN and flash backends and FlashAttention-4 on the same
shapes (K/V contiguous, bf16), with the read ceiling of the same run. Results in
BUILD_DIR/bench/: the table ch07-decode of results.md, decode_gbps.png, results.json/.csv.
Other options pass through to ./tutorial bench (--quick, --out, ...).

    python3 bench/ch07_decode.py --focus b1 --binary B/bin/ch07_paged_radix [--chain R]
    python3 bench/ch07_decode.py --focus quant --binary B/bin/ch07_paged_radix [--since v3]

The two focused tables of the chapter README, each from one run of this script: `b1` runs
`decode --sweep --sweep-shapes b1` (one GQA 32/8 sequence of 32K, 64K, 128K tokens: every
kernel of the sweep; v12 and later also as R = 8 steps launched back to back, `--chain`, the time per
step, where v14's start overlaps the step before it) and times SDPA's cuDNN and flash backends and
FlashAttention-4 (where importable) on the same shapes in the same process (each peer call alone); `quant` runs `--sweep-shapes quant` (bf16, FP8, INT8 and INT4 pools
at batch 8 x 32K and 1 x 64K) and prints tokens per second and each format's ratio to bf16.
Both print markdown with the GPU, the date, the versions and the command. `--since vN`
passes through to the binary: only kernel vN and the later steps run (and are timed).

    python3 bench/ch07_decode.py --lab [...]

The main path's steps by default; `--lab` adds the lab's (v8, v10, v13: steps/lab/, LAB.md), from a
build configured with -DTUTORIAL_LAB=ON (./tutorial bench --lab builds one).

    python3 bench/ch07_decode.py --focus readme --binary B/bin/ch07_paged_radix [--since v5] [--chain R]

The README's four tables from one invocation: the accuracy table (`decode --accuracy`, the CPU
model), `quant`, `b1` with the peers, and swap against recompute (`swap --device cuda --json`,
which measures its copy and GEMM rates in the run), each with its own ceiling or rates.
"""
import os
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)


def focus(kind, binary, since=None, chain=8):
    import json
    cmd = [binary, "decode", "--sweep", "--sweep-shapes", kind, "--device", "cuda", "--json"]
    if kind == "b1" and chain > 1:
        cmd += ["--chain", str(chain)]  # v12 and later also timed as `chain` steps back to back
    if since:
        cmd += ["--since", since]
    if "--lab" in sys.argv[1:]:
        cmd += ["--lab"]  # the lab's steps too (a build configured with -DTUTORIAL_LAB=ON)
    r = subprocess.run(cmd, stdout=subprocess.PIPE, text=True)
    try:
        rep = json.loads(r.stdout)
    except ValueError:
        sys.stdout.write(r.stdout)
        print("the sweep printed no JSON (exit %d)" % r.returncode)
        return 1
    ceil = rep["read_gbps"]
    peers, versions = None, {}
    if kind == "b1":
        import bench_peers
        peers = bench_peers.Peers()
        versions = peers.versions
    print("%s; %s; read ceiling %.0f GB/s (measured by the binary in this run); versions %s" % (
        rep["device_name"], rep["date"], ceil, versions or "-"))
    print("command: python3 bench/ch07_decode.py --focus %s --binary %s%s  (runs: %s)" % (
        kind, binary, " --since " + since if since else "", " ".join(cmd)))
    print()
    ok = r.returncode == 0
    if kind == "b1":
        names = ["sdpa_cudnn", "sdpa_flash", "fa4"]
        kernels = [k for k in ("v1", "v2", "v3", "v4", "v5", "v6", "v12", "v14")
                   if any(x["kernel"] == k for c in rep["configs"] for x in c["results"])]
        last = kernels[-1]
        # Kernels timed in a chain of steps back to back (--chain): one more column each.
        chained = [k for k in kernels
                   if any(x["kernel"] == k and x.get("chain") for c in rep["configs"] for x in c["results"])]
        print("| B | L | Hq/Hkv | P | " + " | ".join("%s GB/s (S)" % k for k in kernels) + " | %s share | " % last +
              "".join("%s x%d in a row GB/s (share) | " % (k, chain) for k in chained) +
              " | ".join("%s GB/s (share)" % n for n in names) + " | %s / cuDNN | %s / v3 | check |" % (last, last))
        print("|" + "---|" * (4 + len(kernels) + 1 + len(chained) + len(names) + 3))
        for c in rep["configs"]:
            res = {x["kernel"]: x for x in c["results"] if x["layout"] == "paged"}
            cells, cudnn = [], None
            for n in names:
                pr = peers.decode(n, c["batch"], c["heads"], c["kv_heads"], c["len"], c["d"], c["kv_bytes"])
                cells.append("%.0f (%.0f%%)" % (pr["gbps"], 100 * pr["gbps"] / ceil) if pr.get("status") == "ok"
                             else "- (%s)" % pr.get("note", pr.get("status"))[:60])
                if n == "sdpa_cudnn" and pr.get("status") == "ok":
                    cudnn = pr.get("gbps")
            ours = ["%.0f (%d)" % (res[k]["kv_gbps"], res[k]["splits"]) if k in res else "-" for k in kernels]
            top = res[last]["kv_gbps"]
            chains = "".join("%.0f (%.0f%%) | " % (res[k]["chain_gbps"], 100 * res[k]["chain_gbps"] / ceil)
                             if k in res and res[k].get("chain") else "- | " for k in chained)
            check = "pass" if all(x["pass"] for x in c["results"]) else "FAIL"
            print("| %d | %d | %d/%d | %d | %s | %.0f%% | %s%s | %s | %.2f | %s |" % (
                c["batch"], c["len"], c["heads"], c["kv_heads"], c["page_size"], " | ".join(ours), 100 * top / ceil,
                chains, " | ".join(cells), "%.2f" % (top / cudnn) if cudnn else "-", top / res["v3"]["kv_gbps"], check))
    else:
        # Each 8-bit row against bf16 with the same kernel, and against bf16's fastest kernel
        # on the same shape (the goal: FP8/INT8 >= 1.8x bf16's tokens/s).
        base, best = {}, {}
        print("| B | L | Hq/Hkv | KV | kernel (S) | time ms | KV GB/s | share | M tokens/s | tokens/s vs bf16 (same kernel) "
              "| vs fastest bf16 | check |")
        print("|---|---|---|---|---|---|---|---|---|---|---|---|")
        for c in rep["configs"]:
            shape = (c["batch"], c["len"])
            for x in c["results"]:
                key = shape + (x["kernel"],)
                if c["kv_dtype"] == "bf16":
                    base[key] = x["tokens_per_s"]
                    best[shape] = max(best.get(shape, 0), x["tokens_per_s"])
                ratio = x["tokens_per_s"] / base[key] if key in base else float("nan")
                vbest = x["tokens_per_s"] / best[shape] if shape in best else float("nan")
                print("| %d | %d | %d/%d | %s | %s (%d) | %.4f | %.0f | %.0f%% | %.1f | %.2fx | %.2fx | %s |" % (
                    c["batch"], c["len"], c["heads"], c["kv_heads"], c["kv_dtype"], x["kernel"], x["splits"],
                    x["time_ms"], x["kv_gbps"], 100 * x["kv_gbps"] / ceil, x["tokens_per_s"] / 1e6, ratio, vbest,
                    "pass" if x["pass"] else "FAIL"))
    return 0 if ok else 1


def accuracy(binary):
    """The accuracy table: `decode --accuracy` (the CPU model of v2 on each format; any machine)."""
    cmd = [binary, "decode", "--accuracy"]
    r = subprocess.run(cmd, stdout=subprocess.PIPE, text=True)
    print("accuracy: %s (CPU model, seeded: the same numbers on every machine)" % " ".join(cmd))
    print()
    for line in r.stdout.splitlines():
        if line.startswith("|") or line.startswith("(rel L2") or line.startswith(" outliers"):
            print(line)
    return r.returncode


def swap(binary):
    """Swap against recompute: `swap --device cuda --json`, the rates measured by the binary in the run."""
    import json
    cmd = [binary, "swap", "--device", "cuda", "--json"]
    r = subprocess.run(cmd, stdout=subprocess.PIPE, text=True)
    try:
        rep = json.loads(r.stdout)
    except ValueError:
        sys.stdout.write(r.stdout)
        print("swap printed no JSON (exit %d)" % r.returncode)
        return 1
    print("swap: %s; %s; %d requests per trace, a pool of %d pages of %d tokens" % (
        " ".join(cmd), rep["rates"], rep["requests"], rep["pool_pages"], rep["page_size"]))
    print()
    print("| workload | prefix cache | recompute: preemptions | tokens recomputed | time | swap: preemptions | "
          "pages out / in | time | swap / recompute | per victim: swaps / recomputes | time | "
          "lookahead: swaps / recomputes | time | lookahead / better fixed policy |")
    print("|" + "---|" * 14)
    ok = r.returncode == 0
    for x in rep["results"]:
        ok = ok and x["valid"]
        if not (x["preemptions_recompute"] or x["preemptions_swap"]):
            continue
        best = min(x["recompute_s"], x["swap_s"])
        print("| %s | %s | %d | %s | %.3f s | %d | %s / %s | %.3f s | %.2f | %d / %d | %.3f s | %d / %d | **%.3f s** | %.2f |" % (
            x["workload"], x["cache"], x["preemptions_recompute"], format(x["recompute_tokens"], ","), x["recompute_s"],
            x["preemptions_swap"], format(x["swapped_out_pages"], ","), format(x["swapped_in_pages"], ","), x["swap_s"],
            x["swap_s"] / x["recompute_s"] if x["recompute_s"] else float("nan"),
            x["cheaper_swap_outs"], x["cheaper_priced_recomputes"], x["cheaper_s"],
            x["lookahead_swap_outs"], x["lookahead_preemptions"] - x["lookahead_swap_outs"], x["lookahead_s"],
            x["lookahead_s"] / best if best else float("nan")))
    print("(traces that preempt nothing in this pool are left out; every trace's invariants: %s)" % (
        "valid" if ok else "NOT VALID"))
    return 0 if ok else 1


def readme(binary, since, chain):
    """The README's four tables from one invocation: accuracy, the 8-bit decode, B = 1 with the peers, swap."""
    import time
    t0 = time.time()
    print("command: python3 bench/ch07_decode.py --focus readme --binary %s%s --chain %d" % (
        binary, " --since " + since if since else "", chain))
    rc = 0
    for name, run in (("accuracy", lambda: accuracy(binary)), ("quant", lambda: focus("quant", binary, since)),
                      ("b1", lambda: focus("b1", binary, None, chain)), ("swap", lambda: swap(binary))):
        print()
        print("<!-- readme table: %s -->" % name)
        sys.stdout.flush()
        rc |= run()
        sys.stdout.flush()
    print()
    print("(took %.0f s)" % (time.time() - t0))
    return rc


def main():
    args, extra, markdown = sys.argv[1:], [], False
    if "--focus" in args:
        i = args.index("--focus")
        kind = args[i + 1]
        binary = args[args.index("--binary") + 1] if "--binary" in args else "build/bin/ch07_paged_radix"
        since = args[args.index("--since") + 1] if "--since" in args else None
        chain = int(args[args.index("--chain") + 1]) if "--chain" in args else 8
        if kind == "readme":
            return readme(binary, since, chain)
        return focus(kind, binary, since, chain)
    if "--markdown" in args:
        args.remove("--markdown")
        markdown = True
    if "--binary" in args:
        i = args.index("--binary")
        extra = ["--build-dir", os.path.dirname(os.path.dirname(os.path.abspath(args[i + 1])))]
        args = args[:i] + args[i + 2:]
    cmd = [sys.executable, os.path.join(HERE, "lineage.py"), "--chapters", "07"] + extra + args
    r = subprocess.run(cmd, stdout=subprocess.PIPE, text=True)
    sys.stdout.write(r.stdout)
    if markdown:
        import bench_report
        md = [p for p in r.stdout.split() if p.endswith("results.md")]
        table = bench_report.extract_section(open(md[0]).read(), "ch07-decode") if md else None
        print(table or "no decode table in this run (see the notes of results.md)")
    return r.returncode


if __name__ == "__main__":
    sys.exit(main())
