#!/usr/bin/env python3
"""Chapter 06, masks: our masked kernels next to FlexAttention and FlashAttention-4, one run.

    python3 bench/ch06_masks.py --bin build/bin/ch06_variants [--n 16384 --heads 16] [--quick]

Measures, on one GPU in one process:
  * every variant at B = 1, H heads, N, d = 128, bf16: ours (sm90a and sm80 forwards, from
    `ch06_variants mask --json`, each checked against the fp64 reference by the binary before
    it is timed), FlexAttention (torch.compile(flex_attention) with create_block_mask) and
    FA4 (flash_attn.cute.flash_attn_func) where it supports the variant. Every peer output is
    checked against an fp32 reference on sampled rows first; a failed check is reported as
    FAIL, never as a speed.
  * the sliding-window sweep at N: time against kept tiles, windows 128 .. N;
  * document masking against running each document alone (sum of causal runs of its lengths).
TFLOP/s are counted over kept pairs (4 d flops per kept pair). A peer that is missing or
does not support a variant is a column saying so. Prints a table, then one line
`BENCH_JSON {...}` with every number (for the plot: --plot FILE.json OUT.png).
"""
import argparse
import json
import math
import os
import re
import statistics
import subprocess
import sys
import time

VARIANTS = ["causal", "window", "chunked", "prefix", "document", "sink", "learned-sink", "alibi", "softcap", "custom"]


def log(*a):
    print(*a, file=sys.stderr, flush=True)


# ----------------------------------------------------------------------------- ours

def run_ours(binary, args, timeout=120):
    """Runs `ch06_variants mask ... --json` and returns (report, error)."""
    cmd = [binary] + (["mask"] if not binary.endswith("ch06_mask") else []) + args + [
        "--device", "cuda", "--no-model", "--no-backward", "--json"]
    try:
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return None, "timeout"
    try:
        return json.loads(r.stdout), None if r.returncode in (0, 1) else r.stderr.strip()
    except json.JSONDecodeError:
        return None, (r.stderr.strip() or "no JSON")[:200]


def ours_rows(rep, name):
    """{"sm90a": (ms or None, pass, tiles), "sm80": ...} for variant `name` of a report."""
    out = {}
    for r in rep["results"]:
        for path, key in (("sm90a forward", "sm90a"), ("sm80 forward", "sm80")):
            if r["impl"] == f"{name}: {path}":
                m = re.search(r"([0-9.]+) tiles visited", r.get("note") or "")
                out[key] = {"ms": r.get("time_ms"), "pass": r.get("pass"), "tiles": float(m.group(1)) if m else None,
                            "flops": r.get("flops"), "tflops": r.get("tflops"), "note": r.get("note") or ""}
    return out


def spec_of_note(rep, name):
    """The mask parameters the binary used, from its notes ("window: window (left 256, right 0); ...")."""
    for n in rep["notes"]:
        if n.startswith(name + ":"):
            return n
    return ""


# ----------------------------------------------------------------------------- peers

def hash3(a, b, c):
    m = 0xFFFFFFFF
    x = ((a * 0x9E3779B1) & m) ^ (((b + 0x7F4A7C15) & m) * 0x85EBCA77 & m) ^ (((c + 0x165667B1) & m) * 0xC2B2AE3D & m)
    x ^= x >> 15
    x = (x * 0x2C1B3C6D) & m
    x ^= x >> 12
    return x


