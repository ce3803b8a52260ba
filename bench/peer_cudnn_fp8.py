#!/usr/bin/env python3
"""cuDNN's FP8 attention forward (`sdpa_fp8`) as a peer of chapter 05's FP8 kernels.

    python3 bench/peer_cudnn_fp8.py --selftest          one small shape: build, run, check, time
    python3 bench/peer_cudnn_fp8.py --selftest --batch 2 --heads 16 --n 8192 --d 128 --causal
    python3 bench/peer_cudnn_fp8.py --selftest --api backend     the cuDNN C++ graph, not pygraph

It is reached through the nvidia-cudnn-frontend wheel (bench/cudnn_fp8_wheel.sh brings it to a
machine without network) and runs on the cuDNN that PyTorch ships: PyTorch is imported first,
the directory of the libcudnn.so it loaded goes to the front of LD_LIBRARY_PATH, and the
frontend, which looks there first, opens that same library (`load()`). The run's note names
both versions.

What cuDNN is given. Q, K, V are bf16 from randn, [B, H, N, d] contiguous, as every peer gets
them. Q and K are rotated by H / sqrt(d) (H the Sylvester-Hadamard matrix: Q K^T is unchanged),
as chapter 05's preparation pass rotates them, and each of Q, K, V is quantised to E4M3 with one
scale, s = amax / 448 (`quantize()`): cuDNN's descale is one number per tensor, where our
kernel has one per 64 rows of Q and K and one per channel of V. P is scaled onto E4M3's range by
scale_s = 448 (descale_s = 1 / 448), cuDNN's recipe for E4M3 without dropout. O is bf16, as
ours (fp16, then E4M3 with scale_o, where a cuDNN build has no bf16 output: the note says which
ran), with the LSE ("Stats") written, as ours writes it.

What is timed: the graph's execute() alone, on FP8 Q, K, V already in memory. The rotation and
quantisation are not in it, so the time is comparable with our FP8 kernel's time *without* its
preparation pass (the "kernel alone" column of chapter 05's tables), not with the time that
includes it.

The check, before any timing (`check()`): O of sampled rows of several (batch, head) pairs
against fp32 attention on the original bf16 inputs, by the rule of common/compare.hpp with the
plain FP8 computation as the yardstick, as chapter 05's Fp8Oracle judges our FP8 kernels: the
same E4M3 Q, K, V and scales, fp32 scores, P rounded to E4M3 as cuDNN scales it, O rounded to
the output's dtype.

A shape cuDNN has no kernel for (the graph does not build or check_support declines) raises
Fp8Unsupported, a NotImplementedError: the bench's cell says "n/a" with cuDNN's reason.

Debugging: --selftest names the stage that failed and prints its traceback and every graph
cuDNN declined; CUDNN_FRONTEND_LOG_INFO=1 CUDNN_FRONTEND_LOG_FILE=stderr (and the backend's
CUDNN_LOGLEVEL_DBG=2 CUDNN_LOGDEST_DBG=stderr) show what the frontend and cuDNN decided;
--api backend (or CUDNN_FP8_PEER_API=backend in the bench) skips pygraph's planner.
"""
import argparse
import os
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

E4M3_MAX = 448.0
# tensor uids of the graph (variant packs are keyed by them, in both graph APIs)
UID = {"q": 1, "k": 2, "v": 3, "o": 4, "stats": 5, "amax_o": 6, "amax_s": 7,
       "descale_q": 10, "descale_k": 11, "descale_v": 12, "descale_s": 13, "scale_s": 14, "scale_o": 15}


class Fp8Unsupported(NotImplementedError):
    """cuDNN has no FP8 kernel for this shape (its reason is the message)."""


def first_line(e):
    s = ("%s: %s" % (type(e).__name__, e)).strip()
    return (s.splitlines() or ["?"])[0][:200]


# ============================================================================ loading

def torch_libcudnn():
    """The path of the libcudnn.so PyTorch has loaded into this process (from /proc/self/maps), or None."""
    try:
        with open("/proc/self/maps") as f:
            for line in f:
                path = line.split()[-1] if "/" in line else ""
                if os.path.basename(path).startswith("libcudnn.so"):
                    return path
    except OSError:
        pass
    return None


