"""The peers, timed in the same process and the same way as the chapter binaries time ours.

Each peer is a callable on a shape; `Peers.run()` checks its output against an fp32
computation of one (batch, head) slice first, then times it with peer_timer.PeerTimer: 3
warm-ups, an L2 flush that leaves the cache clean before every repeat, CUDA events, the median.

A peer that cannot be imported, has no kernel for a shape or does not compile is a
row with status "unsupported" and the reason; it never stops the run.
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

    def _reference_slice(self, q, k, v, causal, layout_bnhd):
        """fp32 attention of batch 0, head 0 (and its KV head), as [N, d]."""
        torch = self.torch
        if layout_bnhd:
            q0, k0, v0 = q[0, :, 0].float(), k[0, :, 0].float(), v[0, :, 0].float()
        else:
            q0, k0, v0 = q[0, 0].float(), k[0, 0].float(), v[0, 0].float()
        s = (q0 @ k0.T) * (q0.shape[-1] ** -0.5)
        if causal:
            n, nk = s.shape
            i = torch.arange(n, device=s.device)[:, None]
            j = torch.arange(nk, device=s.device)[None, :]
            s = s.masked_fill(j > i + (nk - n), float("-inf"))
        return torch.softmax(s, -1) @ v0

    def _check_backward(self, q, k, v, o, do, causal, bnhd):
        """dQ, dK, dV of batch 0, head 0 against fp32 autograd; None when they agree."""
        torch = self.torch
        dq, dk, dv = torch.autograd.grad(o, (q, k, v), do, retain_graph=True)
        sl = (lambda t: t[0, :, 0]) if bnhd else (lambda t: t[0, 0])
        q0, k0, v0 = (sl(t).detach().float().requires_grad_(True) for t in (q, k, v))
        s = (q0 @ k0.T) * (q0.shape[-1] ** -0.5)
        if causal:
            n, nk = s.shape
            i = torch.arange(n, device=s.device)[:, None]
            j = torch.arange(nk, device=s.device)[None, :]
            s = s.masked_fill(j > i + (nk - n), float("-inf"))
        o0 = torch.softmax(s, -1) @ v0
        rq, rk, rv = torch.autograd.grad(o0, (q0, k0, v0), sl(do).float())
        checks = (("dQ", dq, rq), ("dK", dk, rk), ("dV", dv, rv))
        if k.shape != q.shape:  # GQA: KV head 0 also gets the gradients of the other heads of its group
            checks = checks[:1]
        for name, got, ref in checks:
            err = (sl(got).float() - ref).abs().max().item()
            tol = 5e-2 * max(1.0, ref.abs().max().item())
            if not err <= tol:
                return "%s of batch 0, head 0 differs from fp32 by %.3g (> %.3g)" % (name, err, tol)
        return None

    def attention(self, peer, b, h, hkv, n, nk, d, causal, backward=False):
        """One peer on one shape: a row fragment {status, time_ms, tflops, max_abs_err, note}."""
        why = self.avail.get(peer, "unknown peer")
        if why:
            return {"status": "unsupported", "note": why}
        torch = self.torch
        bnhd = peer == "fa4"
        g = torch.Generator(device="cuda").manual_seed(0)

        def t(heads, length):
            shape = (b, length, heads, d) if bnhd else (b, heads, length, d)
            return torch.randn(*shape, device="cuda", dtype=torch.bfloat16, generator=g).requires_grad_(backward)
        out = {}
        try:
            q, k, v = t(h, n), t(hkv, nk), t(hkv, nk)
            fwd = self._call(peer, q, k, v, causal, gqa=hkv != h)
            t0 = time.time()
            o = fwd()
            torch.cuda.synchronize()
            t_first = time.time()
            if peer in ("flex", "fa4"):
                self.compile_s[peer] = self.compile_s.get(peer, 0.0) + t_first - t0
            call = {"peer": peer, "what": "%s B=%d H=%d/%d N=%d/%d d=%d%s" % (
                "bwd" if backward else "fwd", b, h, hkv, n, nk, d, " causal" if causal else ""),
                "first_s": round(t_first - t0, 2)}
            self.calls.append(call)
            if not torch.isfinite(o).all():
                return {"status": "failed", "note": "non-finite output"}
            o0 = o[0, :, 0] if bnhd else o[0, 0]
            ref = self._reference_slice(q.detach(), k.detach(), v.detach(), causal, bnhd)
            err = (o0.float() - ref).abs().max().item()
            tol = 2e-2 * max(1.0, ref.abs().max().item())
            out["max_abs_err"] = err
            if not err <= tol:
                return {"status": "failed", "max_abs_err": err,
                        "note": "batch 0, head 0 differs from fp32 by %.3g (> %.3g)" % (err, tol)}
            if backward:
                do = torch.randn_like(o)
                bad = self._check_backward(q, k, v, o, do, causal, bnhd)
                if bad:
                    return {"status": "failed", "max_abs_err": err, "note": bad}
                t_check = time.time()
                # the backward alone, as the chapters time theirs: the graph of one forward, kept
                ms = self._time(lambda: torch.autograd.grad(o, (q, k, v), do, retain_graph=True))
                out["note"] = "batch 0, head 0 of O, dQ, dK, dV checked against fp32; backward timed alone"
            else:
                t_check = time.time()
                ms = self._time(fwd)
                out["note"] = "batch 0, head 0 checked against fp32"
            call["check_s"] = round(t_check - t_first, 2)
            call["timed_s"] = round(time.time() - t_check, 2)
        except Exception as e:  # no kernel for this shape, compile failure, out of memory
            return {"status": "unsupported", "note": _first_line(e)}
        finally:
            q = k = v = o = None
            self.done()
        fl = attention_flops(b, h, n, nk, d, causal, backward)
        out.update({"status": "ok", "time_ms": ms, "tflops": fl / (ms * 1e-3) / 1e12, "flops": fl})
        return out

    # ------------------------------------------------------------------ decode
    def decode(self, peer, b, hq, hkv, length, d, kv_bytes):
        why = self.avail.get(peer, "unknown peer")
        if why:
            return {"status": "unsupported", "note": why}
        torch = self.torch
        bnhd = peer == "fa4"
        try:
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
            call = {"peer": peer, "what": "decode B=%d H=%d/%d L=%d d=%d" % (b, hq, hkv, length, d),
                    "first_s": round(time.time() - t0, 2)}
            self.calls.append(call)
            if not torch.isfinite(o).all():
                return {"status": "failed", "note": "non-finite output"}
            o0 = o[0, :, 0] if bnhd else o[0, 0]
            ref = self._reference_slice(q, k, v, False, bnhd)
            err = (o0.float() - ref).abs().max().item()
            tol = 2e-2 * max(1.0, ref.abs().max().item())
            if not err <= tol:
                return {"status": "failed", "max_abs_err": err,
                        "note": "batch 0, head 0 differs from fp32 by %.3g (> %.3g)" % (err, tol)}
            t1 = time.time()
            ms = self._time(fwd)
            call["timed_s"] = round(time.time() - t1, 2)
        except Exception as e:
            return {"status": "unsupported", "note": _first_line(e)}
        finally:
            q = k = v = o = None
            self.done()
        return {"status": "ok", "time_ms": ms, "gbps": kv_bytes / (ms * 1e-3) / 1e9, "max_abs_err": err,
                "note": "K/V contiguous bf16, values from randn; batch 0, head 0 checked against fp32"}

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
            err = (p.double().sum(-1) - 1).abs().max().item()
            if not err < 1e-4:
                return {"status": "failed", "note": "rows do not sum to 1 (%.3g)" % err}
            ms = self._time(fn)
        except Exception as e:
            return {"status": "unsupported", "note": _first_line(e)}
        finally:
            s = p = None
            self.done()
        return {"status": "ok", "time_ms": ms, "gbps": bytes_moved / (ms * 1e-3) / 1e9,
                "note": "fp32 S read once, P written once"}
