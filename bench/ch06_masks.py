#!/usr/bin/env python3
"""Chapter 06, masks: our masked kernels next to FlexAttention and FlashAttention-4, one run.

    python3 bench/ch06_masks.py --bin build/bin/ch06_variants [--n 8192 --heads 16] [--budget 55]
    python3 bench/ch06_masks.py --variants strided,fixed,longformer,bigbird --skip sweep,docs

Measures, on one GPU in one run:
  * every variant at B = 1, H heads, N, d = 128, bf16: ours (the sm90a and sm80 forwards of
    one `ch06_variants mask --json` tour, every kernel checked against the fp64 reference by
    the binary before it is timed), FlexAttention (torch.compile(flex_attention) with
    create_block_mask) and FA4 (flash_attn.cute.flash_attn_func) where it supports the
    variant. Every peer output is checked against an fp32 reference on sampled rows first;
    a failed check is reported as FAIL, never as a speed. The structured sparse patterns
    (strided and fixed, Child et al. 2019; longformer; bigbird) run one launch of ours each with
    the table's parameters (stride 128; blocks of 128 with 16 summary columns; 256 keys each side
    and 1 global token; blocks of 64, 2 global and 3 random blocks, seed 7), beside FlexAttention
    only: its BlockMask comes from a mask_mod of the same definition as mask_policy.hpp's
    StructuredSparse (BigBird's random blocks drawn by the chapter's hash3 with the same seed,
    so the same key set); FA4 has none of them. --variants NAMES runs only those rows of the table
    (`./tutorial bench` runs the four patterns so: --variants strided,fixed,longformer,bigbird).
  * the sliding-window sweep at N = --sweep-n: time against kept tiles, windows 128 .. N,
    with our causal of the same run (and Flex and FA4 on causal and window 1024);
  * document masking: the packed documents against each document alone (sum of the runs).
  * with --models gpt-oss,gemma2,mistral,packed-docs (and only then; nothing else runs): the
    masks in the shapes of real models, `ch06_variants mask --model NAME` at every N of
    --model-n with B = --model-tokens / N (16K tokens): gpt-oss d = 64, Hq/Hkv 64/8, a learned
    sink per head + causal window 128; gemma2 d = 256, 16/8, softcap 50 + causal window 4096;
    mistral d = 128, 32/8, causal window 4096; packed-docs d = 128, 32/8, seeded documents
    summing to N, causal within each (the lengths our run reports; B = 1, one packed batch). Ours: the forwards and the
    backward (a kernel not built for the head dim is a cell that says so); FlexAttention
    (mask_mod, score_mod for the softcap, the sink from its LSE as for learned-sink,
    enable_gqa=True) and FA4 through its own arguments (causal, window_size=(L, 0), softcap,
    learnable_sink; flash_attn_varlen_func with cu_seqlens for the packed documents), checked
    as every peer. Unless --no-model-backward the peers' backwards run too (torch.autograd.grad
    of one kept forward, timed alone; their dQ, dK and dV of the first and last KV heads checked
    against fp32 by the rule of common/compare.hpp: model_grad_check). FLOPs 4 B Hq (kept pairs)
    d, the binary's count where it reports one; a backward 2.5 times that.
TFLOP/s are counted over kept pairs (4 d FLOPs per kept pair, the project's halved count
for causal).

How it stays fast, and how the peers' times are made to repeat: the peers compile in
--workers processes while our binary runs (the Flex and FA4 compiles, 3-8 s each, are the
slow part). Each peer is *prepared* first (inputs, block mask, compile, one call), then
checked, and only then timed. Our binary's runs, every peer check and every timed loop
(with its warm-up) hold one lock, so no two of them overlap; a compile's own first call
may still run one kernel beside a timing. The peers are timed after every preparation is
done, in --rounds interleaved rounds: round r times every prepared peer once (3 warm-up
calls, then the median of 20 with the L2 flushed and left clean: bench/peer_timer.py), in an order rotated by r, one at a time
as the main process asks. A peer's time is the median of its round medians, and its
spread, (max - min) / median over the rounds, is printed and saved. A peer that is
missing, does not support a variant, fails or is not reached within --budget seconds is a
cell saying so. Prints the tables, then one line `BENCH_JSON {...}` (for the plot: --plot
FILE.json OUT.png). `--fake-peers` replaces torch in the workers by sleeps (to try the
orchestration on a machine with no GPU; it measures nothing).
"""
import argparse
import json
import math
import os
import queue
import random
import re
import statistics
import subprocess
import sys
import time

# The structured sparse patterns (the StructuredSparse policy of mask_policy.hpp): FlexAttention is
# their only peer (a mask_mod of the same definition); FA4 has none of them.
SPARSE = ["strided", "fixed", "longformer", "bigbird"]
VARIANTS = ["causal", "window", "chunked", "prefix", "document", "sink", "learned-sink", "alibi", "softcap",
            "custom"] + SPARSE
FA4_VARIANTS = ("causal", "window", "softcap", "learned-sink")

# The named model cases of `ch06_variants mask --model NAME` (--models): head dim, query and K/V
# heads, and the mask. Every window is causal and left-only: key j is kept for query i iff
# j <= i + (Nk - Nq) and i + (Nk - Nq) - j <= left, the Window policy of mask_policy.hpp
# (q - left <= j <= q + right with q = i + diag). A config's sliding_window W counts the query's
# own key (the models' reference code keeps q - W < j <= q), so left = W - 1: 127 for gpt-oss's
# 128, 4095 for 4096, as the binary's --model cases (model_cases.cpp). FA4's window_size=(left, 0)
# keeps the same pairs: its left bound is the diagonal minus window_size[0], inclusive
# (flash_attn/cute/mask.py: col >= row + seqlen_k - seqlen_q - window_size_left). The fp32 check
# on sampled rows below confirms it on every run: a window one key short fails it at window 128
# (bench/test_bench.py, ModelPeers, on a reference with FA's window semantics); at 4096 one key
# is below the check's resolution, and gpt-oss's window is the case that holds the convention.
MODELS = {
    "gpt-oss": {"d": 64, "hq": 64, "hkv": 8, "left": 127, "sink": True,
                "mask": "learned sink + causal window 128 (left 127)"},
    "gemma2": {"d": 256, "hq": 16, "hkv": 8, "left": 4095, "softcap": 50.0,
               "mask": "softcap 50 + causal window 4096 (left 4095)"},
    "mistral": {"d": 128, "hq": 32, "hkv": 8, "left": 4095, "mask": "causal window 4096 (left 4095)"},
    "packed-docs": {"d": 128, "hq": 32, "hkv": 8, "docs": True, "mask": "packed documents, causal within each"},
}