def load(torch):
    """Imports the frontend on PyTorch's cuDNN. Returns (cudnn module, info dict). Raises ImportError
    (with the reason) when the wheel is not importable."""
    info = {"torch_cudnn": str(torch.backends.cudnn.version())}  # loads PyTorch's libcudnn if not yet
    lib = torch_libcudnn()
    info["libcudnn"] = lib or "not found in this process"
    old = os.environ.get("LD_LIBRARY_PATH")
    if lib and "cudnn" not in sys.modules:
        # the frontend dlopens libcudnn.so.9 from LD_LIBRARY_PATH's directories first (cudnn/__init__.py);
        # put back as it was after the import (the chapter binaries the bench starts inherit it)
        os.environ["LD_LIBRARY_PATH"] = os.path.dirname(lib) + (":" + old if old else "")
    try:
        import cudnn
    except Exception as e:  # noqa: BLE001 -- any failure of the import is "not importable"
        raise ImportError("nvidia-cudnn-frontend not importable (%s)" % first_line(e))
    finally:
        if old is None:
            os.environ.pop("LD_LIBRARY_PATH", None)
        else:
            os.environ["LD_LIBRARY_PATH"] = old
    info["frontend"] = getattr(cudnn, "__version__", "?")
    try:
        info["backend"] = str(cudnn.backend_version())
    except Exception as e:  # noqa: BLE001
        info["backend"] = "unknown (%s)" % first_line(e)
    return cudnn, info


# ============================================================================ inputs

def hadamard(torch, d, device):
    """H / sqrt(d), H the d x d Sylvester-Hadamard matrix (symmetric, orthogonal after the scaling)."""
    if d & (d - 1):
        raise ValueError("the Hadamard rotation needs a power-of-two head dim, not %d" % d)
    h = torch.ones(1, 1, dtype=torch.float32)
    while h.shape[0] < d:
        h = torch.cat([torch.cat([h, h], 1), torch.cat([h, -h], 1)], 0)
    return (h / d ** 0.5).to(device)


def quantize(torch, x, rotate=None):
    """x (any float dtype) -> (E4M3 tensor, its scale s as a float): x8 = e4m3(x / s), s = amax / 448
    over the whole tensor; with `rotate` (a d x d matrix) x @ rotate is quantised instead."""
    xf = x.float()
    if rotate is not None:
        xf = xf @ rotate
    amax = xf.abs().max().item()
    s = amax / E4M3_MAX if amax > 0 else 1.0
    # clamped first: PyTorch's conversion does not saturate (past 464 it gives NaN)
    return (xf / s).clamp(-E4M3_MAX, E4M3_MAX).to(torch.float8_e4m3fn), s


def fp8_inputs(torch, q, k, v, rotate=True):
    """Per-tensor E4M3 copies of bf16 q, k, v ([B, H, N, d]): {"q8", "k8", "v8", "sq", "sk", "sv", "rotated"}."""
    d = q.shape[-1]
    rot = hadamard(torch, d, q.device) if rotate else None
    q8, sq = quantize(torch, q, rot)
    k8, sk = quantize(torch, k, rot)
    v8, sv = quantize(torch, v)
    return {"q8": q8, "k8": k8, "v8": v8, "sq": sq, "sk": sk, "sv": sv, "rotated": rotate}


# ============================================================================ the graph

OUT_DTYPES = ("bf16", "fp16", "fp8")


