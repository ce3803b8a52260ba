"""The peers, timed in the same process and the same way as the chapter binaries time ours.

Each peer is a callable on a shape. Its output is checked first, as the chapters check
ours (common/compare.hpp): sampled rows (0, 1, N-2, N-1 and a spread between) of several
(batch, head) pairs, the first and the last among them, against an fp32 reference, with
the same scale-aware rule: per row, error <= 2 x the worst error of a plain bf16
computation over the checked rows (fp32 scores, P and O rounded to bf16) + 2^-8 x the
row's own max |ref|, and
the same bound in L2 (`judge_rows()`). An all-zero output fails. The backward checks dQ,
dK and dV of the first and last KV groups (every query head of the group), each tensor
judged as one row, as the chapters judge gradients. Then the peer
is timed with peer_timer.PeerTimer: 3 warm-ups, an L2 flush that leaves the cache clean
before every repeat, CUDA events, the median.

A peer that cannot be imported, has no kernel for a shape, does not compile or runs out
of memory is a row with status "unsupported" and the reason; an exception in this
harness (the check, the timing, a Python error) is a row with status "error"; neither
stops the run.
"""
import os
import time

# No pool of torch.compile workers (their processes would share the CPU with the timings; see lineage.py).
os.environ.setdefault("TORCHINDUCTOR_COMPILE_THREADS", "1")

from bench_common import PEER_LABEL, attention_flops
from peer_timer import PeerTimer


def _first_line(e):
    s = ("%s: %s" % (e.__class__.__name__, e)).strip()
    return (s.splitlines() or ["?"])[0][:160]


BF16_U = 2.0 ** -8  # the unit roundoff of bf16, the floor's factor (compare.hpp)


def peer_refused(e):
    """True when an exception from calling a peer means it has no kernel for the shape (or ran out
    of memory, or did not compile): "unsupported". Anything else is an error of the harness."""
    name = type(e).__name__
    if isinstance(e, (NotImplementedError, MemoryError)) or "OutOfMemory" in name or "Unsupported" in name:
        return True
    if any(w in name for w in ("Compil", "Inductor", "Backend", "Lowering", "Dynamo")):
        return True
    if type(e) is RuntimeError or name in ("CUDAError", "AcceleratorError"):
        return True  # torch's "No available kernel", cuDNN and CUDA errors of the peer itself
    return False



def failure(e, refused):
    """A peer's exception as a row: "unsupported" where `refused` (the peer declined the shape),
    else "error" (the harness failed, never relabelled)."""
    if refused:
        return {"status": "unsupported", "note": _first_line(e)}
    return {"status": "error", "note": "harness: " + _first_line(e)}