def model_kept_pairs(case, n, doc_lens=None):
    """Kept (query, key) pairs of one head of one sequence of a model case (Nq = Nk = n)."""
    if case.get("docs"):
        return sum(x * (x + 1) // 2 for x in doc_lens) if doc_lens else None
    L = case.get("left")
    if L is None:
        return n * (n + 1) // 2
    m = min(n, L + 1)  # rows 0 .. L keep i + 1 keys, every later row L + 1
    return m * (m + 1) // 2 + max(0, n - L - 1) * (L + 1)


def log(*a):
    print(*a, file=sys.stderr, flush=True)


# ----------------------------------------------------------------------------- ours

OURS_EXTRA = []  # --hopper-step K: the sm90a step every run of ours uses (default: the binary's)


def run_ours(binary, args, lock, timeout=120, backward=False):
    """Runs `ch06_variants mask ... --json` holding the GPU lock; returns (report, error)."""
    cmd = [binary, "mask"] + args + ["--device", "cuda", "--no-model", "--json"] + \
        ([] if backward else ["--no-backward"]) + OURS_EXTRA
    try:
        with lock:
            r = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return None, "timeout"
    except OSError as e:  # no binary there: a cell that says so, never a crash of the run
        return None, f"{type(e).__name__}: {e}"[:200]
    try:
        return json.loads(r.stdout), None if r.returncode in (0, 1) else r.stderr.strip()[:200]
    except json.JSONDecodeError:
        return None, (r.stderr.strip() or "no JSON")[:200]


def ours_rows(rep, label):
    """{"sm90a": {...}, "sm80": {...}} for the rows `label: final sm90a forward` (the default: the final
    kernel, steps/final.cu) or `label: sm90a forward` (one step, --hopper-step K) / `label: sm80 forward`."""
    out = {}
    for r in (rep or {}).get("results", []):
        for path, key in (("final sm90a forward", "sm90a"), ("sm90a forward", "sm90a"), ("sm80 forward", "sm80")):
            if r["impl"] == f"{label}: {path}":
                m = re.search(r"([0-9.]+) tiles visited", r.get("note") or "")
                out[key] = {"ms": r.get("time_ms"), "pass": r.get("pass"), "tiles": float(m.group(1)) if m else None,
                            "flops": r.get("flops"), "tflops": r.get("tflops"), "err": r.get("max_abs_err"),
                            "note": r.get("note") or ""}
                if r.get("time_ms") is None and r.get("pass") is None and r.get("note"):
                    out[key]["why"] = r["note"][:80]  # a kernel that cannot run the mask says why
    return out


def model_ours_rows(rep, model):
    """{"sm90a", "sm80", "bwd"} of a `--model NAME` report: the rows `NAME: final sm90a forward`
    (or `NAME: sm90a forward` with --hopper-step), `NAME: sm80 forward` and `NAME: final backward`.
    A kernel built without the case's head dim is a row whose note says "not built for d = ..."
    and has no time: it is kept, with that note, as the cell's reason."""
    out = ours_rows(rep, model)
    for r in (rep or {}).get("results", []):
        if r.get("impl") in (f"{model}: final backward", f"{model}: backward"):
            out["bwd"] = {"ms": r.get("time_ms"), "pass": r.get("pass"), "flops": r.get("flops"),
                          "tflops": r.get("tflops"), "err": r.get("max_abs_err"), "note": r.get("note") or ""}
    for k, r in out.items():
        if "not built" in r.get("note", "") and not r.get("ms"):
            m = re.search(r"not built for d ?= ?\d+", r["note"])
            r["why"] = m.group(0) if m else "not built for this head dim"
    return out


def doc_lens_of(rep):
    """The document lengths a report names ("documents (l1 l2 ...)" in a note), or None."""
    texts = list((rep or {}).get("notes", [])) + [r.get("note") or "" for r in (rep or {}).get("results", [])]
    for t in texts:
        m = re.search(r"documents \(([0-9 ]+)\)", t)
        if m:
            return [int(x) for x in m.group(1).split()]
    return None


def spec_of_note(rep, name):
    for n in (rep or {}).get("notes", []):
        if n.startswith(name + ":"):
            return n
    return ""


def params_from_note(name, note):
    """The parameters of a variant from the binary's note, to confirm the peers ran the same mask."""
    p = {"causal": "causal" in note.split(";")[0] and name in ("document", "alibi", "softcap", "learned-sink")}
    for key, rx, conv in (("left", r"left (\d+), right", int), ("right", r"right (\d+)", int),
                          ("chunk", r"chunks of (\d+)", int), ("prefix", r"prefix (\d+)", int),
                          ("softcap", r"cap ([0-9.]+)", float), ("seed", r"seed (\d+)", int),
                          ("stride", r"stride (\d+)", int), ("block", r"blocks of (\d+)", int),
                          ("summary", r"(\d+) summary columns", int), ("left", r"window (\d+) each side", int),
                          ("globals", r"(\d+) global (?:tokens|blocks)", int), ("random", r"(\d+) random blocks", int)):
        m = re.search(rx, note)
        if m:
            p[key] = conv(m.group(1))
    m = re.search(r"(\d+) sink tokens \+ window (\d+)", note)
    if m:
        p["sinks"], p["left"] = int(m.group(1)), int(m.group(2))
    m = re.search(r"documents \(([0-9 ]+)\)", note)
    if m:
        p["doc_lens"] = [int(x) for x in m.group(1).split()]
    return p


# ----------------------------------------------------------------------------- peers (worker processes)

def hash3(a, b, c):
    m = 0xFFFFFFFF
    x = ((a * 0x9E3779B1) & m) ^ (((b + 0x7F4A7C15) & m) * 0x85EBCA77 & m) ^ (((c + 0x165667B1) & m) * 0xC2B2AE3D & m)
    x ^= x >> 15
    x = (x * 0x2C1B3C6D) & m
    x ^= x >> 12
    return x


def mask_fns(torch, name, prm, n, heads, dev):
    """(mask_mod, score_mod, sink[h] or None), the definitions of mask_policy.hpp."""
    L, R = prm.get("left", 256), prm.get("right", 0)
    causal = prm.get("causal", False)
    mm = sm = sink = None
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
        seed = prm.get("seed", 7)
        tab = torch.tensor([[hash3(seed, i, j) % 4 == 0 for j in range(nb)] for i in range(nb)], device=dev)
        mm = lambda b, h, q, kv: (kv <= q) & ((q // 128 == kv // 128) | (kv // 128 == 0) | tab[q // 128, kv // 128])
    elif name in SPARSE:
        mm = sparse_mask_mod(torch, name, prm, n, dev)
    elif name in ("alibi", "softcap", "learned-sink") and causal:
        mm = lambda b, h, q, kv: kv <= q
    if name == "alibi":
        slopes = torch.tensor([2.0 ** (-8.0 * (h + 1) / heads) for h in range(heads)], device=dev)
        sm = lambda s, b, h, q, kv: s - slopes[h] * (q - kv).abs()
    if name == "softcap":
        cap = prm["softcap"]
        sm = lambda s, b, h, q, kv: cap * torch.tanh(s / cap)
    if name == "learned-sink":  # default_sink_logits() of mask_spec.cpp
        sink = torch.tensor([math.log(n) - 1.0 + 0.5 * (h % 4) for h in range(heads)], device=dev, dtype=torch.float32)
    return mm, sm, sink


def bigbird_blocks(prm, n):
    """BigBird's kept (query block, key block) pairs at Nq = Nk = n, as `StructuredSparse::block_keep`
    of mask_policy.hpp: |Qb - Kb| <= 1, or Kb < g, or Qb < g, or Kb one of the r random blocks of
    Qb, hash3(seed, Qb, k) mod nkb for k < r (the C++ hash, bit for bit). [nqb][nkb] booleans."""
    b, g, r, seed = prm["block"], prm["globals"], prm["random"], prm.get("seed", 7)
    nkb = (n + b - 1) // b
    tab = []
    for qb in range(nkb):
        rand = {hash3(seed, qb, k) % nkb for k in range(r)}
        tab.append([abs(qb - kb) <= 1 or kb < g or qb < g or kb in rand for kb in range(nkb)])
    return tab


def sparse_mask_mod(torch, name, prm, n, dev):
    """FlexAttention's mask_mod of a structured sparse pattern at Nq = Nk = n (query position q = i),
    the published definitions as `StructuredSparse::keep_at` of mask_policy.hpp:
      strided (Child et al. 2019, §4.2, both heads merged): kv <= q and (q - kv < l or (q - kv) mod l == 0)
      fixed (same, §4.2): kv <= q and (kv // l == q // l or kv mod l >= l - c)
      longformer (Beltagy et al. 2020, §3.1): |q - kv| <= w, or q < g, or kv < g (g global tokens)
      bigbird (Zaheer et al. 2020, ITC): the kept blocks of bigbird_blocks(), looked up per pair."""
    if name == "strided":
        L = prm["stride"]
        return lambda b, h, q, kv: (kv <= q) & (((q - kv) < L) | ((q - kv) % L == 0))
    if name == "fixed":
        L, C = prm["block"], prm["summary"]
        return lambda b, h, q, kv: (kv <= q) & ((kv // L == q // L) | (kv % L >= L - C))
    if name == "longformer":
        W, G = prm["left"], prm["globals"]
        return lambda b, h, q, kv: (q < G) | (kv < G) | ((q - kv).abs() <= W)
    B = prm["block"]
    tab = torch.tensor(bigbird_blocks(prm, n), device=dev)
    return lambda b, h, q, kv: tab[q // B, kv // B]


def reference_rows(torch, q, k, v, mm, sm, sink, heads_to_check, rows):
    """fp32 reference O for sampled rows of some heads of sequence 0: [len(heads)][len(rows)][d]."""
    return model_reference(torch, q, k, v, 0, mm, sm, sink, heads_to_check, rows)


def model_reference(torch, q, k, v, b, mm, sm, sink, heads_to_check, rows):
    """fp32 reference O of sequence b for sampled rows of some query heads, with GQA (query head h
    reads K/V head h // (Hq / Hkv)) and the mask `mm` (None: none), the score modifier `sm` and
    the sink logits `sink` where given: [len(heads)][len(rows)][d]."""
    out = []
    n, g = k.shape[2], q.shape[1] // k.shape[1]
    kv = torch.arange(n, device=q.device)
    scale = q.shape[-1] ** -0.5
    for h in heads_to_check:
        s = q[b, h, rows].float() @ k[b, h // g].float().T * scale
        qi = rows[:, None]
        if sm is not None:
            s = sm(s, b, h, qi, kv[None, :])
        if mm is not None:
            s = s.masked_fill(~mm(b, h, qi, kv[None, :]), float("-inf"))
        if sink is not None:
            s = torch.cat([s, sink[h].expand(s.shape[0], 1)], dim=1)
        m = s.amax(dim=1, keepdim=True).clamp(min=-1e30)
        p = torch.exp(s - m)
        p = p / p.sum(dim=1, keepdim=True).clamp(min=1e-30)
        if sink is not None:
            p = p[:, :-1]
        out.append(p @ v[b, h // g].float())
    return torch.stack(out)


def model_inputs(torch, prm, n, hq, d, dev, grad=False):
    """A model case's inputs and mask: q [B, Hq, N, d], k and v [B, Hkv, N, d] (bf16, seeded; with
    grad, leaves that require their gradient), the sink logits (default_sink_logits() of
    mask_spec.cpp, as for the learned-sink variant), and mask_mod / score_mod in FlexAttention's
    form, the definitions of mask_policy.hpp."""
    B, hkv, L = prm["batch"], prm["hkv"], prm.get("left")
    cap, lens = prm.get("softcap"), prm.get("doc_lens")
    g = torch.Generator(device=dev).manual_seed(1)
    q = torch.randn(B, hq, n, d, device=dev, dtype=torch.bfloat16, generator=g)
    k, v = (torch.randn(B, hkv, n, d, device=dev, dtype=torch.bfloat16, generator=g) for _ in range(2))
    if grad:
        q, k, v = (t.requires_grad_() for t in (q, k, v))
    sink = (torch.tensor([math.log(n) - 1.0 + 0.5 * (h % 4) for h in range(hq)], device=dev, dtype=torch.float32)
            if prm.get("sink") else None)
    if lens:
        doc = torch.repeat_interleave(torch.arange(len(lens), device=dev), torch.tensor(lens, device=dev))
        mm = lambda b, h, qi, kv: (doc[qi] == doc[kv]) & (kv <= qi)
    elif L is not None:  # the Window policy (left, 0): kv <= q and q - kv <= left
        mm = lambda b, h, qi, kv: (kv <= qi) & (qi - kv <= L)
    else:
        mm = lambda b, h, qi, kv: kv <= qi
    sm = (lambda s_, b, h, qi, kv: cap * torch.tanh(s_ / cap)) if cap else None
    return {"q": q, "k": k, "v": v, "sink": sink, "mm": mm, "sm": sm, "B": B, "n": n, "hq": hq, "d": d,
            "left": L, "softcap": cap, "doc_lens": lens, "dev": dev}


def model_peer_call(torch, peer, prm, x, flex=None, create_block_mask=None, fa4=None, fa4_params=(),
                    fa4_varlen=None, fa4_varlen_params=(), sink_dtype=None, grad=False):
    """(fn, out_of, why): the peer's call on a model case's inputs x (model_inputs), and a function
    giving its output as [B, Hq, N, d]; or why it cannot run the case. With grad (x made with
    grad=True), x["leaves"] are the tensors the peer's gradients are of (FA4: its own [B, N, H, d]
    copies, so that a timed backward has no transposes in it) and x["grads_bhnd"](dq, dk, dv)
    gives them as [B, H, N, d]. FlexAttention: the block mask
    of mask_mod, score_mod for the softcap, enable_gqa=True, the sink from its LSE. FA4 through its
    own arguments: causal=True, window_size=(left, 0), softcap, learnable_sink; the packed documents
    through flash_attn_varlen_func with cu_seqlens over every sequence of the batch."""
    q, k, v, sink, mm, sm = x["q"], x["k"], x["v"], x["sink"], x["mm"], x["sm"]
    B, n, hq, d, L, lens = x["B"], x["n"], x["hq"], x["d"], x["left"], x["doc_lens"]
    if peer == "flex":
        x["leaves"], x["grads_bhnd"] = (q, k, v), lambda *gs: gs
        bm = create_block_mask(mm, None, None, n, n, device=x["dev"])
        if sink is None:
            fn = lambda: flex(q, k, v, score_mod=sm, block_mask=bm, enable_gqa=True)
        else:  # as the learned-sink variant: O sigmoid(LSE - sink) from Flex's LSE (one more kernel)
            def fn():
                o_, lse = flex(q, k, v, score_mod=sm, block_mask=bm, enable_gqa=True, return_lse=True)
                return o_ * torch.sigmoid(lse - sink[None, :, None]).unsqueeze(-1).to(o_.dtype)
        return fn, fn, None
    kw = {"causal": True}
    if L is not None:
        kw["window_size"] = (L, 0)  # FA4's (left, right): the pairs of our Window (left, 0), see MODELS
    if x["softcap"]:
        kw["softcap"] = x["softcap"]
    if sink is not None:
        kw["learnable_sink"] = sink if sink_dtype is None else sink.to(sink_dtype)  # fp32, as for learned-sink
    if lens:
        if fa4_varlen is None:
            return None, None, "not supported: this FA4 has no flash_attn_varlen_func"
        offs = [0]  # every sequence of the batch holds the same documents, packed end to end
        for _b in range(B):
            for ln in lens:
                offs.append(offs[-1] + ln)
        cu = torch.tensor(offs, device=x["dev"], dtype=torch.int32)
        kw.update(cu_seqlens_q=cu, cu_seqlens_k=cu, max_seqlen_q=max(lens), max_seqlen_k=max(lens))
        for opt in ("max_seqlen_q", "max_seqlen_k"):  # not in every version's signature
            if opt not in fa4_varlen_params:
                kw.pop(opt)
        params, call = fa4_varlen_params, fa4_varlen
        qt, kt, vt = (t.detach().transpose(1, 2).reshape(B * n, t.shape[1], d).contiguous() for t in (q, k, v))
        to_bhnd = lambda t: t.reshape(B, n, t.shape[1], d).transpose(1, 2)  # noqa: E731  [B N, H, d] -> [B, H, N, d]
    else:
        params, call = fa4_params, fa4
        qt, kt, vt = (t.detach().transpose(1, 2).contiguous() for t in (q, k, v))  # [B, N, H, d]
        to_bhnd = lambda t: t.transpose(1, 2)  # noqa: E731
    if grad:
        qt, kt, vt = (t.requires_grad_() for t in (qt, kt, vt))
    x["leaves"], x["grads_bhnd"] = (qt, kt, vt), lambda *gs: tuple(to_bhnd(t_) for t_ in gs)
    missing = [a for a in kw if a not in params]
    if missing:
        return None, None, "not supported: this FA4 has no " + ", ".join(missing)

    def fn():
        o_ = call(qt, kt, vt, **kw)
        return o_[0] if isinstance(o_, tuple) else o_
    return fn, (lambda: fn().reshape(B, n, hq, d).transpose(1, 2)), None


def model_grad_check(torch, grads, dout, x):
    """(None, or why the gradients fail; the largest error of dQ, dK and dV): grads = (dQ [B, Hq,
    N, d], dK, dV [B, Hkv, N, d]) of the output gradient dout, for the first and the last KV head
    of the first and the last sequence, against fp32 ones with the model case's mask, softcap and
    sinks (bench_peers.group_grads), each tensor judged as one row by the rule of
    common/compare.hpp with the plain bf16 computation as the yardstick (bench_peers.judge_tensors)."""
    from bench_peers import group_grads, judge_tensors
    q, k, v, B, n = x["q"], x["k"], x["v"], x["B"], x["n"]
    hkv = k.shape[1]
    g, tau = q.shape[1] // hkv, q.shape[-1] ** -0.5
    idx = torch.arange(n, device=q.device)
    got, ref, nai = {"dQ": [], "dK": [], "dV": []}, {"dQ": [], "dK": [], "dV": []}, {"dQ": [], "dK": [], "dV": []}
    groups = [(b, kh) for b in sorted({0, B - 1}) for kh in sorted({0, hkv - 1})]
    for b, kh in groups:
        hs = range(kh * g, (kh + 1) * g)
        r, nv = group_grads(torch, k[b, kh].detach().float(), v[b, kh].detach().float(),
                            [(q[b, h].detach().float(), dout[b, h].float()) for h in hs], tau,
                            keep=x["mm"](b, 0, idx[:, None], idx[None, :]), cap=x["softcap"],
                            sinks=None if x["sink"] is None else [x["sink"][h] for h in hs])
        got["dQ"] += [grads[0][b, h].float() for h in hs]
        ref["dQ"] += r[0]
        nai["dQ"] += nv[0]
        for name, i_ in (("dK", 1), ("dV", 2)):
            got[name].append(grads[i_][b, kh].float())
            ref[name].append(r[i_])
            nai[name].append(nv[i_])
    worst = 0.0
    for name in ("dQ", "dK", "dV"):
        e, bad = judge_tensors(torch, name, got[name], ref[name], nai[name],
                               "KV heads %s, every row" % ", ".join("(%d, %d)" % gr for gr in groups), per_row=False)
        worst = e if e != e else max(worst, e)
        if bad:
            return bad, worst
    return None, worst


def model_check(torch, out, x):
    """(ok, max error): out [B, Hq, N, d] against the fp32 reference on sampled rows (the first two,
    the last two, 60 seeded) of the first and last query head, in the first and last sequence."""
    n, hq, B = x["n"], x["hq"], x["B"]
    rows = torch.unique(torch.cat([torch.tensor([0, 1, n - 2, n - 1]),
                                   torch.randint(0, n, (60,), generator=torch.Generator().manual_seed(2))])).to(x["dev"])
    hc = [0, hq - 1]
    err, refmax, nan = 0.0, 0.0, False
    for b in sorted({0, B - 1}):
        ref = model_reference(torch, x["q"], x["k"], x["v"], b, x["mm"], x["sm"], x["sink"], hc, rows)
        got = out[b][hc][:, rows].float()
        nan = nan or bool(torch.isnan(got).any().item())
        err = max(err, (got - ref).abs().max().item())
        refmax = max(refmax, ref.abs().max().item())
    return (not nan and err <= 2e-2 * max(1.0, refmax)), err


def peer_worker(wid, tasks, results, lock, fake=False):
    """One process: imports torch (and FA4); then prepares (compiles and checks) the peer
    tasks it is sent, keeping each prepared call, and times one when the main process asks."""
    os.environ.setdefault("TORCHINDUCTOR_COMPILE_THREADS", "1")  # no compile pool per worker
    if fake:
        return fake_worker(wid, tasks, results, lock)
    info = {"flex_why": "", "fa4_why": ""}
    try:
        import torch
        if not torch.cuda.is_available():
            raise RuntimeError("PyTorch has no CUDA device")
        info["torch"] = torch.__version__
    except Exception as e:  # noqa: BLE001
        results.put(("ready", wid, {"flex_why": f"torch not usable: {e}"[:100], "fa4_why": "torch not usable"}))
        return
    flex = fa4 = fa4_varlen = create_block_mask = None
    fa4_params = fa4_varlen_params = set()
    try:
        import torch._dynamo
        torch._dynamo.config.cache_size_limit = 64
        from torch.nn.attention.flex_attention import create_block_mask, flex_attention
        flex = torch.compile(flex_attention, dynamic=False)
    except Exception as e:  # noqa: BLE001
        info["flex_why"] = f"FlexAttention not importable: {type(e).__name__}"
    try:
        import inspect
        from flash_attn.cute import flash_attn_func
        fa4 = flash_attn_func
        fa4_params = set(inspect.signature(flash_attn_func).parameters)
        try:  # the packed (varlen) entry point, for the packed-documents model case
            from flash_attn.cute import flash_attn_varlen_func as fa4_varlen
            fa4_varlen_params = set(inspect.signature(fa4_varlen).parameters)
        except Exception:  # noqa: BLE001
            fa4_varlen, fa4_varlen_params = None, set()
        try:
            from importlib.metadata import version
            info["fa4"] = version("flash-attn-4")
        except Exception:  # noqa: BLE001
            info["fa4"] = "?"
    except Exception as e:  # noqa: BLE001
        info["fa4_why"] = f"FA4 not importable ({type(e).__name__})"
    results.put(("ready", wid, info))
    from peer_timer import PeerTimer  # the peers' shared timer (bench/peer_timer.py)
    timer = PeerTimer(torch)
    prepared = {}  # (key, peer) -> the call, with its inputs alive

    def check_and_keep(r, key, peer, fn, check, t0):
        """A prepared peer call's fp32 check, check() -> (ok, max error), run holding the lock (it
        runs kernels: never beside a timing), written into the cell r; the call is kept for timing
        only if it passed."""
        with lock:
            ok, err = check()
        r.update({"pass": bool(ok), "err": err, "compile_check_s": round(time.time() - t0, 1)})
        if ok:
            prepared[(key, peer)] = fn
        return r

    def error_why(e):
        """The cell of a preparation that raised: the exception's type and first line."""
        return f"error: {type(e).__name__}: {str(e).splitlines()[0][:90] if str(e) else ''}"

    def prepare(task):
        """One peer task: inputs, mask, compile, check. A function of its own, so that each
        prepared call closes over its own tensors (a closure in the loop would see the last
        task's: Python binds a closure's variables late)."""
        _, key, peer, name, prm, n, heads, d, kept_pairs = task
        t0 = time.time()
        r = {"flops": 4.0 * kept_pairs * d}
        try:
            if peer == "flex" and flex is None:
                r["why"] = info["flex_why"]
            elif peer == "fa4" and fa4 is None:
                r["why"] = info["fa4_why"]
            else:
                dev = "cuda"
                g = torch.Generator(device=dev).manual_seed(1)
                q, k, v = (torch.randn(1, heads, n, d, device=dev, dtype=torch.bfloat16, generator=g) for _ in range(3))
                mm, sm, sink = mask_fns(torch, name, prm, n, heads, dev)
                hc = [0, heads - 1]
                rows = torch.unique(torch.cat([torch.tensor([0, 1, n - 2, n - 1]),
                                               torch.randint(0, n, (60,), generator=torch.Generator().manual_seed(2))])).to(dev)
                fn = None
                if peer == "flex":
                    bm = create_block_mask(mm, 1, None, n, n, device=dev) if mm is not None else None
                    if sink is None:
                        fn = lambda: flex(q, k, v, score_mod=sm, block_mask=bm)
                    else:  # Flex has no sink: O sigmoid(LSE - sink) from its LSE (one more elementwise kernel)
                        def fn():
                            o_, lse = flex(q, k, v, score_mod=sm, block_mask=bm, return_lse=True)
                            return o_ * torch.sigmoid(lse - sink[None, :, None]).unsqueeze(-1).to(o_.dtype)
                        r["note"] = "sink applied as O sigmoid(LSE - sink), one more kernel"
                    fn()  # the compile (outside the lock: CPU work, and this one call)
                    out_of = lambda: fn()
                else:
                    kw = {"causal": {"causal": True}, "window": {"window_size": (prm.get("left"), prm.get("right"))},
                          "softcap": {"softcap": prm.get("softcap"), "causal": prm.get("causal")},
                          "learned-sink": {"learnable_sink": sink, "causal": prm.get("causal")}}.get(name)
                    if kw is None:
                        r["why"] = "not in FA4's interface"
                    elif any(x not in fa4_params for x in kw):
                        r["why"] = "this FA4 has no " + ", ".join(x for x in kw if x not in fa4_params)
                    else:
                        qt, kt, vt = (x.transpose(1, 2).contiguous() for x in (q, k, v))  # [B, N, H, d]

                        def fn():
                            out = fa4(qt, kt, vt, **kw)
                            return out[0] if isinstance(out, tuple) else out
                        fn()  # the compile
                        out_of = lambda: fn().transpose(1, 2)
                if fn is not None and "why" not in r:
                    def check():
                        ref = reference_rows(torch, q, k, v, mm, sm, sink, hc, rows)
                        got = out_of()[0][hc][:, rows].float()
                        err = (got - ref).abs().max().item()
                        return not torch.isnan(got).any().item() and err <= 2e-2 * max(1.0, ref.abs().max().item()), err
                    check_and_keep(r, key, peer, fn, check, t0)
        except Exception as e:  # noqa: BLE001
            r["why"] = error_why(e)
        return r

    def prepare_model(task):
        """One model case (--models): inputs, the peer's call (model_peer_call), the compile, the
        fp32 check on sampled rows (model_check); kept for timing only if it passed. A peer named
        "fa4-bwd" or "flex-bwd" is that peer's backward: one forward whose graph is kept, then
        torch.autograd.grad of the inputs for a seeded dO, checked on the forward's sampled rows and
        on dQ, dK, dV of the first and last KV heads (model_grad_check), and timed alone, as
        bench_peers.py times a backward."""
        _, key, peer_task, name, prm, n, hq, d, kept_pairs = task
        peer, bwd = peer_task.split("-")[0], peer_task.endswith("-bwd")
        t0 = time.time()
        r = {"flops": (2.5 if bwd else 1.0) * 4.0 * kept_pairs * d}
        try:
            if peer == "flex" and flex is None:
                return dict(r, why=info["flex_why"])
            if peer == "fa4" and fa4 is None:
                return dict(r, why=info["fa4_why"])
            x = model_inputs(torch, prm, n, hq, d, "cuda", grad=bwd)
            kw = dict(fa4=fa4, fa4_params=fa4_params, fa4_varlen=fa4_varlen, fa4_varlen_params=fa4_varlen_params,
                      grad=bwd)
            fn, out_of, why = model_peer_call(torch, peer, prm, x, flex=flex, create_block_mask=create_block_mask, **kw)
            if why:
                return dict(r, why=why)
            if x["sink"] is not None and peer == "flex":
                r["note"] = "sink applied as O sigmoid(LSE - sink), one more kernel"
            try:
                fn()  # the compile (outside the lock: CPU work, and this one call)
            except Exception:  # noqa: BLE001
                if peer != "fa4" or x["sink"] is None:
                    raise
                # an FA4 that takes its learnable_sink in bf16 only: the sink rounded to bf16, in the
                # call and in the reference alike
                x["sink"] = x["sink"].to(torch.bfloat16).float()
                fn, out_of, why = model_peer_call(torch, peer, prm, x, sink_dtype=torch.bfloat16, **kw)
                fn()
                r["note"] = "learnable_sink passed in bf16 (the reference's sink rounded alike)"
            if not bwd:
                check_and_keep(r, key, peer_task, fn, lambda: model_check(torch, out_of(), x), t0)
                return r
            o = fn()  # the one forward whose graph every timed backward runs
            dout = torch.randn(o.shape, device="cuda", dtype=o.dtype,
                               generator=torch.Generator(device="cuda").manual_seed(3))
            leaves = x["leaves"]
            grad_fn = lambda: torch.autograd.grad(o, leaves, dout, retain_graph=True)  # noqa: E731
            grad_fn()  # the backward's compile

            def check():
                with torch.no_grad():
                    ok, err = model_check(torch, x["grads_bhnd"](o.detach())[0], x)
                if not ok:
                    return False, err
                bad, gerr = model_grad_check(torch, x["grads_bhnd"](*grad_fn()), x["grads_bhnd"](dout)[0], x)
                if bad:
                    r["note"] = ("backward: " + bad)[:160]
                return bad is None, gerr  # the cell's error: the gradients' largest
            r["note"] = ((r.get("note", "") + "; ") if r.get("note") else "") + \
                "the backward alone (torch.autograd.grad of one kept forward); dQ, dK, dV checked"
            check_and_keep(r, key, peer_task, grad_fn, check, t0)
        except Exception as e:  # noqa: BLE001
            r["why"] = error_why(e)
        return r

    while True:
        task = tasks.get()
        if task is None:
            return
        if task[0] == "time":
            _, key, peer, rnd = task
            try:
                with lock:
                    ms = timer(prepared[(key, peer)])
                results.put(("timed", wid, key, peer, rnd, ms, None))
            except Exception as e:  # noqa: BLE001
                results.put(("timed", wid, key, peer, rnd, None, f"{type(e).__name__}: {str(e)[:80]}"))
            continue
        results.put(("prepared", wid, task[1], task[2], prepare_model(task) if task[3] == "model" else prepare(task)))


def fake_worker(wid, tasks, results, lock):
    """--fake-peers: the protocol of peer_worker with sleeps for compiles and times (no GPU)."""
    rnd_ = random.Random(wid)
    results.put(("ready", wid, {"flex_why": "", "fa4_why": "", "fake": True}))
    while True:
        task = tasks.get()
        if task is None:
            return
        if task[0] == "time":
            with lock:
                time.sleep(0.02)
            results.put(("timed", wid, task[1], task[2], task[3], 1.0 + 0.05 * rnd_.random(), None))
            continue
        _, key, peer, name, prm, n, heads, d, kept_pairs = task
        time.sleep(0.1 + 0.2 * rnd_.random())
        if name == "model" and peer.split("-")[0] == "fa4" and d == 256:  # to try the cell of a case a peer lacks
            results.put(("prepared", wid, key, peer, {"why": "not supported: head dim 256 (fake peers)"}))
        elif name == "model":
            results.put(("prepared", wid, key, peer, {"flops": 4.0 * kept_pairs * d, "pass": True, "err": 0.0}))
        elif peer == "fa4" and name not in FA4_VARIANTS:
            results.put(("prepared", wid, key, peer, {"why": "not in FA4's interface"}))
        else:
            results.put(("prepared", wid, key, peer, {"flops": 4.0 * kept_pairs * d, "pass": True, "err": 0.0}))


# ----------------------------------------------------------------------------- main

def model_list(text):
    names = [x.strip() for x in text.split(",") if x.strip()]
    bad = [x for x in names if x not in MODELS]
    if bad:
        raise argparse.ArgumentTypeError("no model case %s (cases: %s)" % (", ".join(bad), ", ".join(MODELS)))
    return ",".join(names)


def variant_list(text):
    names = [x.strip() for x in text.split(",") if x.strip()]
    bad = [x for x in names if x not in VARIANTS]
    if bad or not names:
        raise argparse.ArgumentTypeError("no variant %s (variants: %s)" % (", ".join(bad), ", ".join(VARIANTS)))
    return ",".join(names)


def sparse_args(name, pr):
    """The options of `ch06_variants mask --mask NAME` that set a sparse pattern's parameters `pr`
    (the table's: prm in main)."""
    return [str(x) for x in {"strided": ["--stride", pr.get("stride")],
                             "fixed": ["--block", pr.get("block"), "--summary", pr.get("summary")],
                             "longformer": ["--window", pr.get("left"), "--globals", pr.get("globals")],
                             "bigbird": ["--block", pr.get("block"), "--globals", pr.get("globals"),
                                         "--random", pr.get("random")]}[name]]


def fmt_cell(r):
    if not r:
        return "-"
    if r.get("why"):
        return r["why"]
    if r.get("pass") is False:
        return "FAIL (check)"
    if r.get("ms") is None:
        return "checked, not timed (time budget)" if r.get("pass") else "-"
    return f"{r['ms']:.3f} ms / {r.get('tflops', 0):.0f}"


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--bin", default="build/bin/ch06_variants")
    ap.add_argument("--n", type=int, default=8192, help="N of the variant table")
    ap.add_argument("--heads", type=int, default=16)
    ap.add_argument("--sweep-n", type=int, default=16384, help="N of the window sweep and the documents")
    ap.add_argument("--windows", default="128,256,512,1024,2048,4096,8192,16384")
    ap.add_argument("--docs", type=int, default=8)
    ap.add_argument("--window", type=int, default=1024, help="the table's window (L, 0), and the sweep's peer point")
    ap.add_argument("--workers", type=int, default=6, help="peer processes (compiles run in parallel)")
    ap.add_argument("--check-mflops", type=int, default=1000, help="our fp64 check's budget per variant (sampled rows)")
    ap.add_argument("--budget", type=float, default=1e9, help="seconds: peers not done by then are reported so")
    ap.add_argument("--no-peers", action="store_true")
    ap.add_argument("--hopper-step", type=int, default=None, help="the sm90a step of ours (default: the binary's last)")
    ap.add_argument("--rounds", type=int, default=3, help="interleaved timing rounds of the peers (median of the rounds)")
    ap.add_argument("--fake-peers", action="store_true", help="workers sleep instead of running torch (tries the orchestration)")
    ap.add_argument("--skip", default="", help="comma-separated parts to skip: variants,sweep,docs")
    ap.add_argument("--variants", type=variant_list, default=",".join(VARIANTS),
                    help="the variants of the table (default: all), e.g. %s" % ",".join(SPARSE))
    ap.add_argument("--models", type=model_list, default="",
                    help="the named model cases, e.g. gpt-oss,gemma2,mistral,packed-docs (only these run)")
    ap.add_argument("--model-n", type=lambda x: [int(v) for v in x.split(",") if v], default=[8192, 16384],
                    help="N of the model cases (default 8192,16384)")
    ap.add_argument("--model-tokens", type=int, default=16384, help="B = tokens / N for the model cases")
    ap.add_argument("--model-batch", type=int, default=None, help="B of the model cases (instead of tokens / N)")
    ap.add_argument("--no-model-backward", action="store_true", help="the model cases: forward only (ours and the peers)")
    ap.add_argument("--model-timeout", type=int, default=300, help="seconds one model launch of ours may run")
    ap.add_argument("--save", default="/tmp/ch06_masks.json", help="partial results after every stage")
    ap.add_argument("--plot", nargs=2, metavar=("JSON", "PNG"), help="plot time against kept tiles from a BENCH_JSON line")
    ap.add_argument("--table", metavar="JSON", help="print the tables of a saved BENCH_JSON line and exit")
    a = ap.parse_args()
    if a.plot:
        return plot(*a.plot)
    if a.hopper_step is not None:
        OURS_EXTRA.extend(["--hopper-step", str(a.hopper_step)])
    if a.table:
        line = open(a.table).read()
        print_table(json.loads(line[line.index("{"):]))
        return 0
    t0 = time.time()
    n, heads, d, sn = a.n, a.heads, 128, a.sweep_n
    skip = set(a.skip.split(",")) if a.skip else set()
    if a.models:  # the model cases alone
        skip |= {"variants", "sweep", "docs"}
    out = {"n": n, "sweep_n": sn, "heads": heads, "d": d, "window_peer": a.window, "model_tokens": a.model_tokens, "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
           "command": "python3 " + " ".join(sys.argv)}
    try:
        out["gpu"] = subprocess.run(["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"], capture_output=True,
                                    text=True).stdout.strip().splitlines()[0]
    except Exception:  # noqa: BLE001
        out["gpu"] = "?"

    # The table's masks, fixed here so that the peers can start compiling at once.
    rnd = random.Random(5)
    cuts = sorted(rnd.sample(range(1, n), 7))
    lens = [b - a_ for a_, b in zip([0] + cuts, cuts + [n])]
    prm = {"causal": {}, "window": {"left": a.window, "right": 0}, "chunked": {"chunk": 1024}, "prefix": {"prefix": n // 4},
           "document": {"doc_lens": lens, "causal": True}, "sink": {"sinks": 4, "left": 64},
           "learned-sink": {"causal": True}, "alibi": {"causal": True}, "softcap": {"softcap": 30.0, "causal": True},
           "custom": {"seed": 7}, "strided": {"stride": 128}, "fixed": {"block": 128, "summary": 16},
           "longformer": {"left": 256, "globals": 1}, "bigbird": {"block": 64, "globals": 2, "random": 3, "seed": 7}}
    tour_args = ["--n", str(n), "--heads", str(heads), "--kv-heads", str(heads), "--d", "128", "--batch", "1",
                 "--window", f"{a.window},0", "--chunk", "1024", "--prefix", str(n // 4),
                 "--doc-lens", ",".join(map(str, lens)), "--sinks", "4", "--softcap", "30", "--causal",
                 "--check-mflops", str(a.check_mflops)]
    kept_table = {"causal": n * (n + 1) / 2 * heads}

    import multiprocessing as mp
    ctx = mp.get_context("spawn")
    lock = ctx.Lock()
    workers, queues, results = [], [], ctx.Queue()
    if not a.no_peers:
        for w in range(a.workers):
            q_ = ctx.Queue()
            p = ctx.Process(target=peer_worker, args=(w, q_, results, lock, a.fake_peers), daemon=True)
            p.start()
            workers.append(p)
            queues.append(q_)

    def kept(nn, name, pr):
        """Kept pairs of one head x heads, computed like the binary (for the peers' FLOPs)."""
        if name == "causal":
            return nn * (nn + 1) / 2 * heads
        if name == "window":
            L = pr["left"]
            return sum(min(i, L) + 1 for i in range(nn)) * heads
        return None
    sent = {}  # (key, peer) -> the worker that prepares (and later times) it

    def send(key, peer, name, pr, nn, kp, hh=None, dd=None):
        if workers:
            w = len(sent) % len(workers)  # round robin
            queues[w].put(("prepare", key, peer, name, pr, nn, hh or heads, dd or d, kp))
            sent[(key, peer)] = w

    # the model cases (--models): their peers start compiling at once (the packed documents' once
    # our run has named the documents: below)
    model_cases = []
    # the peers of a model case: forward, and the backward ("-bwd") unless --no-model-backward
    model_peers = ("fa4", "flex") + (() if a.no_model_backward else ("fa4-bwd", "flex-bwd"))
    for mname in (a.models.split(",") if a.models else []):
        case = MODELS[mname]
        for nn in a.model_n:
            # packed documents are one batch by construction (the binary refuses --batch > 1)
            bb = 1 if case.get("docs") else (a.model_batch or max(1, a.model_tokens // nn))
            pr = {"model": mname, "batch": bb, "hkv": case["hkv"], "left": case.get("left"),
                  "softcap": case.get("softcap"), "sink": bool(case.get("sink"))}
            model_cases.append((mname, nn, bb, pr))
            if not case.get("docs"):
                for peer in model_peers:
                    send(f"model:{mname}:{nn}", peer, "model", pr, nn, bb * case["hq"] * model_kept_pairs(case, nn),
                         case["hq"], case["d"])
    # peers of the sweep's goal points first (they are the headline), then the table in order
    if "sweep" not in skip:
        for name, pr in (("causal", {}), ("window", {"left": a.window, "right": 0})):
            for peer in ("fa4", "flex"):
                send(f"sweep:{name}", peer, name, pr, sn, kept(sn, name, pr))
    table_pending = []
    variants = a.variants.split(",")
    if "variants" not in skip:
        for name in FA4_VARIANTS:
            if name in variants:
                send(name, "fa4", name, prm[name], n, kept(n, "causal", {}))  # FLOPs recounted from ours below
        table_pending = list(variants)  # Flex: every variant, once our FLOP counts are known (below)

    # 1. every variant, ours: one tour on one set of inputs
    if "variants" not in skip:
        # the tour (every variant on one set of inputs) for the variants before the sparse patterns;
        # each sparse pattern its own launch, with the table's parameters (in the tour longformer's
        # window would be the binary's default)
        reps = {}
        if any(x not in SPARSE for x in variants):
            rep, err = run_ours(a.bin, tour_args, lock, timeout=300)
            reps.update({x: (rep, err) for x in variants if x not in SPARSE})
        for name in (x for x in variants if x in SPARSE):
            reps[name] = run_ours(a.bin, ["--mask", name, "--n", str(n), "--heads", str(heads), "--kv-heads", str(heads),
                                          "--d", "128", "--batch", "1", "--check-mflops", str(a.check_mflops)] +
                                  sparse_args(name, prm[name]), lock, timeout=300)
        out["variants"] = {}
        errs = sorted({e for r_, e in reps.values() if r_ is None and e})
        if errs:
            out["variants_error"] = "; ".join(errs)[:300]
        for name in variants:
            rep = reps[name][0]
            note = spec_of_note(rep, name)
            row = {"spec": note, "ours": ours_rows(rep, name), "params": prm[name]}
            if not row["ours"]:
                row["ours_error"] = (reps[name][1] or "our report has no rows named %s:" % name)[:120]
            flops = next((r["flops"] for r in row["ours"].values() if r.get("flops")), None)
            row["kept_pairs"] = flops / (4.0 * d) if flops else None
            got = params_from_note(name, note) if note else {}
            row["params_agree"] = all(got.get(k_) == v_ for k_, v_ in prm[name].items() if k_ in got)
            out["variants"][name] = row
        for name in table_pending:
            kp = out["variants"][name]["kept_pairs"] or kept(n, "causal", {})
            send(name, "flex", name, prm[name], n, kp)
        log(f"ours, variants: {time.time() - t0:.0f} s")
        save(a.save, out)

    # 2. the window sweep (and our causal of the same N), ours
    if "sweep" not in skip:
        ws = [w for w in map(int, a.windows.split(",")) if w <= sn]
        args = ["--mask", "window", "--window", f"{ws[0]},0", "--windows", ",".join(map(str, ws)),
                "--n", str(sn), "--heads", str(heads), "--kv-heads", str(heads), "--d", "128", "--batch", "1"]
        rep, err = run_ours(a.bin, args, lock, timeout=300)
        out["sweep"] = [{"window": w, "ours": ours_rows(rep, f"window L={w}")} for w in ws]
        if err:
            out["sweep_error"] = err
        rep, err = run_ours(a.bin, ["--mask", "causal", "--n", str(sn), "--heads", str(heads), "--kv-heads", str(heads),
                                    "--d", "128", "--batch", "1", "--check-mflops", str(a.check_mflops)], lock)
        out["sweep_causal"] = ours_rows(rep, "causal") if rep else {"error": err}
        log(f"ours, sweep: {time.time() - t0:.0f} s")
        save(a.save, out)

    # 3. documents: packed against each alone
    if "docs" not in skip:
        rep, err = run_ours(a.bin, ["--mask", "document", "--docs", str(a.docs), "--causal", "--alone", "--gpu-path", "sm90a",
                                    "--n", str(sn), "--heads", str(heads), "--kv-heads", str(heads), "--d", "128",
                                    "--batch", "1"], lock)
        if rep:
            dl = params_from_note("document", spec_of_note(rep, "document")).get("doc_lens", [])
            out["docs"] = {"n": sn, "lens": dl, "packed": ours_rows(rep, "document"),
                           "alone": [ours_rows(rep, f"document {k} alone ({ln})") for k, ln in enumerate(dl)]}
        else:
            out["docs"] = {"error": err}
        log(f"ours, docs: {time.time() - t0:.0f} s")
        save(a.save, out)

    # 3b. the model cases, ours: one launch each (the forwards, and the backward unless --no-model-backward)
    if model_cases:
        out["models"] = []
        for mname, nn, bb, pr in model_cases:
            case = MODELS[mname]
            e = {"model": mname, "n": nn, "batch": bb, "d": case["d"], "hq": case["hq"], "hkv": case["hkv"],
                 "mask": case["mask"], "params": pr}
            args = ["--model", mname, "--n", str(nn), "--batch", str(bb)]
            rep, err = run_ours(a.bin, args + ["--check-mflops", str(a.check_mflops)], lock, timeout=a.model_timeout,
                                backward=not a.no_model_backward)
            if rep is None and err != "timeout":  # a binary whose --model takes no --check-mflops
                rep, err = run_ours(a.bin, args, lock, timeout=a.model_timeout, backward=not a.no_model_backward)
            e["ours"] = model_ours_rows(rep, mname)
            if rep is None or not e["ours"]:
                e["ours_error"] = (err or "our report has no rows named %s:" % mname)[:200]
            lens = doc_lens_of(rep) if case.get("docs") else None
            if case.get("docs"):
                e["doc_lens"] = lens
                if lens and sum(lens) == nn:
                    pr["doc_lens"] = lens
                    for peer in model_peers:
                        send(f"model:{mname}:{nn}", peer, "model", pr, nn, bb * case["hq"] * model_kept_pairs(case, nn, lens),
                             case["hq"], case["d"])
                else:
                    e["peers"] = {p_: {"why": "our run named no documents (the peers need their lengths)"}
                                  for p_ in model_peers}
            kp = model_kept_pairs(case, nn, lens)
            e["kept_pairs"] = bb * case["hq"] * kp if kp else None
            e["flops"] = 4.0 * e["kept_pairs"] * case["d"] if kp else None
            out["models"].append(e)
            save(a.save, out)
        log(f"ours, model cases: {time.time() - t0:.0f} s")

    # 4. collect the preparations (compile + check) until every task is back or the budget is spent
    ready = {}
    got = {}

    def take(msg):
        if msg[0] == "ready":
            ready[msg[1]] = msg[2]
        elif msg[0] == "prepared":
            got[(msg[2], msg[3])] = msg[4]
        elif msg[0] == "timed":
            timed.setdefault((msg[2], msg[3]), []).append((msg[4], msg[5], msg[6]))
    timed = {}
    # the preparations stop in time to leave the timing rounds theirs (about 0.6 s a timed call,
    # the L2 flushes and the backwards at 16K included), so that a run the compiles and checks
    # fill still times what they prepared
    reserve = min(0.4 * a.budget, 0.6 * a.rounds * len(sent))
    while workers and len(got) < len(sent) and time.time() - t0 < a.budget - reserve:
        if not any(w.is_alive() for w in workers):
            break
        try:
            take(results.get(timeout=max(0.1, min(1.0, a.budget - (time.time() - t0)))))
        except queue.Empty:
            continue
    log(f"peers prepared: {sum(1 for r in got.values() if r.get('pass'))} of {len(sent)}: {time.time() - t0:.0f} s")
    # 5. the timing rounds: every prepared peer once per round, one at a time, in a rotated order
    todo = [kp for kp in sent if got.get(kp, {}).get("pass")]
    rounds_done = 0
    for rnd in range(a.rounds if todo else 0):
        order = todo[rnd % len(todo):] + todo[:rnd % len(todo)]
        for kp in order:
            if time.time() - t0 > a.budget:
                break
            queues[sent[kp]].put(("time", kp[0], kp[1], rnd))
            while time.time() - t0 < a.budget + 5:
                try:
                    msg = results.get(timeout=1.0)
                except queue.Empty:
                    if not workers[sent[kp]].is_alive():
                        break
                    continue
                take(msg)
                if msg[0] == "timed" and (msg[2], msg[3]) == kp and msg[4] == rnd:
                    break
        else:
            rounds_done += 1
            continue
        break
    out["peer_rounds"] = rounds_done
    for kp, runs in timed.items():
        ms = sorted(m for _, m, e in runs if m is not None)
        r = got.setdefault(kp, {})
        r["ms_rounds"] = [m for _, m, e in sorted(runs) if m is not None]
        if ms:
            r["ms"] = statistics.median(ms)
            r["spread"] = (ms[-1] - ms[0]) / r["ms"] if len(ms) > 1 else None
            r["tflops"] = r["flops"] / (r["ms"] * 1e-3) / 1e12 if r.get("flops") else None
        errs = [e for _, m, e in runs if e]
        if errs:
            r["time_error"] = errs[0]
    log(f"peers timed, {rounds_done} of {a.rounds} rounds: {time.time() - t0:.0f} s")
    while True:  # what is left in the queue (a worker that stopped early said why)
        try:
            take(results.get(timeout=0.2))
        except queue.Empty:
            break
    for q_ in queues:
        q_.put(None)
    for w in workers:  # done: stop them (a worker still compiling is not waited for)
        w.join(timeout=0.5)
        if w.is_alive():
            w.terminate()
    info = next(iter(ready.values()), {})
    out["peer_versions"] = {k_: v_ for k_, v_ in info.items() if not k_.endswith("_why")}
    why_missing = "not measured (time budget of this run)" if workers else (
        "peers off (--no-peers)" if a.no_peers else "no peer process")
    for (key, peer) in sent:
        r = got.get((key, peer), {"why": info.get(peer + "_why") or why_missing})
        if key.startswith("sweep:"):
            out.setdefault("sweep_peers", {}).setdefault(key[6:], {})[peer] = r
        elif key.startswith("model:"):
            _, mname, nn = key.split(":")
            for e in out.get("models", []):
                if e["model"] == mname and e["n"] == int(nn):
                    e.setdefault("peers", {})[peer] = r
        elif key in out.get("variants", {}):
            out["variants"][key].setdefault("peers", {})[peer] = r
    # The peers' FLOPs are ours (the same kept pairs, counted once, by the binary).
    def recount(r, ours):
        fl = next((x["flops"] for x in ours.values() if isinstance(x, dict) and x.get("flops")), None)
        if fl and r.get("ms"):
            r["flops"], r["tflops"] = fl, fl / (r["ms"] * 1e-3) / 1e12
    for name, pe in out.get("sweep_peers", {}).items():
        ours = out.get("sweep_causal", {}) if name == "causal" else next(
            (s["ours"] for s in out.get("sweep", []) if s["window"] == a.window), {})
        for r in pe.values():
            recount(r, ours if isinstance(ours, dict) else {})
    for e in out.get("models", []):  # the FLOPs: the binary's count where it has one (the backward's its own)
        fwd = {k_: v_ for k_, v_ in e.get("ours", {}).items() if k_ != "bwd"}
        bwd = {k_: v_ for k_, v_ in e.get("ours", {}).items() if k_ == "bwd"}
        for peer, r in e.setdefault("peers", {}).items():
            recount(r, bwd if peer.endswith("-bwd") else fwd)
        for peer in model_peers:
            e["peers"].setdefault(peer, {"why": info.get(peer.split("-")[0] + "_why") or why_missing})
    for name, row in out.get("variants", {}).items():
        for r in row.get("peers", {}).values():
            recount(r, row["ours"])
        pe = row.setdefault("peers", {})
        pe.setdefault("flex", {"why": info.get("flex_why") or why_missing})
        pe.setdefault("fa4", {"why": info.get("fa4_why") or ("not in FA4's interface" if name not in FA4_VARIANTS
                                                                   else why_missing)})
        if not row.get("params_agree", True):
            for r in pe.values():
                r.setdefault("why", "the peer's mask parameters differ from ours")
    out["duration_s"] = round(time.time() - t0, 1)
    save(a.save, out)
    print_table(out)
    print("BENCH_JSON " + json.dumps(out, default=lambda o: None))
    return 0


def save(path, out):
    if path:
        with open(path, "w") as f:
            f.write("BENCH_JSON " + json.dumps(out, default=lambda o: None) + "\n")


def print_table(out):
    if out.get("models") and not out.get("variants") and not out.get("sweep"):
        print(f"# ch06 masks, the model cases, {out.get('gpu')}, {out['date']}: bf16")
    else:
        print(f"# ch06 masks, {out.get('gpu')}, {out['date']}: B = 1, H = {out['heads']}, d = 128, bf16, forward")
    print(f"# command: {out['command']}   ({out.get('duration_s', '?')} s; peers {out.get('peer_versions', {})})")
    cell = lambda r: ("FAIL (check)" if r and r.get("pass") is False else fmt_cell(r))

    def ratio(o9, peer):
        if not (o9 and o9.get("ms") and o9.get("pass") and peer and peer.get("ms")):
            return "-"
        return f"{peer['ms'] / o9['ms']:.2f}x"
    for k_ in ("variants_error", "sweep_error"):
        if out.get(k_):
            print(f"{k_}: {out[k_]}")
    if out.get("variants"):
        print(f"\nEvery variant at N = {out['n']} (ms / TFLOP/s over kept pairs; peer / ours > 1: ours faster)\n")
        print("| variant | mask | ours sm90a | ours sm80 | FlexAttention | FA4 | Flex / ours | FA4 / ours |")
        print("|---|---|---|---|---|---|---|---|")
        for name, row in out["variants"].items():
            o9, o8 = row["ours"].get("sm90a"), row["ours"].get("sm80")
            pe = row.get("peers", {})
            spec = (row.get("spec") or "").split(";")[0].split(": ", 1)[-1]
            o_err = row.get("ours_error") if not row["ours"] else None
            print(f"| {name} | {spec[:60]} | {o_err or cell(o9)} | {o_err or cell(o8)} | {fmt_cell(pe.get('flex'))} | "
                  f"{fmt_cell(pe.get('fa4'))} | "
                  f"{ratio(o9, pe.get('flex'))} | {ratio(o9, pe.get('fa4'))} |")
    if out.get("sweep"):
        c9 = out.get("sweep_causal", {}).get("sm90a", {})
        c8 = out.get("sweep_causal", {}).get("sm80", {})
        print(f"\nWindow (L, 0) sweep at N = {out['sweep_n']}; causal of the same run: sm90a {fmt_cell(c9)}, "
              f"sm80 {fmt_cell(c8)}\n")
        print("| window L | kept tiles (sm90a) | sm90a ms | causal / window (sm90a) | sm80 ms | causal / window (sm80) |")
        print("|---:|---:|---:|---:|---:|---:|")
        for s in out["sweep"]:
            r9, r8 = s["ours"].get("sm90a", {}), s["ours"].get("sm80", {})
            sp = lambda c, r: f"{c['ms'] / r['ms']:.2f}x" if r.get("ms") and c.get("ms") and r.get("pass") else "-"
            ms = lambda r: "FAIL (check)" if r.get("pass") is False else (f"{r['ms']:.3f}" if r.get("ms") else "-")
            print(f"| {s['window']} | {r9.get('tiles') or '-'} | {ms(r9)} | {sp(c9, r9)} | {ms(r8)} | {sp(c8, r8)} |")
        sp = out.get("sweep_peers", {})
        if sp:
            print("\nPeers at the sweep's N: causal and window (%s, 0)\n" % (out.get("window_peer", "1024")))
            print("| peer | causal | window | causal / window |")
            print("|---|---|---|---|")
            for peer in ("fa4", "flex"):
                c, w = sp.get("causal", {}).get(peer, {}), sp.get("window", {}).get(peer, {})
                r = f"{c['ms'] / w['ms']:.2f}x" if c.get("ms") and w.get("ms") else "-"
                print(f"| {peer} | {fmt_cell(c)} | {fmt_cell(w)} | {r} |")
    stab = []  # every timed peer point: its round medians and spread
    for name, row in (out.get("variants") or {}).items():
        for peer, r in (row.get("peers") or {}).items():
            if r.get("ms_rounds"):
                stab.append((f"{peer} {name} (N = {out['n']})", r))
    for name, pe in (out.get("sweep_peers") or {}).items():
        for peer, r in pe.items():
            if r.get("ms_rounds"):
                stab.append((f"{peer} {name} (N = {out['sweep_n']})", r))
    if stab:
        print(f"\nPeer stability: {out.get('peer_rounds', '?')} interleaved rounds, each the median of 20 "
              "(the tables give the median of the rounds)\n")
        print("| peer, mask | round medians (ms) | spread (max - min) / median |")
        print("|---|---|---|")
        for label, r in stab:
            sp = f"{100 * r['spread']:.1f}%" if r.get("spread") is not None else "-"
            print(f"| {label} | {' '.join(f'{m:.3f}' for m in r['ms_rounds'])} | {sp} |")
    if out.get("models"):
        print("\nThe masks in the shapes of real models, forward (B = %s tokens / N; ms / TFLOP/s over kept pairs; "
              "peer / ours > 1: ours faster)\n" % out.get("model_tokens", "?"))
        print("| case | N | B | d | Hq/Hkv | mask | ours sm90a | ours sm80 | ours backward | FlexAttention | FA4 | "
              "Flex / ours | FA4 / ours |")
        print("|---|---|---|---|---|---|---|---|---|---|---|---|---|")
        for e in out["models"]:
            o = e.get("ours") or {}
            pe = e.get("peers") or {}
            o9 = o.get("sm90a")
            print(f"| {e['model']} | {e['n']} | {e['batch']} | {e['d']} | {e['hq']}/{e['hkv']} | {e['mask']} | "
                  f"{cell(o9) if o else e.get('ours_error', '-')} | {cell(o.get('sm80'))} | {cell(o.get('bwd'))} | "
                  f"{fmt_cell(pe.get('flex'))} | {fmt_cell(pe.get('fa4'))} | {ratio(o9, pe.get('flex'))} | "
                  f"{ratio(o9, pe.get('fa4'))} |")
        if any(k_.endswith("-bwd") for e in out["models"] for k_ in (e.get("peers") or {})):
            print("\nThe same cases, backward (dQ, dK, dV; 2.5 x the forward's FLOPs; peer / ours > 1: ours faster)\n")
            print("| case | N | d | ours backward | FlexAttention | FA4 | Flex / ours | FA4 / ours |")
            print("|---|---|---|---|---|---|---|---|")
            for e in out["models"]:
                ob, pe = (e.get("ours") or {}).get("bwd"), e.get("peers") or {}
                print(f"| {e['model']} | {e['n']} | {e['d']} | {cell(ob) if ob else e.get('ours_error', '-')} | "
                      f"{cell(pe.get('flex-bwd'))} | {cell(pe.get('fa4-bwd'))} | {ratio(ob, pe.get('flex-bwd'))} | "
                      f"{ratio(ob, pe.get('fa4-bwd'))} |")
    dd = out.get("docs") or {}
    if dd.get("packed"):
        pk = dd["packed"].get("sm90a", {})
        alone = [x.get("sm90a", {}) for x in dd.get("alone", [])]
        ok = pk.get("ms") and pk.get("pass") and alone and all(x.get("ms") and x.get("pass") for x in alone)
        print(f"\nDocuments at N = {dd['n']} (causal within each), lengths {dd['lens']}:")
        if ok:
            s = sum(x["ms"] for x in alone)
            print(f"packed with the document mask {pk['ms']:.3f} ms; each alone, summed {s:.3f} ms "
                  f"({len(alone)} launches); packed / alone = {pk['ms'] / s:.2f}")
        else:
            print("packed or alone rows missing or failed: " + json.dumps({"packed": pk, "alone": alone})[:300])


def plot(json_path, png):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    line = open(json_path).read()
    data = json.loads(line[line.index("{"):])
    fig, ax = plt.subplots(figsize=(6.4, 4.2))
    for key, style, lab in (("sm90a", "o-", "sm90a masked forward"), ("sm80", "s-", "sm80 masked forward")):
        xs, ys, ws = [], [], []
        for s in data["sweep"]:
            r = s["ours"].get(key, {})
            if r.get("ms") and r.get("tiles") and r.get("pass"):
                xs.append(r["tiles"]), ys.append(r["ms"]), ws.append(s["window"])
        if not xs:
            continue
        ax.plot(xs, ys, style, label=f"{lab} (window L, 0)")
        k = max(ys) / max(xs)  # the line through the largest point: time proportional to tiles
        ax.plot([min(xs), max(xs)], [k * min(xs), k * max(xs)], "--", color="gray", linewidth=0.8)
        if key == "sm90a":
            for x, y, w in zip(xs, ys, ws):
                ax.annotate(str(w), (x, y), textcoords="offset points", xytext=(4, -10), fontsize=8)
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("K/V tiles visited (over all heads; sm90a 128 x 128, sm80 128 x 64)")
    ax.set_ylabel("time (ms)")
    ax.set_title(f"sliding window, N = {data['sweep_n']}, H = {data['heads']}, d = 128 "
                 f"({data.get('gpu')}, {data['date']})", fontsize=9)
    ax.legend(fontsize=8, title="dashed: proportional to tiles", title_fontsize=7)
    fig.tight_layout()
    fig.savefig(png, dpi=120)
    print(f"wrote {png}")


if __name__ == "__main__":
    sys.exit(main())