class CudnnFp8:
    """cuDNN's sdpa_fp8 forward on one shape: `CudnnFp8(torch, cudnn, b, h, hkv, n, nk, d, causal)`
    builds the graph (trying bf16 O, then fp16, then E4M3), `run(f, o)` executes it on fp8_inputs()
    `f` (returns O and the LSE), `fn(f)` gives the callable that is timed."""

    def __init__(self, torch, cudnn, b, h, hkv, n, nk, d, causal, api=None, out_dtypes=OUT_DTYPES, device="cuda"):
        self.torch, self.cudnn, self.device = torch, cudnn, device  # device: "cpu" only for the tests' stand-in
        self.shape = (b, h, hkv, n, nk, d, causal)
        self.api = api or os.environ.get("CUDNN_FP8_PEER_API", "pygraph")
        if self.api not in ("pygraph", "backend"):
            raise ValueError("api is pygraph or backend, not %r" % self.api)
        self.handle = cudnn.create_handle()
        if device == "cuda":
            cudnn.set_stream(self.handle, torch.cuda.current_stream().cuda_stream)  # PeerTimer's events' stream
        self.raw_handle = getattr(self.handle, "backend_handle", self.handle)
        tried = []
        for out in out_dtypes:
            for amax_s_out in (False, True):  # amax_s left virtual (1.32's advice), else declared
                try:
                    self.graph = self._build(out, amax_s_out)
                    self.out, self.amax_s_out = out, amax_s_out
                    self.plan = self._plan_name()
                    self.workspace = torch.empty(max(1, self.graph.get_workspace_size()), dtype=torch.uint8,
                                                 device=device)
                    self.tried = tried
                    return
                except Exception as e:  # noqa: BLE001 -- every decline is the next attempt's cue
                    tried.append("O %s%s: %s" % (out, ", amax_s output" if amax_s_out else "", first_line(e)))
        e = Fp8Unsupported("cuDNN sdpa_fp8 builds no graph for B=%d H=%d/%d N=%d/%d d=%d%s: %s" % (
            b, h, hkv, n, nk, d, " causal" if causal else "", tried[0] if tried else "?"))
        e.tried = tried
        raise e

    def close(self):
        """Gives the cuDNN handle back (the graph and its workspace go with the object)."""
        self.graph = self.workspace = None
        try:
            self.cudnn.destroy_handle(self.handle)
        except Exception:  # noqa: BLE001 -- an older frontend: the handle lives as long as the process
            pass

    def _dtype(self, name):
        dt = self.cudnn.data_type
        return {"bf16": dt.BFLOAT16, "fp16": dt.HALF, "fp8": dt.FP8_E4M3, "f32": dt.FLOAT}[name]

    def _build(self, out, amax_s_out):
        cudnn = self.cudnn
        b, h, hkv, n, nk, d, causal = self.shape
        kw = dict(io_data_type=self._dtype("fp8"), intermediate_data_type=self._dtype("f32"),
                  compute_data_type=self._dtype("f32"))
        if self.api == "pygraph":
            g = cudnn.pygraph(handle=self.handle, **kw)
        else:  # the C++ graph the frontend lowers to: cuDNN's own engines only
            g = cudnn._pybind_module.backend_graph(handle=self.raw_handle, **kw)
        f8, f32 = self._dtype("fp8"), self._dtype("f32")

        def t(name, dim, stride, dt):
            return g.tensor(uid=UID[name], dim=dim, stride=stride, data_type=dt, name=name)
        one = ((1, 1, 1, 1), (1, 1, 1, 1))
        q = t("q", (b, h, n, d), (h * n * d, n * d, d, 1), f8)
        k = t("k", (b, hkv, nk, d), (hkv * nk * d, nk * d, d, 1), f8)
        v = t("v", (b, hkv, nk, d), (hkv * nk * d, nk * d, d, 1), f8)
        sc = {s: t(s, one[0], one[1], f32) for s in ("descale_q", "descale_k", "descale_v", "descale_s", "scale_s",
                                                      "scale_o")}
        args = dict(q=q, k=k, v=v, generate_stats=True, attn_scale=d ** -0.5, **sc)
        if causal:  # bottom-right aligned as ours (the same as top-left where N = Nk)
            al = cudnn.diagonal_alignment
            args.update(diagonal_alignment=al.BOTTOM_RIGHT if n != nk else al.TOP_LEFT, right_bound=0)
        o, stats, amax_s, amax_o = g.sdpa_fp8(**args)
        o.set_uid(UID["o"]).set_output(True).set_dim((b, h, n, d)).set_stride(
            (h * n * d, n * d, d, 1)).set_data_type(self._dtype(out))
        stats.set_uid(UID["stats"]).set_output(True).set_dim((b, h, n, 1)).set_stride(
            (h * n, n, 1, 1)).set_data_type(f32)
        amax_o.set_uid(UID["amax_o"]).set_output(True).set_dim(one[0]).set_stride(one[1]).set_data_type(f32)
        if amax_s_out:
            amax_s.set_uid(UID["amax_s"]).set_output(True).set_dim(one[0]).set_stride(one[1]).set_data_type(f32)
        g.validate()
        g.build_operation_graph()
        g.create_execution_plans([cudnn.heur_mode.A, cudnn.heur_mode.FALLBACK])
        g.check_support()
        g.build_plans()
        return g

    def _plan_name(self):
        for ask in (lambda: self.graph.get_plan_name_at_index(0),
                    lambda: type(self.graph.selected_engine()).__name__):
            try:
                name = ask()
                if name and name != "NoneType":
                    return str(name)
            except Exception:  # noqa: BLE001
                pass
        return "?"

    def outputs(self):
        """Fresh O (poisoned with NaN where the dtype has one) and LSE buffers for run()."""
        torch = self.torch
        b, h, hkv, n, nk, d, causal = self.shape
        dt = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp8": torch.float8_e4m3fn}[self.out]
        o = torch.full((b, h, n, d), float("nan"), dtype=torch.float32, device=self.device).to(dt)
        stats = torch.full((b, h, n, 1), float("nan"), dtype=torch.float32, device=self.device)
        return o, stats

    def pack(self, f, o, stats):
        """The variant pack: uid -> tensor."""
        torch = self.torch

        def scalar(x):
            return torch.full((1, 1, 1, 1), float(x), dtype=torch.float32, device=self.device)
        self.scale_o = E4M3_MAX / max(f["sv"] * E4M3_MAX, 1e-30) if self.out == "fp8" else 1.0  # |O| <= max |V|
        vp = {UID["q"]: f["q8"], UID["k"]: f["k8"], UID["v"]: f["v8"], UID["o"]: o, UID["stats"]: stats,
              UID["descale_q"]: scalar(f["sq"]), UID["descale_k"]: scalar(f["sk"]), UID["descale_v"]: scalar(f["sv"]),
              UID["descale_s"]: scalar(1.0 / E4M3_MAX), UID["scale_s"]: scalar(E4M3_MAX),
              UID["scale_o"]: scalar(self.scale_o), UID["amax_o"]: scalar(0.0)}
        if self.amax_s_out:
            vp[UID["amax_s"]] = scalar(0.0)
        return vp

    def fn(self, f, o=None, stats=None):
        """The callable that is timed: one execute() of the graph on f's FP8 tensors."""
        if o is None:
            o, stats = self.outputs()
        vp = self.pack(f, o, stats)
        g, ws = self.graph, self.workspace
        if self.api == "pygraph":
            h = self.handle
            return lambda: g.execute(vp, ws, h)
        # the C++ graph takes device pointers (1.32: _execute(uid -> pointer, workspace pointer, handle));
        # vp keeps the tensors alive as long as the callable
        ptrs, wp, h = {u: t.data_ptr() for u, t in vp.items()}, ws.data_ptr(), self.raw_handle
        run = getattr(g, "execute", None) or (lambda _vp, _ws, _h: g._execute(ptrs, wp, _h))
        return lambda: run(vp, ws, h)

    def run(self, f):
        """Executes once: (O as fp32 [B, H, N, d], LSE [B, H, N] in natural log)."""
        o, stats = self.outputs()
        self.fn(f, o, stats)()
        if self.device == "cuda":
            self.torch.cuda.synchronize()
        of = o.float() / self.scale_o if self.out == "fp8" else o.float()
        return of, stats[..., 0]

    def note(self, rotated=True):
        s = "cuDNN sdpa_fp8 (%s, plan %s): E4M3 Q, K, V with one scale a tensor%s, O %s; time: the attention " \
            "alone, comparable with our FP8 kernel without its preparation pass" % (
                self.api, self.plan, " (Q, K Hadamard-rotated)" if rotated else "", self.out)
        if self.tried:
            s += "; declined first: " + "; ".join(self.tried)[:200]
        return s