def sample_pairs(b, h, most=8):
    """(batch, head) pairs: all of them when there are at most `most`, else `most` evenly spaced
    over the flat index b * h, the first and the last among them."""
    total = b * h
    n = min(total, most)
    flat = sorted({(total - 1) * k // max(1, n - 1) for k in range(n)})
    return [(f // h, f % h) for f in flat]


def sample_rows(n, most=16):
    """Query rows: 0, 1, n-2, n-1 and evenly spaced ones between, sorted, at most about `most`."""
    rows = {0, min(1, n - 1), max(0, n - 2), n - 1}
    k = min(n, most)
    rows.update((n - 1) * i // max(1, k - 1) for i in range(k))
    return sorted(rows)


def judge_rows(name, err, naive, scale, l2_err, l2_naive, width, u=BF16_U, yardstick="bf16"):
    """The rule of common/compare.hpp on per-row numbers: `err`, `naive` are each row's max
    |out - ref| of the peer and of the plain bf16 computation, `scale` each row's max |ref|,
    `l2_err`, `l2_naive` the L2 norms of the errors over all checked elements, `width` the
    elements per row. Returns (worst margin, failure text or None)."""
    if any(x != x or x == float("inf") for x in naive) or l2_naive != l2_naive:
        return float("inf"), "%s: the bf16 yardstick overflowed: no tolerance can be set" % name
    if any(x != x for x in err) or l2_err != l2_err:
        return float("inf"), "%s: NaN in the checked rows" % name
    n_max = max(naive) if naive else 0.0  # the yardstick's worst checked row (compare.hpp)
    if scale and max(scale) == 0:
        scale = [1.0] * len(scale)  # a reference of exact zeros: the inputs' scale
    margin, bad = 0.0, None
    for r, (e, sc) in enumerate(zip(err, scale)):
        tol = 2.0 * n_max + u * sc
        m = e / tol if tol > 0 else (float("inf") if e > 0 else 0.0)
        if m > margin:
            margin = m
            if m > 1.0:
                bad = "%s: checked row %d differs by %.3g (> %.3g = 2 x %s %.3g + %.3g)" % (
                    name, r, e, tol, yardstick, n_max, u * sc)
    if bad:
        return margin, bad
    l2_tol = 2.0 * l2_naive + u * (width * sum(sc * sc for sc in scale)) ** 0.5
    if not l2_err <= l2_tol:
        return max(margin, l2_err / l2_tol), "%s: L2 error %.3g > %.3g" % (name, l2_err, l2_tol)
    return margin, None


def judge_tensors(torch, name, got, refs, naives, what, per_row=True):
    """judge_rows() on checked rows (lists of tensors, concatenated): (the largest error, the failure
    text or None). `per_row` False judges the tensors as one row (the gradients, as
    common/compare.hpp's Magnitude::tensor: their rows' errors follow the cancelling terms they
    sum, not the rows' own size)."""
    g, r, nv = torch.cat(got), torch.cat(refs), torch.cat(naives)
    if r.abs().max().item() > 0 and g.abs().max().item() == 0:
        return 0.0, "%s is all zeros on the %s checked" % (name, what)
    e, ne = (g - r).abs(), (nv - r).abs()
    if per_row:
        err, nerr, scale, width = e.amax(-1).tolist(), ne.amax(-1).tolist(), r.abs().amax(-1).tolist(), r.shape[-1]
    else:
        err, nerr, scale, width = [e.max().item()], [ne.max().item()], [r.abs().max().item()], r.numel()
    margin, bad = judge_rows(name, err, nerr, scale, torch.linalg.vector_norm(g - r).item(),
                             torch.linalg.vector_norm(nv - r).item(), width)
    return max(err) if err else 0.0, (bad + " (%s)" % what) if bad else None


def group_grads(torch, k0, v0, heads, tau, keep=None, cap=None, sinks=None):
    """The gradients of one KV group: `heads` is [(q0, do0)], each query head's Q and dO in fp32,
    k0 and v0 the group's K and V in fp32. Returns (reference, naive), each (dQ of every head
    [list], dK, dV): the reference in fp32, the naive a plain bf16 computation (P, O, dS and the
    gradients rounded to bf16), the yardstick. keep: [Nq, Nk] booleans (None: every pair); cap: a
    softcap (dS takes its derivative 1 - tanh^2(s / cap)); sinks: each head's sink logit (a
    column with no value: dS_j = P_j (dP_j - D) still holds, D = rowsum(dO o O)). One head's
    scores at a time: at N = 16K they are 1 GB."""
    bf = lambda t: t.bfloat16().float()  # noqa: E731
    dq = ([], [])
    acc = {x: [torch.zeros_like(k0), torch.zeros_like(k0)] for x in ("dK", "dV")}  # ref, naive
    for x, (q0, do0) in enumerate(heads):
        s = (q0 @ k0.T) * tau
        dmod = None
        if cap:
            s = cap * torch.tanh(s / cap)
            dmod = 1.0 - (s / cap) ** 2
        if keep is not None:
            s = s.masked_fill(~keep, float("-inf"))
        if sinks is not None:
            s = torch.cat([s, sinks[x].float().expand(s.shape[0], 1)], dim=1)
        p = torch.softmax(s, -1)
        s = None
        if sinks is not None:
            p = p[:, :-1]
        for which, pp in ((0, p), (1, bf(p))):
            o0 = pp @ v0
            if which:
                o0 = bf(o0)
            dp = do0 @ v0.T
            ds = pp * (dp - (do0 * o0).sum(-1, keepdim=True))
            dp = None
            if dmod is not None:
                ds = ds * dmod
            if which:
                ds = bf(ds)
            dq0 = tau * ds @ k0
            acc["dK"][which] += tau * ds.T @ q0
            acc["dV"][which] += pp.T @ do0
            ds = None
            dq[which].append(bf(dq0) if which else dq0)
        p = dmod = None
    return ((dq[0], acc["dK"][0], acc["dV"][0]), (dq[1], bf(acc["dK"][1]), bf(acc["dV"][1])))


class Peers:
    def __init__(self, repeats=20):
        self.repeats = repeats
        self.avail, self.versions = {}, {}
        self.torch = None
        self.compile_s = {}
        self.calls = []  # {peer, what, first_s, check_s, timed_s}: where the peers' time goes
        t_import = time.time()
        try:
            import torch
        except Exception as e:  # no PyTorch: every peer is a column that says so
            for p in PEER_LABEL:
                self.avail[p] = "PyTorch not importable (%s)" % e.__class__.__name__
            return
        if not torch.cuda.is_available():
            for p in PEER_LABEL:
                self.avail[p] = "PyTorch sees no CUDA device"
            return
        self.torch = torch
        self.init_s = {"import torch": round(time.time() - t_import, 2)}
        self.versions["torch"] = torch.__version__
        self.versions["cudnn"] = str(torch.backends.cudnn.version())
        self.timer = PeerTimer(torch, repeats=repeats)
        for p in ("sdpa_cudnn", "sdpa_flash", "sdpa_efficient", "torch_softmax"):
            self.avail[p] = None
        self.init_s["cuda and cudnn"] = round(time.time() - t_import, 2)
        try:
            from torch.nn.attention.flex_attention import create_block_mask, flex_attention
            # one compile per shape (dynamic=False); a sweep has more shapes than dynamo's default
            # recompile limit (8), past which it would silently run FlexAttention unfused
            import torch._dynamo
            for knob in ("cache_size_limit", "recompile_limit", "accumulated_cache_size_limit",
                         "accumulated_recompile_limit"):
                if hasattr(torch._dynamo.config, knob):
                    setattr(torch._dynamo.config, knob, max(256, getattr(torch._dynamo.config, knob)))
            self._flex = torch.compile(flex_attention, dynamic=False)
            self.init_s["flex"] = round(time.time() - t_import, 2)
            self._block_mask = create_block_mask
            self.avail["flex"] = None
        except Exception as e:
            self.avail["flex"] = "FlexAttention not importable: " + _first_line(e)
        # cuDNN's FP8 attention (peer_cudnn_fp8.py): its frontend is imported when the peer first runs
        # (load_cudnn_fp8), so that a run without it never loads the wheel
        self.avail["cudnn_fp8"] = None
        self._cudnn = None
        try:
            from flash_attn.cute import flash_attn_func
            self._fa4 = flash_attn_func
            self.avail["fa4"] = None
            try:
                import importlib.metadata as md
                self.versions["fa4"] = md.version("flash-attn-4")
            except Exception:
                self.versions["fa4"] = "flash_attn.cute"
        except Exception as e:
            self.avail["fa4"] = "flash-attn-4 not importable (" + _first_line(e) + ")"
        self.import_s = time.time() - t_import
        if self.torch is not None:
            self.init_s["fa4"] = round(self.import_s, 2)

    # ------------------------------------------------------------------ timing
    def _time(self, fn):
        return self.timer(fn)

    def done(self):
        if self.torch is not None:
            self.torch.cuda.empty_cache()

    # ------------------------------------------------------------------ attention
    def _call(self, peer, q, k, v, causal, gqa=False):
        """The peer's forward on q [B, H, N, d] (SDPA, Flex) or [B, N, H, d] (FA4)."""
        torch = self.torch
        F = torch.nn.functional
        from torch.nn.attention import SDPBackend, sdpa_kernel
        if peer.startswith("sdpa_"):
            be = {"sdpa_cudnn": SDPBackend.CUDNN_ATTENTION, "sdpa_flash": SDPBackend.FLASH_ATTENTION,
                  "sdpa_efficient": SDPBackend.EFFICIENT_ATTENTION}[peer]
            kw = {"enable_gqa": True} if gqa else {}

            def f():
                with sdpa_kernel([be]):
                    return F.scaled_dot_product_attention(q, k, v, is_causal=causal, **kw)
            return f
        if peer == "flex":
            n, nk = q.shape[2], k.shape[2]
            bm = None
            if causal:
                off = nk - n
                bm = self._block_mask(lambda b, h, qi, ki: qi + off >= ki, None, None, n, nk, device="cuda")
            kw = {"enable_gqa": True} if gqa else {}
            return lambda: self._flex(q, k, v, block_mask=bm, **kw)
        if peer == "fa4":
            def f():
                o = self._fa4(q, k, v, causal=causal)
                return o[0] if isinstance(o, tuple) else o
            return f
        raise KeyError(peer)

    def _rows_fwd(self, q, k, v, pairs, rows, causal, bnhd):
        """Per sampled (batch, head) pair: (fp32 reference O rows, plain bf16 O rows), [rows, d]."""
        torch = self.torch
        h, hkv = (q.shape[2], k.shape[2]) if bnhd else (q.shape[1], k.shape[1])
        n, nk = (q.shape[1], k.shape[1]) if bnhd else (q.shape[2], k.shape[2])
        idx = torch.tensor(rows, device=q.device)
        out = []
        for b, hh in pairs:
            kh = hh // (h // hkv)
            sl = (lambda t, x: t[b, :, x]) if bnhd else (lambda t, x: t[b, x])
            q0, k0, v0 = sl(q, hh)[idx].float(), sl(k, kh).float(), sl(v, kh).float()
            s = (q0 @ k0.T) * (q0.shape[-1] ** -0.5)
            if causal:
                j = torch.arange(nk, device=s.device)[None, :]
                s = s.masked_fill(j > idx[:, None] + (nk - n), float("-inf"))
            p = torch.softmax(s, -1)
            ref = p @ v0
            naive = (p.bfloat16().float() @ v0).bfloat16().float()
            out.append((ref, naive))
        return out

    def _judge_fwd(self, o, q, k, v, causal, bnhd):
        """The forward check of the module docstring; (max abs error, failure text or None)."""
        b, h = (q.shape[0], q.shape[2]) if bnhd else (q.shape[0], q.shape[1])
        n = q.shape[1] if bnhd else q.shape[2]
        pairs, rows = sample_pairs(b, h), sample_rows(n)
        idx = self.torch.tensor(rows, device=q.device)
        got, refs, naives = [], [], []
        for (bb, hh), (ref, naive) in zip(pairs, self._rows_fwd(q, k, v, pairs, rows, causal, bnhd)):
            got.append((o[bb, :, hh] if bnhd else o[bb, hh])[idx].float())
            refs.append(ref)
            naives.append(naive)
        return judge_tensors(self.torch, "O", got, refs, naives, "%d rows in %d (batch, head) pairs" % (len(rows), len(pairs)))

    def _check_backward(self, q, k, v, o, do, causal, bnhd):
        """dQ, dK, dV of the first and the last KV group (every query head of the group) against
        an fp32 computation, judged like the forward against a plain bf16 one; None when they pass."""
        torch = self.torch
        dq, dk, dv = torch.autograd.grad(o, (q, k, v), do, retain_graph=True)
        b, h = (q.shape[0], q.shape[2]) if bnhd else (q.shape[0], q.shape[1])
        hkv = k.shape[2] if bnhd else k.shape[1]
        n, nk = (q.shape[1], k.shape[1]) if bnhd else (q.shape[2], k.shape[2])
        grp = h // hkv
        sl = (lambda t, bb, x: t[bb, :, x]) if bnhd else (lambda t, bb, x: t[bb, x])
        tau = q.shape[-1] ** -0.5
        groups = sorted({(0, 0), (b - 1, hkv - 1)})
        got = {"dQ": [], "dK": [], "dV": []}
        refs = {"dQ": [], "dK": [], "dV": []}
        naives = {"dQ": [], "dK": [], "dV": []}
        keep = None
        if causal:
            i = torch.arange(n, device=q.device)[:, None]
            j = torch.arange(nk, device=q.device)[None, :]
            keep = j <= i + (nk - n)
        for bb, kh in groups:
            k0, v0 = sl(k, bb, kh).detach().float(), sl(v, bb, kh).detach().float()
            hs = range(kh * grp, (kh + 1) * grp)
            ref, naive = group_grads(torch, k0, v0, [(sl(q, bb, hh).detach().float(), sl(do, bb, hh).float())
                                                     for hh in hs], tau, keep)
            refs["dQ"] += ref[0]
            naives["dQ"] += naive[0]
            got["dQ"] += [sl(dq, bb, hh).float() for hh in hs]
            for x, i_, t in (("dK", 1, dk), ("dV", 2, dv)):
                refs[x].append(ref[i_])
                naives[x].append(naive[i_])
                got[x].append(sl(t, bb, kh).float())
        for name in ("dQ", "dK", "dV"):
            _, bad = judge_tensors(torch, name, got[name], refs[name], naives[name],
                                   "KV groups %s, every row" % ", ".join("(%d, %d)" % g for g in groups), per_row=False)
            if bad:
                return bad
        return None

    def attention(self, peer, b, h, hkv, n, nk, d, causal, backward=False):
        """One peer on one shape: a row fragment {status, time_ms, tflops, max_abs_err, note}."""
        why = self.avail.get(peer, "unknown peer")
        if why:
            return {"status": "unsupported", "note": why}
        if peer == "cudnn_fp8":
            if backward:
                return {"status": "unsupported", "note": "cuDNN FP8: the bench runs its forward only"}
            why = self.load_cudnn_fp8()
            if why:
                return {"status": "unsupported", "note": why}
            return self.attention_fp8(b, h, hkv, n, nk, d, causal)
        torch = self.torch
        bnhd = peer == "fa4"
        g = torch.Generator(device="cuda").manual_seed(0)

        def t(heads, length):
            shape = (b, length, heads, d) if bnhd else (b, heads, length, d)
            return torch.randn(*shape, device="cuda", dtype=torch.bfloat16, generator=g).requires_grad_(backward)
        out = {}
        q = k = v = o = None
        try:
            try:  # the peer itself: a refusal here is "unsupported"
                q, k, v = t(h, n), t(hkv, nk), t(hkv, nk)
                fwd = self._call(peer, q, k, v, causal, gqa=hkv != h)
                t0 = time.time()
                o = fwd()
                torch.cuda.synchronize()
            except Exception as e:
                return failure(e, peer_refused(e))
            t_first = time.time()
            if peer in ("flex", "fa4"):
                self.compile_s[peer] = self.compile_s.get(peer, 0.0) + t_first - t0
            call = {"peer": peer, "what": "%s B=%d H=%d/%d N=%d/%d d=%d%s" % (
                "bwd" if backward else "fwd", b, h, hkv, n, nk, d, " causal" if causal else ""),
                "first_s": round(t_first - t0, 2)}
            self.calls.append(call)
            if not torch.isfinite(o).all():
                return {"status": "failed", "note": "non-finite output"}
            err, bad = self._judge_fwd(o.detach(), q.detach(), k.detach(), v.detach(), causal, bnhd)
            out["max_abs_err"] = err
            if bad:
                return {"status": "failed", "max_abs_err": err, "note": bad}
            if backward:
                do = torch.randn_like(o)
                bad = self._check_backward(q, k, v, o, do, causal, bnhd)
                if bad:
                    return {"status": "failed", "max_abs_err": err, "note": bad}
                t_check = time.time()
                # the backward alone, as the chapters time theirs: the graph of one forward, kept
                ms = self._time(lambda: torch.autograd.grad(o, (q, k, v), do, retain_graph=True))
                out["note"] = ("O: sampled rows of several (batch, head) pairs; dQ, dK, dV: the first and last "
                               "KV groups; checked against fp32 (bench_peers.py); backward timed alone")
            else:
                t_check = time.time()
                ms = self._time(fwd)
                out["note"] = "sampled rows of several (batch, head) pairs checked against fp32 (bench_peers.py)"
            call["check_s"] = round(t_check - t_first, 2)
            call["timed_s"] = round(time.time() - t_check, 2)
        except Exception as e:  # the check or the timing: out of memory is the peer's; the rest is ours
            return failure(e, "OutOfMemory" in type(e).__name__)
        finally:
            q = k = v = o = None
            self.done()
        fl = attention_flops(b, h, n, nk, d, causal, backward)
        out.update({"status": "ok", "time_ms": ms, "tflops": fl / (ms * 1e-3) / 1e12, "flops": fl})
        return out

    def load_cudnn_fp8(self):
        """Imports the cuDNN frontend on PyTorch's cuDNN, once; the reason it is not importable, or None.
        The peer's status and the run's peer versions say what happened."""
        if self._cudnn is None and not self.avail.get("cudnn_fp8"):
            t0 = time.time()
            try:
                import peer_cudnn_fp8
                self._cudnn, info = peer_cudnn_fp8.load(self.torch)
                self.versions["cudnn_frontend"] = info["frontend"]
                self.versions["cudnn_frontend_backend"] = info["backend"]
            except Exception as e:
                self.avail["cudnn_fp8"] = _first_line(e) if isinstance(e, ImportError) else \
                    "nvidia-cudnn-frontend not importable (" + _first_line(e) + ")"
            self.init_s["cudnn_fp8"] = round(time.time() - t0, 2)
        return self.avail.get("cudnn_fp8")

    def attention_fp8(self, b, h, hkv, n, nk, d, causal):
        """cuDNN's FP8 forward (peer_cudnn_fp8.py) on one shape: the same bf16 randn inputs as the other
        peers, each of Q, K, V quantised to E4M3 with one scale (Q and K Hadamard-rotated first, as
        chapter 05's preparation pass does), checked against fp32 with the plain FP8 computation as the
        yardstick, then the attention alone timed (the quantisation is not in the time)."""
        import peer_cudnn_fp8 as P
        torch = self.torch
        g = torch.Generator(device="cuda").manual_seed(0)

        def t(heads, length):
            return torch.randn(b, heads, length, d, device="cuda", dtype=torch.bfloat16, generator=g)
        q = k = v = f = o = peer = None
        out = {}
        try:
            try:  # the peer itself: a graph cuDNN does not build, or an execute it refuses, is "unsupported"
                q, k, v = t(h, n), t(hkv, nk), t(hkv, nk)
                f = P.fp8_inputs(torch, q, k, v)
                t0 = time.time()
                peer = P.CudnnFp8(torch, self._cudnn, b, h, hkv, n, nk, d, causal)
                o, _ = peer.run(f)
            except Exception as e:
                return failure(e, isinstance(e, NotImplementedError) or peer_refused(e))
            t_first = time.time()
            call = {"peer": "cudnn_fp8", "what": "fwd B=%d H=%d/%d N=%d/%d d=%d%s" % (
                b, h, hkv, n, nk, d, " causal" if causal else ""), "first_s": round(t_first - t0, 2)}
            self.calls.append(call)
            if not torch.isfinite(o).all():
                return {"status": "failed", "note": "non-finite output (%s)" % peer.note()}
            err, bad, det = P.check(torch, o, q, k, v, f, causal, peer.out, peer.scale_o)
            out["max_abs_err"] = err
            if bad:
                return {"status": "failed", "max_abs_err": err, "note": bad}
            t_check = time.time()
            ms = self._time(peer.fn(f))
            call["check_s"] = round(t_check - t_first, 2)
            call["timed_s"] = round(time.time() - t_check, 2)
            out["note"] = peer.note(f["rotated"]) + "; " + det["checked"]
        except Exception as e:  # the check or the timing: out of memory is the peer's; the rest is ours
            return failure(e, "OutOfMemory" in type(e).__name__)
        finally:
            if peer is not None:
                peer.close()
            q = k = v = f = o = peer = None
            self.done()
        fl = attention_flops(b, h, n, nk, d, causal)
        out.update({"status": "ok", "time_ms": ms, "tflops": fl / (ms * 1e-3) / 1e12, "flops": fl})
        return out

    # ------------------------------------------------------------------ decode
    def decode(self, peer, b, hq, hkv, length, d, kv_bytes):
        why = self.avail.get(peer, "unknown peer")
        if why:
            return {"status": "unsupported", "note": why}
        torch = self.torch
        bnhd = peer == "fa4"
        q = k = v = o = None
        try:
            try:  # the peer itself: a refusal here is "unsupported"
                if bnhd:
                    q = torch.randn(b, 1, hq, d, device="cuda", dtype=torch.bfloat16)
                    k = torch.randn(b, length, hkv, d, device="cuda", dtype=torch.bfloat16)
                else:
                    q = torch.randn(b, hq, 1, d, device="cuda", dtype=torch.bfloat16)
                    k = torch.randn(b, hkv, length, d, device="cuda", dtype=torch.bfloat16)
                v = torch.randn_like(k)
                fwd = self._call(peer, q, k, v, False, gqa=hq != hkv)
                t0 = time.time()
                o = fwd()
                torch.cuda.synchronize()
            except Exception as e:
                return failure(e, peer_refused(e))
            call = {"peer": peer, "what": "decode B=%d H=%d/%d L=%d d=%d" % (b, hq, hkv, length, d),
                    "first_s": round(time.time() - t0, 2)}
            self.calls.append(call)
            if not torch.isfinite(o).all():
                return {"status": "failed", "note": "non-finite output"}
            err, bad = self._judge_fwd(o, q, k, v, False, bnhd)
            if bad:
                return {"status": "failed", "max_abs_err": err, "note": bad}
            t1 = time.time()
            ms = self._time(fwd)
            call["timed_s"] = round(time.time() - t1, 2)
        except Exception as e:
            return failure(e, "OutOfMemory" in type(e).__name__)
        finally:
            q = k = v = o = None
            self.done()
        return {"status": "ok", "time_ms": ms, "gbps": kv_bytes / (ms * 1e-3) / 1e9, "max_abs_err": err,
                "note": "K/V contiguous bf16, values from randn; several (batch, head) pairs checked against fp32"}

    # ------------------------------------------------------------------ softmax
    def softmax(self, rows, n, bytes_moved):
        why = self.avail.get("torch_softmax")
        if why:
            return {"status": "unsupported", "note": why}
        torch = self.torch
        try:
            s = torch.randn(rows, n, device="cuda", dtype=torch.float32)
            fn = lambda: torch.softmax(s, -1)  # noqa: E731
            p = fn()
            # sampled rows against fp64, judged by the rule against a plain fp32 computation
            idx = torch.tensor(sample_rows(rows), device="cuda")
            x = s[idx]
            ref = torch.softmax(x.double(), -1)
            e = torch.exp(x - x.max(-1, keepdim=True).values)
            plain = (e / e.sum(-1, keepdim=True)).double()
            got = p[idx].double()
            err_rows = (got - ref).abs().max(-1).values.tolist()
            naive_rows = (plain - ref).abs().max(-1).values.tolist()
            scale = ref.abs().max(-1).values.tolist()
            margin, bad = judge_rows("P", err_rows, naive_rows, scale,
                                     torch.linalg.vector_norm(got - ref).item(),
                                     torch.linalg.vector_norm(plain - ref).item(), n, u=64 * 2.0 ** -24)
            err = max(err_rows)
            if bad:
                return {"status": "failed", "max_abs_err": err, "note": bad}
            ms = self._time(fn)
        except Exception as e:
            return failure(e, peer_refused(e))
        finally:
            s = p = None
            self.done()
        return {"status": "ok", "time_ms": ms, "gbps": bytes_moved / (ms * 1e-3) / 1e9, "max_abs_err": err,
                "note": "fp32 S read once, P written once; %d sampled rows checked against fp64" % len(err_rows)}