class Peers:
    def __init__(self, torch, n, heads, d):
        self.torch = torch
        self.n, self.heads, self.d = n, heads, d
        self.flex = self.fa4 = None
        self.flex_why = self.fa4_why = ""
        try:
            import torch._dynamo
            torch._dynamo.config.cache_size_limit = 64  # one compiled kernel per variant, no eager fallback
            from torch.nn.attention.flex_attention import create_block_mask, flex_attention
            self.create_block_mask = create_block_mask
            self.flex = torch.compile(flex_attention, dynamic=False)
        except Exception as e:  # noqa: BLE001
            self.flex_why = f"FlexAttention not importable: {e}"[:120]
        try:
            from flash_attn.cute import flash_attn_func
            import inspect
            self.fa4 = flash_attn_func
            self.fa4_params = set(inspect.signature(flash_attn_func).parameters)
        except Exception as e:  # noqa: BLE001
            self.fa4_why = f"FA4 not importable ({type(e).__name__})"
        self.flush = torch.empty(512 * 1024 * 1024 // 4, dtype=torch.float32, device="cuda")

    def time(self, fn, reps=20):
        torch = self.torch
        for _ in range(3):
            fn()
        times = []
        for _ in range(reps):
            self.flush.zero_()
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record()
            fn()
            b.record()
            b.synchronize()
            times.append(a.elapsed_time(b))
        return statistics.median(times)


def mask_fns(torch, name, prm, n, heads, dev):
    """(mask_mod, score_mod, keep(q, kv, h) for the reference, score(s, q, kv, h), sink[h] or None)."""
    L, R = prm.get("left", 256), prm.get("right", 0)
    causal = prm.get("causal", False)
    mm = sm = None
    sink = None
    if name == "causal":
        mm = lambda b, h, q, kv: kv <= q
    elif name == "window":
        mm = lambda b, h, q, kv: (kv >= q - L) & (kv <= q + R)
    elif name == "chunked":
        C = prm["chunk"]
        mm = lambda b, h, q, kv: (kv <= q) & (q // C == kv // C)
    elif name == "prefix":
        P = prm["prefix"]
        mm = lambda b, h, q, kv: (kv < P) | (kv <= q)
    elif name == "document":
        lens = prm["doc_lens"]
        doc = torch.repeat_interleave(torch.arange(len(lens), device=dev), torch.tensor(lens, device=dev))
        if causal:
            mm = lambda b, h, q, kv: (doc[q] == doc[kv]) & (kv <= q)
        else:
            mm = lambda b, h, q, kv: doc[q] == doc[kv]
    elif name == "sink":
        S, W = prm["sinks"], prm["left"]
        mm = lambda b, h, q, kv: (kv <= q) & ((kv < S) | (q - kv <= W))
    elif name == "custom":
        nb = (n + 127) // 128
        tab = torch.tensor([[hash3(prm.get("seed", 7), i, j) % 4 == 0 for j in range(nb)] for i in range(nb)], device=dev)
        mm = lambda b, h, q, kv: (kv <= q) & ((q // 128 == kv // 128) | (kv // 128 == 0) | tab[q // 128, kv // 128])
    elif name in ("alibi", "softcap", "learned-sink"):
        if causal:
            mm = lambda b, h, q, kv: kv <= q
    if name == "alibi":
        slopes = torch.tensor([2.0 ** (-8.0 * (h + 1) / heads) for h in range(heads)], device=dev)
        sm = lambda s, b, h, q, kv: s - slopes[h] * (q - kv).abs()
    if name == "softcap":
        cap = prm["softcap"]
        sm = lambda s, b, h, q, kv: cap * torch.tanh(s / cap)
    if name == "learned-sink":
        sink = torch.tensor([math.log(n) - 1.0 + 0.5 * (h % 4) for h in range(heads)], device=dev, dtype=torch.float32)
    return mm, sm, sink


def reference_rows(torch, q, k, v, mm, sm, sink, heads_to_check, rows):
    """fp32 reference O for sampled rows of some heads: [len(heads)][len(rows)][d]."""
    out = []
    n = k.shape[2]
    kv = torch.arange(n, device=q.device)
    scale = q.shape[-1] ** -0.5
    for h in heads_to_check:
        qr = q[0, h, rows].float()
        s = qr @ k[0, h].float().T * scale
        qi = rows[:, None]
        if sm is not None:
            s = sm(s, 0, h, qi, kv[None, :])
        if mm is not None:
            s = s.masked_fill(~mm(0, h, qi, kv[None, :]), float("-inf"))
        if sink is not None:
            s = torch.cat([s, sink[h].expand(s.shape[0], 1)], dim=1)
        m = s.amax(dim=1, keepdim=True).clamp(min=-1e30)
        p = torch.exp(s - m)
        p = p / p.sum(dim=1, keepdim=True)
        if sink is not None:
            p = p[:, :-1]
        out.append(p @ v[0, h].float())
    return torch.stack(out)


def check_peer(torch, o_bhnd, ref, heads_to_check, rows):
    got = o_bhnd[0][heads_to_check][:, rows].float()
    if torch.isnan(got).any():
        return False, float("nan")
    err = (got - ref).abs().max().item()
    return err <= 2e-2 * max(1.0, ref.abs().max().item()), err


def params_from_note(name, note):
    """The parameters of a variant from the binary's note (so peers run the very same mask)."""
    p = {"causal": "causal" in note.split(";")[0] and name in ("document", "alibi", "softcap", "learned-sink")}
    m = re.search(r"left (\d+), right (\d+)", note)
    if m:
        p["left"], p["right"] = int(m.group(1)), int(m.group(2))
    m = re.search(r"chunks of (\d+)", note)
    if m:
        p["chunk"] = int(m.group(1))
    m = re.search(r"prefix (\d+)", note)
    if m:
        p["prefix"] = int(m.group(1))
    m = re.search(r"(\d+) sink tokens \+ window (\d+)", note)
    if m:
        p["sinks"], p["left"] = int(m.group(1)), int(m.group(2))
    m = re.search(r"cap ([0-9.]+)", note)
    if m:
        p["softcap"] = float(m.group(1))
    m = re.search(r"documents \(([0-9 ]+)\)", note)
    if m:
        p["doc_lens"] = [int(x) for x in m.group(1).split()]
    m = re.search(r"seed (\d+)", note)
    if m:
        p["seed"] = int(m.group(1))
    m = re.search(r"([0-9.]+)% of pairs kept", note)
    if m:
        p["kept_share"] = float(m.group(1)) / 100
    return p


def bench_peers(peers, name, prm, n, heads, d, kept_pairs):
    torch = peers.torch
    dev = "cuda"
    g = torch.Generator(device=dev).manual_seed(1)
    q = torch.randn(1, heads, n, d, device=dev, dtype=torch.bfloat16, generator=g)
    k = torch.randn(1, heads, n, d, device=dev, dtype=torch.bfloat16, generator=g)
    v = torch.randn(1, heads, n, d, device=dev, dtype=torch.bfloat16, generator=g)
    mm, sm, sink = mask_fns(torch, name, prm, n, heads, dev)
    heads_to_check = [0, heads - 1]
    rows = torch.unique(torch.cat([torch.tensor([0, 1, n - 2, n - 1]), torch.randint(0, n, (60,))])).to(dev)
    ref = reference_rows(torch, q, k, v, mm, sm, sink, heads_to_check, rows)
    flops = 4.0 * kept_pairs * d
    res = {}
    # FlexAttention
    if peers.flex is None:
        res["flex"] = {"why": peers.flex_why}
    else:
        try:
            bm = peers.create_block_mask(mm, 1, None, n, n, device=dev) if mm is not None else None
            if sink is None:
                fn = lambda: peers.flex(q, k, v, score_mod=sm, block_mask=bm)
                o = fn()
            else:  # no sink in Flex: O * sigmoid(LSE - sink) from its LSE (one more elementwise kernel)
                def fn():
                    o_, lse = peers.flex(q, k, v, score_mod=sm, block_mask=bm, return_lse=True)
                    return o_ * torch.sigmoid(lse - sink[None, :, None]).unsqueeze(-1).to(o_.dtype)
                o = fn()
            ok, err = check_peer(torch, o, ref, heads_to_check, rows)
            res["flex"] = {"pass": ok, "err": err, "_fn": fn if ok else None}
        except Exception as e:  # noqa: BLE001
            res["flex"] = {"why": f"error: {type(e).__name__}: {str(e)[:100]}"}
    # FA4: causal, window, softcap, learned-sink
    fa4_kw = None
    if name == "causal":
        fa4_kw = {"causal": True}
    elif name == "window":
        fa4_kw = {"window_size": (prm["left"], prm["right"])}
    elif name == "softcap":
        fa4_kw = {"softcap": prm["softcap"], "causal": prm["causal"]}
    elif name == "learned-sink":
        fa4_kw = {"learnable_sink": sink, "causal": prm["causal"]}
    if peers.fa4 is None:
        res["fa4"] = {"why": peers.fa4_why}
    elif fa4_kw is None:
        res["fa4"] = {"why": "not supported by FA4's interface"}
    elif any(kk not in peers.fa4_params for kk in fa4_kw):
        res["fa4"] = {"why": "this FA4 has no " + ", ".join(kk for kk in fa4_kw if kk not in peers.fa4_params)}
    else:
        try:
            qt, kt, vt = (x.transpose(1, 2).contiguous() for x in (q, k, v))  # [B, N, H, d]
            def fn():
                r = peers.fa4(qt, kt, vt, **fa4_kw)
                return r[0] if isinstance(r, tuple) else r
            o = fn().transpose(1, 2)
            ok, err = check_peer(torch, o, ref, heads_to_check, rows)
            res["fa4"] = {"pass": ok, "err": err, "_fn": fn if ok else None}
        except Exception as e:  # noqa: BLE001
            res["fa4"] = {"why": f"error: {type(e).__name__}: {str(e)[:100]}"}
    for r in res.values():
        r["flops"] = flops
    return res


def time_prepared(peers, res):
    """Times the peers bench_peers() prepared and checked (the GPU is otherwise idle by then)."""
    for r in res.values():
        fn = r.pop("_fn", None)
        if fn is not None:
            r["ms"] = peers.time(fn)
            r["tflops"] = r["flops"] / (r["ms"] * 1e-3) / 1e12


# ----------------------------------------------------------------------------- main

def fmt_cell(r):
    if r is None:
        return "-"
    if r.get("why"):
        return r["why"]
    if r.get("pass") is False:
        return "FAIL (check)"
    if r.get("ms") is None:
        return "-"
    return f"{r['ms']:.3f} ms / {r.get('tflops', 0):.0f}"


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--bin", default="build/bin/ch06_variants")
    ap.add_argument("--n", type=int, default=8192, help="N of the variant table")
    ap.add_argument("--sweep-n", type=int, default=16384, help="N of the window sweep")
    ap.add_argument("--budget", type=float, default=1e9, help="seconds: peers not reached by then are reported as such")
    ap.add_argument("--peer-order", default="window,causal,softcap,document,alibi,sink,chunked,prefix,learned-sink,custom")
    ap.add_argument("--heads", type=int, default=8)
    ap.add_argument("--windows", default="128,256,512,1024,2048,4096,8192,16384")
    ap.add_argument("--docs", type=int, default=8)
    ap.add_argument("--no-peers", action="store_true")
    ap.add_argument("--skip", default="", help="comma-separated parts to skip: variants,sweep,docs")
    ap.add_argument("--save", default="/tmp/ch06_masks.json", help="partial results after every stage")
    ap.add_argument("--plot", nargs=2, metavar=("JSON", "PNG"), help="plot time against kept tiles from a BENCH_JSON line")
    ap.add_argument("--table", metavar="JSON", help="print the tables of a saved BENCH_JSON line and exit")
    a = ap.parse_args()
    if a.plot:
        return plot(*a.plot)
    if a.table:
        line = open(a.table).read()
        print_table(json.loads(line[line.index("{"):]))
        return 0
    n, heads, d = a.n, a.heads, 128
    skip = set(a.skip.split(",")) if a.skip else set()
    shape = ["--n", str(n), "--heads", str(heads), "--d", "128", "--batch", "1"]
    sweep_shape = ["--n", str(a.sweep_n), "--heads", str(heads), "--d", "128", "--batch", "1"]
    out = {"n": n, "sweep_n": a.sweep_n, "heads": heads, "d": d, "date": time.strftime("%Y-%m-%d"), "command": " ".join(sys.argv)}
    try:
        out["gpu"] = subprocess.run(["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"], capture_output=True,
                                    text=True).stdout.strip().splitlines()[0]
    except Exception:  # noqa: BLE001
        out["gpu"] = "?"
    peers = None
    if not a.no_peers:
        try:
            import torch
            peers = Peers(torch, n, heads, d)
        except Exception as e:  # noqa: BLE001
            out["peers_error"] = f"torch not importable: {e}"[:120]
    t0 = time.time()
    # 1. every variant, ours (one process: the binary's tour at this shape)
    if "variants" not in skip:
        rep, err = run_ours(a.bin, shape, timeout=300)
        out["variants"] = {}
        if rep is None:
            out["variants_error"] = err
        else:
            pairs_total = float(heads) * n * n
            for name in VARIANTS:
                note = spec_of_note(rep, name)
                prm = params_from_note(name, note)
                row = {"spec": note, "ours": ours_rows(rep, name), "params": prm}
                flops = next((r["flops"] for r in row["ours"].values() if r.get("flops")), None)
                row["kept_pairs"] = flops / (4.0 * d) if flops else prm.get("kept_share", 1.0) * pairs_total
                out["variants"][name] = row
        log(f"ours, variants: {time.time() - t0:.0f} s")
        save(a.save, out)
    # 2 and 3 (ours, in a thread: mostly host work and short GPU runs) while the peers compile
    def ours_rest():
        # 2. the window sweep: time against kept tiles
        if "sweep" not in skip:
            out["sweep"] = []
            for w in [int(x) for x in a.windows.split(",")]:
                rep, err = run_ours(a.bin, ["--mask", "window", "--window", f"{w},0"] + sweep_shape)
                r = ours_rows(rep, "window") if rep else {}
                out["sweep"].append({"window": w, "ours": r, "error": err})
            rep, err = run_ours(a.bin, ["--mask", "causal"] + sweep_shape)
            out["sweep_causal"] = ours_rows(rep, "causal") if rep else {"error": err}
            log(f"sweep done: {time.time() - t0:.0f} s")
        # 3. document masking against each document alone
        if "docs" not in skip:
            rep, err = run_ours(a.bin, ["--mask", "document", "--docs", str(a.docs), "--causal"] + sweep_shape)
            if rep:
                note = spec_of_note(rep, "document")
                lens = params_from_note("document", note).get("doc_lens", [])
                alone = []
                for ln in lens:
                    r2, _ = run_ours(a.bin, ["--mask", "causal", "--n", str(ln), "--heads", str(heads), "--d", "128"])
                    alone.append(ours_rows(r2, "causal") if r2 else {})
                out["docs"] = {"n": a.sweep_n, "lens": lens, "packed": ours_rows(rep, "document"), "alone": alone}
            else:
                out["docs"] = {"error": err}
            log(f"docs done: {time.time() - t0:.0f} s")

    import threading
    worker = threading.Thread(target=ours_rest)
    worker.start()
    # 4. the peers, in priority order, compiled and checked while the time budget lasts
    prepared = []
    if peers is not None and out.get("variants"):
        for name in a.peer_order.split(","):
            row = out["variants"].get(name)
            if row is None:
                continue
            if time.time() - t0 > a.budget:
                row["peers"] = {"flex": {"why": "not measured (time budget of this run)"},
                                "fa4": {"why": peers.fa4_why or "not measured (time budget of this run)"}}
                continue
            log(f"peers: {name} ({time.time() - t0:.0f} s)")
            row["peers"] = bench_peers(peers, name, row["params"], n, heads, d, row["kept_pairs"])
            prepared.append(row["peers"])
    worker.join()
    save(a.save, out)
    for res in prepared:  # timed only now, with the GPU to themselves
        time_prepared(peers, res)
    log(f"peers timed: {time.time() - t0:.0f} s")
    print_table(out)
    print("BENCH_JSON " + json.dumps(out, default=lambda o: None))


def save(path, out):
    if path:
        with open(path, "w") as f:
            f.write("BENCH_JSON " + json.dumps(out, default=lambda o: None) + "\n")


def print_table(out):
    print(f"# ch06 masks, {out.get('gpu')}, {out['date']}: B = 1, H = {out['heads']}, N = {out['n']}, d = 128, bf16")
    print(f"# command: {out['command']}")
    if out.get("variants"):
        print("\n| variant | ours sm90a ms / TFLOP/s | ours sm80 | Flex | FA4 | ours / Flex | ours / FA4 |")
        print("|---|---|---|---|---|---|---|")
        for name, row in out["variants"].items():
            o9, o8 = row["ours"].get("sm90a"), row["ours"].get("sm80")
            pe = row.get("peers", {})
            def ratio(peer):
                if not (o9 and o9.get("ms") and o9.get("pass") and peer and peer.get("ms")):
                    return "-"
                return f"{peer['ms'] / o9['ms']:.2f}x"
            cell = lambda r: ("FAIL (check)" if r and r.get("pass") is False else fmt_cell(r))
            print(f"| {name} | {cell(o9)} | {cell(o8)} | {fmt_cell(pe.get('flex'))} | {fmt_cell(pe.get('fa4'))} | "
                  f"{ratio(pe.get('flex'))} | {ratio(pe.get('fa4'))} |")
    if out.get("sweep"):
        c = out.get("sweep_causal", {}).get("sm90a", {})
        print(f"\nwindow sweep at N = {out['sweep_n']}:")
        print(f"\n| window | kept tiles | sm90a ms | speed-up vs causal ({c.get('ms')} ms) |")
        print("|---|---|---|---|")
        for s in out["sweep"]:
            r = s["ours"].get("sm90a", {})
            sp = f"{c['ms'] / r['ms']:.2f}x" if r.get("ms") and c.get("ms") else "-"
            print(f"| {s['window']} | {r.get('tiles')} | {r.get('ms')} | {sp} |")
    if out.get("docs") and out["docs"].get("packed"):
        dd = out["docs"]
        pk = dd["packed"].get("sm90a", {}).get("ms")
        alone = [x.get("sm90a", {}).get("ms") for x in dd["alone"]]
        if pk and all(alone):
            print(f"\ndocuments {dd['lens']}: packed with the document mask {pk:.3f} ms, each alone (causal) "
                  f"summed {sum(alone):.3f} ms: ratio {pk / sum(alone):.2f}")


def plot(json_path, png):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    line = open(json_path).read()
    data = json.loads(line[line.index("{"):]) if not line.lstrip().startswith("{") else json.loads(line)
    xs, ys, ws = [], [], []
    for s in data["sweep"]:
        r = s["ours"].get("sm90a", {})
        if r.get("ms") and r.get("tiles"):
            xs.append(r["tiles"]), ys.append(r["ms"]), ws.append(s["window"])
    fig, ax = plt.subplots(figsize=(6, 4))
    ax.plot(xs, ys, "o-", label="sm90a masked forward (window L, 0)")
    if xs:
        k = sum(y / x for x, y in zip(xs, ys)) / len(xs)
        ax.plot([0, max(xs)], [0, k * max(xs)], "--", color="gray", label="time proportional to tiles")
    for x, y, w in zip(xs, ys, ws):
        ax.annotate(str(w), (x, y), textcoords="offset points", xytext=(4, -10), fontsize=8)
    ax.set_xlabel("kept tiles (128 x 128) over all heads")
    ax.set_ylabel("time (ms)")
    ax.set_title(f"sliding window, N = {data.get('sweep_n', data['n'])}, H = {data['heads']}, d = 128 ({data.get('gpu')}, {data['date']})",
                 fontsize=9)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(png, dpi=120)
    print(f"wrote {png}")


if __name__ == "__main__":
    sys.exit(main())