# ============================================================================ the check

def check(torch, o, q, k, v, f, causal, out="bf16", scale_o=1.0):
    """O against fp32 attention on q, k, v (bf16, [B, H, N, d]) on sampled rows, judged by the rule of
    common/compare.hpp with the plain FP8 computation of `f` as the yardstick, its O rounded as cuDNN's
    (`out`: bf16, fp16, or fp8 = E4M3 of O * scale_o). (max abs error, failure text or None, details)."""
    from bench_peers import judge_rows, sample_pairs, sample_rows
    b, h, n, d = q.shape
    hkv, nk = k.shape[1], k.shape[2]
    pairs, rows = sample_pairs(b, h), sample_rows(n)
    idx = torch.tensor(rows, device=q.device)
    rot = hadamard(torch, d, q.device) if f["rotated"] else None
    tau = d ** -0.5
    odt = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp8": torch.float32}[out]
    err, naive, scale, l2e, l2n = [], [], [], 0.0, 0.0
    for bb, hh in pairs:
        kh = hh // (h // hkv)
        mask = None
        if causal:
            j = torch.arange(nk, device=q.device)[None, :]
            mask = j > idx[:, None] + (nk - n)
        # the reference: fp32 on the bf16 inputs
        q0, k0, v0 = q[bb, hh][idx].float(), k[bb, kh].float(), v[bb, kh].float()
        s = (q0 @ k0.T) * tau
        if mask is not None:
            s = s.masked_fill(mask, float("-inf"))
        ref = torch.softmax(s, -1) @ v0
        # the yardstick: the plain FP8 computation on the same E4M3 tensors
        q8, k8, v8 = f["q8"][bb, hh][idx].float(), f["k8"][bb, kh].float(), f["v8"][bb, kh].float()
        s8 = (q8 @ k8.T) * (f["sq"] * f["sk"] * tau)
        if mask is not None:
            s8 = s8.masked_fill(mask, float("-inf"))
        m = s8.amax(-1, keepdim=True)
        m = torch.where(torch.isfinite(m), m, torch.zeros_like(m))
        p = torch.exp(s8 - m)
        l = p.sum(-1, keepdim=True)
        p8 = (p * E4M3_MAX).clamp(max=E4M3_MAX).to(torch.float8_e4m3fn).float() / E4M3_MAX
        yard = (p8 @ v8) * f["sv"] / l.clamp(min=1e-30)
        if out == "fp8":
            yard = (yard * scale_o).clamp(-E4M3_MAX, E4M3_MAX).to(torch.float8_e4m3fn).float() / scale_o
        else:
            yard = yard.to(odt).float()
        got = o[bb, hh][idx].float()
        e, ne = (got - ref).abs(), (yard - ref).abs()
        err += e.amax(-1).tolist()
        naive += ne.amax(-1).tolist()
        scale += ref.abs().amax(-1).tolist()
        l2e += float(((got - ref) ** 2).sum())
        l2n += float(((yard - ref) ** 2).sum())
    if max(scale) > 0 and float(o.abs().max()) == 0:
        return 0.0, "O is all zeros", {}
    u = 2.0 ** -11 if out == "fp16" else 2.0 ** -8
    margin, bad = judge_rows("O", err, naive, scale, l2e ** 0.5, l2n ** 0.5, d, u=u, yardstick="plain FP8")
    what = "%d rows in %d (batch, head) pairs, against fp32; yardstick: plain FP8 (per-tensor E4M3)" % (
        len(rows), len(pairs))
    details = {"max_abs_err": max(err), "yardstick_max_abs_err": max(naive), "margin": margin, "checked": what}
    return max(err), (bad + " (%s)" % what) if bad else None, details


# ============================================================================ the self-test

def selftest(a):
    """Each stage says what it did; a failure names its stage and prints its traceback. Exit 0: passed;
    1: failed (or the frontend/PyTorch missing); 3: cuDNN builds no graph for the shape."""
    import traceback
    stage = ["import torch"]
    try:
        return _selftest(a, stage)
    except Exception as e:  # noqa: BLE001 -- a self-test reports, it does not crash
        traceback.print_exc()
        print("FAIL at %s: %s" % (stage[0], first_line(e)))
        return 1


def _selftest(a, stage):
    t0 = time.time()
    import torch
    print("torch %s, CUDA %s, device %s" % (torch.__version__, torch.version.cuda,
                                            torch.cuda.get_device_name() if torch.cuda.is_available() else "none"))
    if not torch.cuda.is_available():
        print("FAIL: PyTorch sees no CUDA device")
        return 1
    stage[0] = "loading the frontend on PyTorch's cuDNN (load())"
    cudnn, info = load(torch)
    print("cuDNN: PyTorch's %s (%s); frontend %s, its backend %s" % (
        info["torch_cudnn"], info["libcudnn"], info["frontend"], info["backend"]))
    if info["backend"] != info["torch_cudnn"]:
        print("note: the frontend's cuDNN (%s) is not PyTorch's (%s)" % (info["backend"], info["torch_cudnn"]))
    b, h, n, d, causal = a.batch, a.heads, a.n, a.d, a.causal
    g = torch.Generator(device="cuda").manual_seed(0)
    q, k, v = (torch.randn(b, h, n, d, device="cuda", dtype=torch.bfloat16, generator=g) for _ in range(3))
    f = fp8_inputs(torch, q, k, v, rotate=not a.no_hadamard)
    print("shape: B=%d H=%d N=%d d=%d%s; scales q %.4g k %.4g v %.4g" % (
        b, h, n, d, " causal" if causal else "", f["sq"], f["sk"], f["sv"]))
    t1 = time.time()
    stage[0] = "building the graph (CudnnFp8)"
    try:
        peer = CudnnFp8(torch, cudnn, b, h, h, n, n, d, causal, api=a.api)
    except Fp8Unsupported as e:
        print("UNSUPPORTED: %s" % e)
        for line in getattr(e, "tried", []):
            print("  declined: " + line)
        return 3
    for line in peer.tried:
        print("  declined before: " + line)
    print("graph built in %.2f s: %s" % (time.time() - t1, peer.note(f["rotated"])))
    stage[0] = "executing the graph (CudnnFp8.run)"
    o, lse = peer.run(f)
    if not torch.isfinite(o).all():
        print("FAIL: non-finite O (%d NaN)" % int(torch.isnan(o).sum()))
        return 1
    stage[0] = "checking O against fp32 (check())"
    err, bad, det = check(torch, o, q, k, v, f, causal, peer.out, peer.scale_o)
    # the LSE against fp32, for information (the bench checks O)
    s = (q[0, 0].float() @ k[0, 0].float().T) * d ** -0.5
    if causal:
        s = s.masked_fill(torch.ones(n, n, device="cuda", dtype=torch.bool).triu(1), float("-inf"))
    lse_err = float((torch.logsumexp(s, -1) - lse[0, 0]).abs().max())
    print("check: O max abs error %.3g (plain FP8 yardstick %.3g), margin %.2f of the tolerance; "
          "LSE of (0, 0) max abs error %.3g" % (err, det.get("yardstick_max_abs_err", float("nan")),
                                                det.get("margin", float("nan")), lse_err))
    if bad:
        print("FAIL: " + bad)
        return 1
    from bench_common import attention_flops
    from peer_timer import PeerTimer
    stage[0] = "timing (PeerTimer)"
    ms = PeerTimer(torch, repeats=a.repeats)(peer.fn(f))
    fl = attention_flops(b, h, n, n, d, causal)
    print("time: %.4f ms, %.1f TFLOP/s (median of %d, L2 flushed; the attention alone)" % (
        ms, fl / (ms * 1e-3) / 1e12, a.repeats))
    print("PASS (%.1f s)" % (time.time() - t0))
    return 0


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--selftest", action="store_true", help="build one graph, run it, check it, time it")
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--heads", type=int, default=2)
    ap.add_argument("--n", type=int, default=512)
    ap.add_argument("--d", type=int, default=128)
    ap.add_argument("--causal", action="store_true")
    ap.add_argument("--api", choices=["pygraph", "backend"], default=None,
                    help="cudnn.pygraph (default; CUDNN_FP8_PEER_API) or the C++ graph it lowers to")
    ap.add_argument("--no-hadamard", action="store_true", help="quantise Q and K without the rotation")
    ap.add_argument("--repeats", type=int, default=20)
    a = ap.parse_args(argv)
    if not a.selftest:
        ap.print_help()
        return 2
    return selftest(a)


if __name__ == "__main__":
    sys.exit(main())
