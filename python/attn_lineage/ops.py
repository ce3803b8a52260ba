"""FlashAttention's Python interface over the lineage kernels, as torch.library custom ops.

Two custom ops carry the kernels, each with a fake (meta) implementation, so that
torch.compile traces them as single nodes without graph breaks:

    attn_lineage::fwd(q, k, v, causal, softmax_scale) -> (o, lse)
    attn_lineage::bwd(dout, q, k, v, o, lse, causal, softmax_scale) -> (dq, dk, dv)
    attn_lineage::paged_decode(q, k_pool, v_pool, block_table, seqlens, softmax_scale) -> (o, lse)
    attn_lineage::masked_fwd(q, k, v, sinks, causal, softmax_scale, window_left, window_right,
                             softcap) -> (o, lse)
    attn_lineage::masked_bwd(dout, q, k, v, o, lse, sinks, causal, softmax_scale, window_left,
                             window_right, softcap) -> (dq, dk, dv, dsink)
    attn_lineage::varlen_fwd(q, k, v, cu_seqlens, causal, softmax_scale) -> (o, lse)
    attn_lineage::mla_decode(q, kv, softmax_scale) -> o_c

Both take the kernels' layout, [B][H][N][d] contiguous. flash_attn_func takes FlashAttention's
[B, N, H, d], transposes to [B, H, N, d] and makes it contiguous (a copy unless the tensor is
already laid out that way), runs the op, and returns O as a [B, N, H, d] view of the kernel's
[B, H, N, d] output (not contiguous; call .contiguous() where a caller needs it). The backward
runs through a torch.autograd.Function around the two ops.
"""

import math
from typing import Optional

import torch

from . import _lib

_DTYPES = {torch.bfloat16: _lib.BF16, torch.float16: _lib.F16}
FORWARD_HEAD_DIMS = (64, 128, 256)   # chapter 05's final forward (steps/final.cu)
BACKWARD_HEAD_DIMS = (64, 128)       # chapter 05's final backward (steps/final_backward.cu)
_DEVICE_TYPES = ("cuda", "meta")     # meta: shapes only (the fake implementations)


# ----------------------------------------------------------------------------- argument checks

def _dtype_name(dt):
    return str(dt).replace("torch.", "")


def check_qkv(q, k, v, *, need_backward):
    """Raises ValueError naming the argument for anything the kernels cannot take.

    q: [B, Nq, Hq, d], k and v: [B, Nk, Hkv, d], bf16 or fp16, one CUDA device.
    """
    for name, t in (("q", q), ("k", k), ("v", v)):
        if not isinstance(t, torch.Tensor):
            raise ValueError(f"{name}: expected a torch.Tensor, got {type(t).__name__}")
        if t.dim() != 4:
            raise ValueError(f"{name}: expected a 4-d tensor [batch, seqlen, heads, head_dim], got shape "
                             f"{tuple(t.shape)}")
        if t.dtype not in _DTYPES:
            raise ValueError(f"{name}: dtype {_dtype_name(t.dtype)} has no kernel (bfloat16 or float16)")
    if not (q.dtype == k.dtype == v.dtype):
        raise ValueError(f"k, v: dtypes must match q's ({_dtype_name(q.dtype)}), got {_dtype_name(k.dtype)} and "
                         f"{_dtype_name(v.dtype)}")
    b, nq, hq, d = q.shape
    if k.shape != v.shape:
        raise ValueError(f"v: shape {tuple(v.shape)} must equal k's {tuple(k.shape)} (the kernels take d_v = d)")
    bk, nk, hkv, dk = k.shape
    if bk != b:
        raise ValueError(f"k: batch {bk} differs from q's {b}")
    if dk != d:
        raise ValueError(f"k: head dim {dk} differs from q's {d}")
    if d not in FORWARD_HEAD_DIMS:
        raise ValueError(f"q: head dim {d} has no kernel (forward: {', '.join(map(str, FORWARD_HEAD_DIMS))})")
    if need_backward and d not in BACKWARD_HEAD_DIMS:
        raise ValueError(f"q: head dim {d} has a forward kernel but no backward kernel "
                         f"(backward: {', '.join(map(str, BACKWARD_HEAD_DIMS))}); run it without gradients "
                         f"(torch.no_grad(), or inputs that do not require grad)")
    if hkv == 0 or hq % hkv != 0:
        raise ValueError(f"k: {hkv} KV heads do not divide q's {hq} heads (GQA needs heads % kv_heads == 0)")
    if min(b, nq, hq, nk) <= 0:
        raise ValueError(f"q, k: every size must be positive, got q {tuple(q.shape)} and k {tuple(k.shape)}")
    for name, t in (("q", q), ("k", k), ("v", v)):
        if t.device.type not in _DEVICE_TYPES:
            raise ValueError(f"{name}: the kernels run on a CUDA device, got a {t.device.type} tensor")
    if not (q.device == k.device == v.device):
        raise ValueError(f"k, v: must be on q's device {q.device}, got {k.device} and {v.device}")
    for n in (b * hq * nq * d, b * hkv * nk * d):
        if n >= 2 ** 31:
            raise ValueError("q, k: more than 2^31 elements in one tensor (the kernels index with 32-bit ints)")


def check_scale(softmax_scale, d):
    if softmax_scale is None:
        return 1.0 / math.sqrt(d)
    try:
        s = float(softmax_scale)
    except (TypeError, ValueError):
        raise ValueError(f"softmax_scale: expected a number or None, got {softmax_scale!r}") from None
    if not math.isfinite(s) or s <= 0:
        raise ValueError(f"softmax_scale: must be finite and > 0, got {softmax_scale!r}")
    return s


_ready_cache = {}


def check_device(t, name="q"):
    """Raises ValueError when the GPU of `t` has no kernel (the kernels are sm_90a: Hopper)."""
    if t.device.type != "cuda":
        return
    index = t.device.index if t.device.index is not None else torch.cuda.current_device()
    if index not in _ready_cache:
        major, minor = torch.cuda.get_device_capability(index)
        if (major, minor) != (9, 0):
            _ready_cache[index] = (f"{name}: {torch.cuda.get_device_name(index)} (compute capability "
                                   f"{major}.{minor}) has no lineage kernel: they are built for sm_90a (Hopper)")
        else:
            _ready_cache[index] = _lib.device_ready(index)  # loads the library (LibraryNotFound if missing)
    why = _ready_cache[index]
    if why is not None:
        raise ValueError(why if why.startswith(name) else f"{name}: {why}")


# ----------------------------------------------------------------------------- the custom ops

def _aligned(t):
    """Contiguous, with a 16-byte aligned base (TMA's requirement): copied only when needed."""
    t = t.contiguous()
    if t.data_ptr() % 16 != 0:
        t = t.clone()
    return t


def _stream(t):
    return torch.cuda.current_stream(t.device).cuda_stream


@torch.library.custom_op("attn_lineage::fwd", mutates_args=(), device_types="cuda")
def _fwd(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool,
         softmax_scale: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Chapter 05's final forward on [B, H, N, d] tensors: (O, LSE), the LSE fp32 natural log."""
    q, k, v = _aligned(q), _aligned(k), _aligned(v)
    b, hq, nq, d = q.shape
    hkv, nk = k.shape[1], k.shape[2]
    o = torch.empty_like(q)
    lse = torch.empty((b, hq, nq), dtype=torch.float32, device=q.device)
    with torch.cuda.device(q.device):
        _lib.fa3_forward(q.device.index, _stream(q), _DTYPES[q.dtype], q.data_ptr(), k.data_ptr(), v.data_ptr(),
                         o.data_ptr(), lse.data_ptr(), b, hq, hkv, nq, nk, d, softmax_scale, causal)
    return o, lse


@_fwd.register_fake
def _fwd_fake(q, k, v, causal, softmax_scale):
    b, hq, nq, _ = q.shape
    return torch.empty_like(q, memory_format=torch.contiguous_format), q.new_empty((b, hq, nq), dtype=torch.float32)


@torch.library.custom_op("attn_lineage::bwd", mutates_args=(), device_types="cuda")
def _bwd(dout: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, o: torch.Tensor, lse: torch.Tensor,
         causal: bool, softmax_scale: float) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Chapter 05's final backward on [B, H, N, d] tensors: (dQ, dK, dV)."""
    dout, q, k, v, o = (_aligned(t) for t in (dout, q, k, v, o))
    lse = lse.contiguous()
    b, hq, nq, d = q.shape
    hkv, nk = k.shape[1], k.shape[2]
    dq, dk, dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
    nbytes = _lib.fa3_backward_workspace(b, hq, nq, d)
    # The caching allocator's blocks are 512-byte aligned; the C side checks 256.
    workspace = torch.empty(nbytes, dtype=torch.uint8, device=q.device)
    with torch.cuda.device(q.device):
        _lib.fa3_backward(q.device.index, _stream(q), _DTYPES[q.dtype], q.data_ptr(), k.data_ptr(), v.data_ptr(),
                          o.data_ptr(), dout.data_ptr(), lse.data_ptr(), dq.data_ptr(), dk.data_ptr(), dv.data_ptr(),
                          workspace.data_ptr(), nbytes, b, hq, hkv, nq, nk, d, softmax_scale, causal, False)
    return dq, dk, dv


@_bwd.register_fake
def _bwd_fake(dout, q, k, v, o, lse, causal, softmax_scale):
    return (torch.empty_like(q, memory_format=torch.contiguous_format),
            torch.empty_like(k, memory_format=torch.contiguous_format),
            torch.empty_like(v, memory_format=torch.contiguous_format))


class _FlashAttn(torch.autograd.Function):
    """O = softmax(tau Q K^T) V on [B, H, N, d], its backward chapter 05's final backward."""

    @staticmethod
    def forward(ctx, q, k, v, causal, softmax_scale):
        o, lse = torch.ops.attn_lineage.fwd(q, k, v, causal, softmax_scale)
        ctx.save_for_backward(q, k, v, o, lse)
        ctx.causal, ctx.softmax_scale = causal, softmax_scale
        # The LSE is an output for the caller's use, not a differentiable one: the backward
        # kernel takes dO alone (as FlashAttention's).
        ctx.mark_non_differentiable(lse)
        return o, lse

    @staticmethod
    def backward(ctx, dout, _dlse):
        q, k, v, o, lse = ctx.saved_tensors
        dq, dk, dv = torch.ops.attn_lineage.bwd(dout, q, k, v, o, lse, ctx.causal, ctx.softmax_scale)
        return dq, dk, dv, None, None


# ----------------------------------------------------------------------------- chapter 06's masked forward

MASKED_HEAD_DIMS = (64, 128, 256)  # chapter 06's final masked forward (masks/steps/final.cu)


@torch.library.custom_op("attn_lineage::masked_fwd", mutates_args=(), device_types="cuda")
def _masked_fwd(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, sinks: Optional[torch.Tensor], causal: bool,
                softmax_scale: float, window_left: int, window_right: int,
                softcap: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Chapter 06's final masked forward on [B, H, N, d] tensors: (O, LSE). sinks: [Hq] fp32 or None."""
    q, k, v = _aligned(q), _aligned(k), _aligned(v)
    b, hq, nq, d = q.shape
    hkv, nk = k.shape[1], k.shape[2]
    o = torch.empty_like(q)
    lse = torch.empty((b, hq, nq), dtype=torch.float32, device=q.device)
    sinks = None if sinks is None else sinks.contiguous()
    with torch.cuda.device(q.device):
        _lib.masked_forward(q.device.index, _stream(q), _DTYPES[q.dtype], q.data_ptr(), k.data_ptr(), v.data_ptr(),
                            o.data_ptr(), lse.data_ptr(), b, hq, hkv, nq, nk, d, softmax_scale, causal, window_left,
                            window_right, softcap, None if sinks is None else sinks.data_ptr(), None)
    return o, lse


@_masked_fwd.register_fake
def _masked_fwd_fake(q, k, v, sinks, causal, softmax_scale, window_left, window_right, softcap):
    b, hq, nq, _ = q.shape
    return torch.empty_like(q, memory_format=torch.contiguous_format), q.new_empty((b, hq, nq), dtype=torch.float32)


@torch.library.custom_op("attn_lineage::masked_bwd", mutates_args=(), device_types="cuda")
def _masked_bwd(dout: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, o: torch.Tensor,
                lse: torch.Tensor, sinks: Optional[torch.Tensor], causal: bool, softmax_scale: float, window_left: int,
                window_right: int, softcap: float) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Chapter 06's sm90a masked backward on [B, H, N, d] tensors: (dQ, dK, dV, dsink), dsink [Hq]
    fp32 with sinks, else empty."""
    dout, q, k, v, o = (_aligned(t) for t in (dout, q, k, v, o))
    lse = lse.contiguous()
    b, hq, nq, d = q.shape
    hkv, nk = k.shape[1], k.shape[2]
    dq, dk, dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
    sinks = None if sinks is None else sinks.contiguous()
    dsink = torch.empty((hq if sinks is not None else 0,), dtype=torch.float32, device=q.device)
    nbytes = _lib.fa3_backward_workspace(b, hq, nq, d)  # chapter 05's scratch layout
    workspace = torch.empty(nbytes, dtype=torch.uint8, device=q.device)
    with torch.cuda.device(q.device):
        _lib.masked_backward(q.device.index, _stream(q), _DTYPES[q.dtype], q.data_ptr(), k.data_ptr(), v.data_ptr(),
                             o.data_ptr(), dout.data_ptr(), lse.data_ptr(), dq.data_ptr(), dk.data_ptr(),
                             dv.data_ptr(), None if sinks is None else dsink.data_ptr(), workspace.data_ptr(), nbytes,
                             b, hq, hkv, nq, nk, d, softmax_scale, causal, window_left, window_right, softcap,
                             None if sinks is None else sinks.data_ptr(), False)
    return dq, dk, dv, dsink


@_masked_bwd.register_fake
def _masked_bwd_fake(dout, q, k, v, o, lse, sinks, causal, softmax_scale, window_left, window_right, softcap):
    hq = q.shape[1]
    return (torch.empty_like(q, memory_format=torch.contiguous_format),
            torch.empty_like(k, memory_format=torch.contiguous_format),
            torch.empty_like(v, memory_format=torch.contiguous_format),
            q.new_empty((hq if sinks is not None else 0,), dtype=torch.float32))


class _MaskedAttn(torch.autograd.Function):
    """Chapter 06's masked attention on [B, H, N, d]: the final masked forward, and the sm90a
    masked backward (with the learnable sink's gradient)."""

    @staticmethod
    def forward(ctx, q, k, v, sink, causal, softmax_scale, window_left, window_right, softcap):
        sinks = None if sink is None else sink.detach().float()
        o, lse = torch.ops.attn_lineage.masked_fwd(q, k, v, sinks, causal, softmax_scale, window_left, window_right,
                                                   softcap)
        ctx.save_for_backward(q, k, v, o, lse, sinks)
        ctx.args = (causal, softmax_scale, window_left, window_right, softcap)
        ctx.sink_dtype = None if sink is None else sink.dtype
        ctx.mark_non_differentiable(lse)
        return o, lse

    @staticmethod
    def backward(ctx, dout, _dlse):
        q, k, v, o, lse, sinks = ctx.saved_tensors
        dq, dk, dv, dsink = torch.ops.attn_lineage.masked_bwd(dout, q, k, v, o, lse, sinks, *ctx.args)
        dsink = dsink.to(ctx.sink_dtype) if ctx.sink_dtype is not None and ctx.needs_input_grad[3] else None
        return dq, dk, dv, dsink, None, None, None, None, None


@torch.library.custom_op("attn_lineage::varlen_fwd", mutates_args=(), device_types="cuda")
def _varlen_fwd(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cu_seqlens: torch.Tensor, causal: bool,
                softmax_scale: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Chapter 06's final masked forward, document mask, on packed [total, H, d]: (O, LSE [H, total]).
    cu_seqlens is read to the host (the block map is built there)."""
    q, k, v = _aligned(q), _aligned(k), _aligned(v)
    total, hq, d = q.shape
    hkv = k.shape[1]
    o = torch.empty_like(q)
    lse = torch.empty((hq, total), dtype=torch.float32, device=q.device)
    cu = [int(x) for x in cu_seqlens.tolist()]
    with torch.cuda.device(q.device):
        _lib.masked_forward(q.device.index, _stream(q), _DTYPES[q.dtype], q.data_ptr(), k.data_ptr(), v.data_ptr(),
                            o.data_ptr(), lse.data_ptr(), 1, hq, hkv, total, total, d, softmax_scale, causal, -1, -1,
                            0.0, None, cu)
    return o, lse


@_varlen_fwd.register_fake
def _varlen_fwd_fake(q, k, v, cu_seqlens, causal, softmax_scale):
    total, hq, _ = q.shape
    return torch.empty_like(q, memory_format=torch.contiguous_format), q.new_empty((hq, total), dtype=torch.float32)


def _check_window(window_size):
    if not (isinstance(window_size, (tuple, list)) and len(window_size) == 2
            and all(isinstance(w, int) and not isinstance(w, bool) for w in window_size)):
        raise ValueError(f"window_size: expected a pair of ints, got {window_size!r}")
    left, right = window_size
    if left < -1 or right < -1:
        raise ValueError(f"window_size: each bound must be >= 0, or -1 for none, got {tuple(window_size)!r}")
    return left, right


def _check_softcap(softcap):
    try:
        c = float(softcap)
    except (TypeError, ValueError):
        raise ValueError(f"softcap: expected a number, got {softcap!r}") from None
    if not math.isfinite(c) or c < 0:
        raise ValueError(f"softcap: must be finite and >= 0 (0: none), got {softcap!r}")
    return c


def _check_sink(learnable_sink, q, heads):
    if learnable_sink is None:
        return None
    if not isinstance(learnable_sink, torch.Tensor):
        raise ValueError(f"learnable_sink: expected a tensor [heads] or None, got {type(learnable_sink).__name__}")
    if learnable_sink.shape != (heads,):
        raise ValueError(f"learnable_sink: expected shape ({heads},) (one logit per query head), got "
                         f"{tuple(learnable_sink.shape)}")
    if learnable_sink.dtype not in (torch.float32, torch.bfloat16, torch.float16):
        raise ValueError(f"learnable_sink: dtype {_dtype_name(learnable_sink.dtype)}: float32, bfloat16 or float16")
    if learnable_sink.device != q.device:
        raise ValueError(f"learnable_sink: must be on q's device {q.device}, got {learnable_sink.device}")
    return learnable_sink


# ----------------------------------------------------------------------------- the public API

def flash_attn_func(q, k, v, causal=False, window_size=(-1, -1), softcap=0.0, learnable_sink=None,
                    softmax_scale=None, return_lse=False):
    """Attention on FlashAttention's layout: q [B, Nq, Hq, d], k and v [B, Nk, Hkv, d].

    bf16 or fp16 on a Hopper GPU (sm_90a); d = 64, 128 or 256 (the backward: 64 and 128).
    GQA when Hkv < Hq (Hq a multiple of Hkv). `causal` is bottom-right aligned when
    Nq != Nk (query i sees key j iff j <= i + Nk - Nq; a row that sees no key gives 0 and
    LSE -inf), as FlashAttention >= 2.1. softmax_scale defaults to 1/sqrt(d).

    window_size (left, right), FlashAttention's: query i, at key position q = i + Nk - Nq,
    sees keys j with q - left <= j <= q + right (-1: no bound on that side; causal sets
    right to 0). softcap > 0: score = softcap * tanh(softmax_scale q.k / softcap).
    learnable_sink: [Hq] logits (gpt-oss, FA4; natural log, not scaled), one more term
    e^sink_h in every row's denominator with no value row; the LSE includes it. softcap and
    learnable_sink take a dense or causal mask or a causal sliding window (right = 0), and not
    each other. Any of these runs chapter 06's final masked forward and, for gradients (d = 64
    or 128), its sm90a masked backward, which also gives learnable_sink its gradient. A window
    that is only causal or dense runs chapter 05's kernels.

    Returns O, [B, Nq, Hq, d] (a transposed view of the kernel's [B, Hq, Nq, d] output), and
    with return_lse=True also the LSE, [B, Hq, Nq] fp32 (natural log), which carries no
    gradient. Inputs are copied to [B, H, N, d] contiguous for the kernels.

    Bad input raises ValueError naming the argument.
    """
    left, right = _check_window(window_size)
    cap = _check_softcap(softcap)
    if not isinstance(causal, bool):
        raise ValueError(f"causal: expected a bool, got {causal!r}")
    if causal:
        right = 0
    sink = learnable_sink
    if sink is not None and not isinstance(sink, torch.Tensor):
        raise ValueError(f"learnable_sink: expected a tensor [heads] or None, got {type(sink).__name__}")
    # Chapter 05's kernels when the mask is only dense or causal; chapter 06's otherwise.
    masked = cap > 0 or sink is not None or not (left == -1 and right in (-1, 0))
    tensors = (q, k, v) + ((sink,) if sink is not None else ())
    need_backward = torch.is_grad_enabled() and any(isinstance(t, torch.Tensor) and t.requires_grad
                                                    for t in tensors)
    check_qkv(q, k, v, need_backward=need_backward)
    sink = _check_sink(sink, q, q.shape[2])
    if masked:
        if cap > 0 and sink is not None:
            raise ValueError("learnable_sink: no kernel takes a learnable sink and a softcap together "
                             "(chapter 06's masked forward: one or the other)")
        if (cap > 0 or sink is not None) and not (right == 0 or (left == -1 and right == -1)):
            what = "softcap" if cap > 0 else "learnable_sink"
            raise ValueError(f"window_size: {tuple(window_size)!r} with {what}: chapter 06's kernel takes a dense "
                             f"or causal mask or a causal sliding window (left, 0) there")
    scale = check_scale(softmax_scale, q.shape[-1])
    if not torch.compiler.is_compiling():  # traced: the C library refuses a GPU without kernels
        check_device(q)
    qt, kt, vt = (t.transpose(1, 2).contiguous() for t in (q, k, v))
    if masked:
        o, lse = _MaskedAttn.apply(qt, kt, vt, sink, causal, scale, left, right, cap)
    else:
        o, lse = _FlashAttn.apply(qt, kt, vt, right == 0, scale)
    o = o.transpose(1, 2)
    return (o, lse) if return_lse else o


def _check_cu_seqlens(name, cu, total, device):
    if not isinstance(cu, torch.Tensor):
        raise ValueError(f"{name}: expected an int32 tensor [docs + 1], got {type(cu).__name__}")
    if cu.dim() != 1 or cu.shape[0] < 2 or cu.dtype != torch.int32:
        raise ValueError(f"{name}: expected an int32 tensor [docs + 1] (at least 2 entries), got "
                         f"{_dtype_name(cu.dtype)} {tuple(cu.shape)}")
    if cu.device.type not in _DEVICE_TYPES and cu.device.type != "cpu":
        raise ValueError(f"{name}: expected a CUDA (or CPU) tensor, got a {cu.device.type} tensor")
    if cu.device.type == "meta" or torch.compiler.is_compiling():
        return None  # values unknown here: the library checks them before the launch
    vals = [int(x) for x in cu.tolist()]
    if vals[0] != 0 or vals[-1] != total:
        raise ValueError(f"{name}: must run from 0 to the total tokens {total}, got {vals[0]} .. {vals[-1]}")
    lens = [b - a for a, b in zip(vals, vals[1:])]
    if min(lens) < 1:
        raise ValueError(f"{name}: every document needs at least one token (must increase strictly)")
    return vals


def flash_attn_varlen_func(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, softmax_scale=None,
                           causal=False, window_size=(-1, -1), softcap=0.0, learnable_sink=None, return_lse=False):
    """Attention over packed sequences (FlashAttention's varlen): q [total, Hq, d], k and v
    [total, Hkv, d], the documents back to back, cu_seqlens [docs + 1] int32 (0, l0, l0 + l1, ...).

    Runs chapter 06's final masked forward with its document mask, one packed batch: a token
    sees the tokens of its own document (causal: not later ones), forward only. The kernel
    takes one document boundary list for queries and keys: cu_seqlens_q must equal
    cu_seqlens_k. bf16 or fp16, d = 64, 128 or 256, GQA. window_size, softcap and
    learnable_sink: defaults only (no document kernel takes them). max_seqlen_q and
    max_seqlen_k are checked against the longest document where the lengths are known.

    Returns O [total, Hq, d], and with return_lse=True also the LSE [Hq, total] fp32 (natural
    log), FlashAttention's varlen layout. cu_seqlens is read to the host on every call.
    """
    for name, t in (("q", q), ("k", k), ("v", v)):
        if not isinstance(t, torch.Tensor):
            raise ValueError(f"{name}: expected a torch.Tensor, got {type(t).__name__}")
        if t.dim() != 3:
            raise ValueError(f"{name}: expected a 3-d tensor [total_tokens, heads, head_dim], got shape "
                             f"{tuple(t.shape)}")
    if not isinstance(causal, bool):
        raise ValueError(f"causal: expected a bool, got {causal!r}")
    if tuple(_check_window(window_size)) != (-1, -1):
        raise ValueError(f"window_size: {tuple(window_size)!r}: the document mask takes no window (defaults only)")
    if _check_softcap(softcap) != 0:
        raise ValueError(f"softcap: {softcap!r}: the document mask takes no softcap (defaults only)")
    if learnable_sink is not None:
        raise ValueError("learnable_sink: the document mask takes no learnable sink (defaults only)")
    if q.shape[0] != k.shape[0]:
        raise ValueError(f"k: {k.shape[0]} tokens, q has {q.shape[0]}: the document kernel needs one packing of "
                         f"queries and keys (cu_seqlens_q = cu_seqlens_k)")
    # check_qkv's checks on a batch of one
    if torch.is_grad_enabled() and any(t.requires_grad for t in (q, k, v)):
        raise ValueError("q, k, v: chapter 06's document mask has no backward here; run it without gradients "
                         "(torch.no_grad(), or inputs that do not require grad)")
    check_qkv(q.unsqueeze(0), k.unsqueeze(0), v.unsqueeze(0), need_backward=False)
    total = q.shape[0]
    for name, m in (("max_seqlen_q", max_seqlen_q), ("max_seqlen_k", max_seqlen_k)):
        if not isinstance(m, int) or isinstance(m, bool) or m < 1:
            raise ValueError(f"{name}: expected an int >= 1, got {m!r}")
    cq = _check_cu_seqlens("cu_seqlens_q", cu_seqlens_q, total, q.device)
    ck = _check_cu_seqlens("cu_seqlens_k", cu_seqlens_k, total, q.device)
    if cu_seqlens_q.shape != cu_seqlens_k.shape or (cq is not None and ck is not None and cq != ck):
        raise ValueError("cu_seqlens_k: must equal cu_seqlens_q (the document kernel takes one boundary list "
                         "for queries and keys)")
    if cq is not None:
        longest = max(b - a for a, b in zip(cq, cq[1:]))
        for name, m in (("max_seqlen_q", max_seqlen_q), ("max_seqlen_k", max_seqlen_k)):
            if m < longest:
                raise ValueError(f"{name}: {m} is below the longest document ({longest} tokens)")
    scale = check_scale(softmax_scale, q.shape[-1])
    if not torch.compiler.is_compiling():
        check_device(q)
    o, lse = torch.ops.attn_lineage.varlen_fwd(q, k, v, cu_seqlens_q, causal, scale)
    return (o, lse) if return_lse else o


def attention_bhnd(q, k, v, causal=False, softmax_scale=None):
    """flash_attn_func on the kernels' own layout: q [B, Hq, Nq, d], k and v [B, Hkv, Nk, d]
    (what Hugging Face's attention functions receive). Returns O as [B, Nq, Hq, d] (a view of
    the kernel's output), with no copy of contiguous inputs. Checks as flash_attn_func."""
    if not isinstance(causal, bool):
        raise ValueError(f"causal: expected a bool, got {causal!r}")
    for name, t in (("q", q), ("k", k), ("v", v)):
        if not isinstance(t, torch.Tensor) or t.dim() != 4:
            raise ValueError(f"{name}: expected a 4-d tensor [batch, heads, seqlen, head_dim]")
    need_backward = torch.is_grad_enabled() and any(t.requires_grad for t in (q, k, v))
    check_qkv(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), need_backward=need_backward)
    scale = check_scale(softmax_scale, q.shape[-1])
    if not torch.compiler.is_compiling():
        check_device(q)
    o, _ = _FlashAttn.apply(q.contiguous(), k.contiguous(), v.contiguous(), causal, scale)
    return o.transpose(1, 2)


# ----------------------------------------------------------------------------- paged decode

DECODE_HEAD_DIMS = (64, 128)  # chapter 07's final bf16 decode (steps/final_bf16.cu)


@torch.library.custom_op("attn_lineage::paged_decode", mutates_args=(), device_types="cuda")
def _paged_decode(q: torch.Tensor, k_pool: torch.Tensor, v_pool: torch.Tensor, block_table: torch.Tensor,
                  seqlens: torch.Tensor, softmax_scale: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Chapter 07's final bf16 decode: q [B, Hq, d], pools [pages, Hkv, page_size, d]."""
    q, k_pool, v_pool = _aligned(q), _aligned(k_pool), _aligned(v_pool)
    block_table, seqlens = block_table.contiguous(), seqlens.contiguous()
    b, hq, d = q.shape
    hkv, page_size = k_pool.shape[1], k_pool.shape[2]
    max_pages = block_table.shape[1]
    o = torch.empty_like(q)
    lse = torch.empty((b, hq), dtype=torch.float32, device=q.device)
    index = q.device.index
    with torch.cuda.device(q.device):
        nbytes = _lib.paged_decode_workspace(index, b, hq, hkv, d, max_pages, page_size)
        workspace = torch.empty(nbytes, dtype=torch.uint8, device=q.device)
        _lib.paged_decode(index, _stream(q), q.data_ptr(), k_pool.data_ptr(), v_pool.data_ptr(),
                          block_table.data_ptr(), seqlens.data_ptr(), o.data_ptr(), lse.data_ptr(),
                          workspace.data_ptr(), nbytes, b, hq, hkv, d, max_pages, page_size, softmax_scale)
    return o, lse


@_paged_decode.register_fake
def _paged_decode_fake(q, k_pool, v_pool, block_table, seqlens, softmax_scale):
    b, hq, _ = q.shape
    return torch.empty_like(q, memory_format=torch.contiguous_format), q.new_empty((b, hq), dtype=torch.float32)


DECODE_8BIT_HEAD_DIMS = (128,)  # chapter 07's final 8-bit decode (steps/final_8bit.cu)
DECODE_8BIT_MIN_PAGE = 8        # it copies whole pages by TMA boxes of at least 8 slots
# the 8-bit formats: the codes' torch dtype -> (the C library's name, the largest code)
_KV8 = {torch.float8_e4m3fn: (_lib.KV_FP8_E4M3, 448.0), torch.int8: (_lib.KV_INT8, 127.0)}


@torch.library.custom_op("attn_lineage::paged_decode_8bit", mutates_args=(), device_types="cuda")
def _paged_decode_8bit(q: torch.Tensor, k_codes: torch.Tensor, v_codes: torch.Tensor, k_scale: torch.Tensor,
                       v_scale: torch.Tensor, block_table: torch.Tensor, seqlens: torch.Tensor,
                       softmax_scale: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Chapter 07's final 8-bit decode: q [B, Hq, d] bf16, codes [pages, Hkv, page_size, d] (E4M3
    or int8), scales [pages, Hkv] fp32."""
    q, k_codes, v_codes = _aligned(q), _aligned(k_codes), _aligned(v_codes)
    k_scale, v_scale = k_scale.contiguous(), v_scale.contiguous()
    block_table, seqlens = block_table.contiguous(), seqlens.contiguous()
    b, hq, d = q.shape
    pages, hkv, page_size = k_codes.shape[0], k_codes.shape[1], k_codes.shape[2]
    max_pages = block_table.shape[1]
    fmt = _KV8[k_codes.dtype][0]
    o = torch.empty_like(q)
    lse = torch.empty((b, hq), dtype=torch.float32, device=q.device)
    index = q.device.index
    with torch.cuda.device(q.device):
        nbytes = _lib.paged_decode_8bit_workspace(index, fmt, b, hq, hkv, d, max_pages, page_size)
        workspace = torch.empty(nbytes, dtype=torch.uint8, device=q.device)
        _lib.paged_decode_8bit(index, _stream(q), fmt, q.data_ptr(), k_codes.data_ptr(), v_codes.data_ptr(),
                               k_scale.data_ptr(), v_scale.data_ptr(), block_table.data_ptr(), seqlens.data_ptr(),
                               o.data_ptr(), lse.data_ptr(), workspace.data_ptr(), nbytes, b, hq, hkv, d, pages,
                               max_pages, page_size, softmax_scale)
    return o, lse


@_paged_decode_8bit.register_fake
def _paged_decode_8bit_fake(q, k_codes, v_codes, k_scale, v_scale, block_table, seqlens, softmax_scale):
    b, hq, _ = q.shape
    return torch.empty_like(q, memory_format=torch.contiguous_format), q.new_empty((b, hq), dtype=torch.float32)


def _codes_of(x, scale, target):
    """x / scale as 8-bit codes of `target` (scale broadcast against x; a scale of 0 gives code 0):
    E4M3's rounding, or int8 rounded to nearest; every code within the format's largest."""
    qmax = _KV8[target][1]
    inv = torch.where(scale > 0, 1.0 / scale, torch.zeros_like(scale))
    y = (x * inv).clamp(-qmax, qmax)
    return y.to(target) if target == torch.float8_e4m3fn else torch.round(y).to(torch.int8)


def _kv8_dtype(kv_dtype):
    if kv_dtype in ("fp8", "e4m3", torch.float8_e4m3fn):
        return torch.float8_e4m3fn
    if kv_dtype in ("int8", torch.int8):
        return torch.int8
    raise ValueError(f"kv_dtype: 'fp8' (E4M3) or 'int8', got {kv_dtype!r}")


def quantize_kv_pages(cache, kv_dtype, kv_layout="NHD"):
    """A page pool in chapter 07's 8-bit format (kv_quant.hpp): (codes, scale).

    cache: [pages, page_size, Hkv, d] ("NHD") or [pages, Hkv, page_size, d] ("HND"), any float dtype.
    kv_dtype: "fp8" (E4M3 codes, torch.float8_e4m3fn) or "int8" (codes in [-127, 127]).
    scale [pages, Hkv] fp32 is amax / 448 (E4M3) or amax / 127 (INT8) over each page's slots of
    one KV head, and an element's value is code * scale: a page written whole, as the chapter's
    prefill writes it (an all-zero page keeps scale 0 and zero codes). codes has cache's layout.
    """
    target = _kv8_dtype(kv_dtype)
    if kv_layout not in ("NHD", "HND"):
        raise ValueError(f"kv_layout: 'NHD' or 'HND', got {kv_layout!r}")
    if not isinstance(cache, torch.Tensor) or cache.dim() != 4 or not cache.dtype.is_floating_point:
        raise ValueError("cache: expected a 4-d floating-point tensor [pages, page_size, Hkv, d] (NHD) or "
                         "[pages, Hkv, page_size, d] (HND)")
    x = cache.float()
    slot_dim = 1 if kv_layout == "NHD" else 2
    amax = x.abs().amax(dim=(slot_dim, 3))  # [pages, Hkv]
    scale = amax / _KV8[target][1]
    codes = _codes_of(x, scale[:, None, :, None] if kv_layout == "NHD" else scale[:, :, None, None], target)
    return codes, scale


def dequantize_kv_pages(codes, scale, kv_layout="NHD"):
    """The values of an 8-bit page pool, code * scale, in fp32 (quantize_kv_pages()'s inverse up to rounding)."""
    s = scale.float()
    s = s[:, None, :, None] if kv_layout == "NHD" else s[:, :, None, None]
    return codes.float() * s


def flash_attn_with_kvcache(q, k_cache, v_cache, cache_seqlens, block_table, softmax_scale=None, causal=True,
                            return_softmax_lse=False, kv_layout="NHD", k_scale=None, v_scale=None):
    """One decode step over a paged KV cache (chapter 07's final bf16 kernel), forward only.

    q: [B, 1, Hq, d] bf16 (one new token a sequence; its K and V must already be in the cache).
    k_cache, v_cache: kv_layout "NHD" (FlashAttention's) [pages, page_size, Hkv, d], copied to the
    kernel's layout on every call; "HND" (the kernel's, FlashInfer's name) [pages, Hkv, page_size, d],
    used as it is. page_size: a power of two. cache_seqlens: [B] int32 (or an int for every
    sequence), each in [1, max_pages * page_size]; block_table: [B, max_pages] int32, page indices
    into the cache. d = 64 or 128. The lengths and the table's entries stay on the device and are
    not checked (a page index outside the cache reads outside it). `causal` has no effect with
    one query token (it sees its whole sequence). Returns O [B, 1, Hq, d], and with
    return_softmax_lse=True the LSE [B, Hq, 1] fp32.

    8-bit pages (chapter 07's final 8-bit kernel): k_cache and v_cache hold codes,
    torch.float8_e4m3fn (E4M3) or torch.int8 (in [-127, 127]), and k_scale, v_scale [pages, Hkv]
    fp32 one scale per (page, KV head): an element's value is code * scale (quantize_kv_pages()
    makes such a pool). d = 128, page_size >= 8.
    """
    if kv_layout not in ("NHD", "HND"):
        raise ValueError(f"kv_layout: 'NHD' or 'HND', got {kv_layout!r}")
    for name, t in (("q", q), ("k_cache", k_cache), ("v_cache", v_cache), ("block_table", block_table)):
        if not isinstance(t, torch.Tensor):
            raise ValueError(f"{name}: expected a torch.Tensor, got {type(t).__name__}")
    if q.dim() != 4:
        raise ValueError(f"q: expected [batch, 1, heads, head_dim], got shape {tuple(q.shape)}")
    if q.shape[1] != 1:
        raise ValueError(f"q: {q.shape[1]} query tokens a sequence; the paged decode kernel takes 1")
    if q.dtype != torch.bfloat16:
        raise ValueError(f"q: dtype {_dtype_name(q.dtype)} has no kernel (the paged decode's queries are bfloat16)")
    eight_bit = k_cache.dtype in _KV8
    for name, t in (("k_cache", k_cache), ("v_cache", v_cache)):
        if t.dtype != torch.bfloat16 and t.dtype not in _KV8:
            raise ValueError(f"{name}: dtype {_dtype_name(t.dtype)} has no kernel (bfloat16 pages, or 8-bit pages: "
                             f"float8_e4m3fn or int8 with k_scale and v_scale)")
    if v_cache.dtype != k_cache.dtype:
        raise ValueError(f"v_cache: dtype {_dtype_name(v_cache.dtype)} differs from k_cache's "
                         f"{_dtype_name(k_cache.dtype)}")
    if not eight_bit and (k_scale is not None or v_scale is not None):
        raise ValueError("k_scale, v_scale: only for 8-bit pages (k_cache float8_e4m3fn or int8)")
    if k_cache.dim() != 4 or k_cache.shape != v_cache.shape:
        raise ValueError(f"k_cache, v_cache: expected two 4-d tensors of one shape, got {tuple(k_cache.shape)} and "
                         f"{tuple(v_cache.shape)}")
    b, _, hq, d = q.shape
    if kv_layout == "NHD":
        pages, page_size, hkv, dk = k_cache.shape
    else:
        pages, hkv, page_size, dk = k_cache.shape
    if dk != d:
        raise ValueError(f"k_cache: head dim {dk} differs from q's {d}")
    if d not in (DECODE_8BIT_HEAD_DIMS if eight_bit else DECODE_HEAD_DIMS):
        raise ValueError(f"q: head dim {d} has no paged decode kernel" + (
            f" over 8-bit pages ({', '.join(map(str, DECODE_8BIT_HEAD_DIMS))})" if eight_bit else
            f" ({', '.join(map(str, DECODE_HEAD_DIMS))})"))
    if hkv == 0 or hq % hkv != 0:
        raise ValueError(f"k_cache: {hkv} KV heads do not divide q's {hq} heads")
    if page_size <= 0 or page_size & (page_size - 1):
        raise ValueError(f"k_cache: page size {page_size} must be a power of two")
    if eight_bit and page_size < DECODE_8BIT_MIN_PAGE:
        raise ValueError(f"k_cache: page size {page_size}: the 8-bit decode copies pages of at least "
                         f"{DECODE_8BIT_MIN_PAGE} tokens")
    if eight_bit:
        for name, t in (("k_scale", k_scale), ("v_scale", v_scale)):
            if not isinstance(t, torch.Tensor):
                raise ValueError(f"{name}: 8-bit pages need a float32 tensor [pages={pages}, Hkv={hkv}], got "
                                 f"{type(t).__name__}")
            if t.dtype != torch.float32 or tuple(t.shape) != (pages, hkv):
                raise ValueError(f"{name}: expected float32 [pages={pages}, Hkv={hkv}], got {_dtype_name(t.dtype)} "
                                 f"{tuple(t.shape)}")
    if block_table.dim() != 2 or block_table.shape[0] != b or block_table.dtype != torch.int32:
        raise ValueError(f"block_table: expected int32 [batch={b}, max_pages], got {_dtype_name(block_table.dtype)} "
                         f"{tuple(block_table.shape)}")
    if isinstance(cache_seqlens, int):
        if not 1 <= cache_seqlens <= block_table.shape[1] * page_size:
            raise ValueError(f"cache_seqlens: {cache_seqlens} outside [1, max_pages * page_size]")
        cache_seqlens = torch.full((b,), cache_seqlens, dtype=torch.int32, device=q.device)
    if not isinstance(cache_seqlens, torch.Tensor) or cache_seqlens.shape != (b,) or cache_seqlens.dtype != torch.int32:
        raise ValueError(f"cache_seqlens: expected an int or an int32 tensor [batch={b}]")
    scales = (("k_scale", k_scale), ("v_scale", v_scale)) if eight_bit else ()
    for name, t in (("q", q), ("k_cache", k_cache), ("v_cache", v_cache), ("block_table", block_table),
                    ("cache_seqlens", cache_seqlens)) + scales:
        if t.device.type not in _DEVICE_TYPES:
            raise ValueError(f"{name}: the kernels run on a CUDA device, got a {t.device.type} tensor")
        if t.device != q.device:
            raise ValueError(f"{name}: must be on q's device {q.device}, got {t.device}")
    if torch.is_grad_enabled() and any(t.requires_grad for t in (q, k_cache, v_cache)):
        raise ValueError("q, k_cache, v_cache: the paged decode has no backward; call it under torch.no_grad()")
    scale = check_scale(softmax_scale, d)
    if not torch.compiler.is_compiling():
        check_device(q)
    if kv_layout == "NHD":
        k_cache, v_cache = (t.transpose(1, 2).contiguous() for t in (k_cache, v_cache))
    if eight_bit:
        o, lse = torch.ops.attn_lineage.paged_decode_8bit(q.reshape(b, hq, d), k_cache, v_cache, k_scale, v_scale,
                                                          block_table, cache_seqlens, scale)
    else:
        o, lse = torch.ops.attn_lineage.paged_decode(q.reshape(b, hq, d), k_cache, v_cache, block_table,
                                                      cache_seqlens, scale)
    o = o.reshape(b, 1, hq, d)
    return (o, lse.reshape(b, hq, 1)) if return_softmax_lse else o


# ----------------------------------------------------------------------------- MLA decode

MLA_DK, MLA_DV = 576, 512  # chapter 06's absorbed MLA: latent key [c (512) ; k_rope (64)], latent value c


@torch.library.custom_op("attn_lineage::mla_decode", mutates_args=(), device_types="cuda")
def _mla_decode(q: torch.Tensor, kv: torch.Tensor, softmax_scale: float) -> torch.Tensor:
    """Chapter 06's final absorbed MLA decode: q [B, H, Nq, 576], kv [B, Nk, 576] -> o_c [B, H, Nq, 512]."""
    q, kv = _aligned(q), _aligned(kv)
    b, h, nq, _ = q.shape
    nk = kv.shape[1]
    o = torch.empty((b, h, nq, MLA_DV), dtype=q.dtype, device=q.device)
    index = q.device.index
    with torch.cuda.device(q.device):
        nbytes = _lib.mla_decode_workspace(index, b, h, nq, nk)
        workspace = torch.empty(nbytes, dtype=torch.uint8, device=q.device)
        _lib.mla_decode(index, _stream(q), q.data_ptr(), kv.data_ptr(), o.data_ptr(), workspace.data_ptr(), nbytes,
                        b, h, nq, nk, softmax_scale)
    return o


@_mla_decode.register_fake
def _mla_decode_fake(q, kv, softmax_scale):
    b, h, nq, _ = q.shape
    return q.new_empty((b, h, nq, MLA_DV))


def mla_decode(q, kv_cache, softmax_scale=None, causal=True):
    """Chapter 06's final absorbed MLA decode (DeepSeek's multi-head latent attention with W_UK
    absorbed into the query), forward only, bf16.

    q: [B, Nq, H, 576], the absorbed query [q_nope W_UK^T ; q_rope] of each head; kv_cache:
    [B, Nk, 576], the latent cache as stored ([c ; k_rope], one cache shared by every head).
    Returns the latent output o_c [B, Nq, H, 512] (softmax(tau q kv^T) kv[..., :512]; apply W_UV
    for the heads' outputs), a transposed view of the kernel's [B, H, Nq, 512]. Causal,
    bottom-right (query i sees keys j <= i + Nk - Nq), Nq <= Nk. softmax_scale defaults to
    1/sqrt(192) (the 128 + 64 dims of the unabsorbed query).
    """
    for name, t in (("q", q), ("kv_cache", kv_cache)):
        if not isinstance(t, torch.Tensor):
            raise ValueError(f"{name}: expected a torch.Tensor, got {type(t).__name__}")
        if t.dtype != torch.bfloat16:
            raise ValueError(f"{name}: dtype {_dtype_name(t.dtype)} has no kernel (the MLA decode is bfloat16)")
    if q.dim() != 4 or q.shape[3] != MLA_DK:
        raise ValueError(f"q: expected [batch, seqlen, heads, {MLA_DK}], got shape {tuple(q.shape)}")
    if kv_cache.dim() != 3 or kv_cache.shape[2] != MLA_DK:
        raise ValueError(f"kv_cache: expected [batch, seqlen, {MLA_DK}], got shape {tuple(kv_cache.shape)}")
    b, nq, h, _ = q.shape
    if kv_cache.shape[0] != b:
        raise ValueError(f"kv_cache: batch {kv_cache.shape[0]} differs from q's {b}")
    nk = kv_cache.shape[1]
    if min(b, nq, h, nk) <= 0:
        raise ValueError(f"q, kv_cache: every size must be positive, got q {tuple(q.shape)} and kv_cache "
                         f"{tuple(kv_cache.shape)}")
    if causal is not True:
        if not isinstance(causal, bool):
            raise ValueError(f"causal: expected a bool, got {causal!r}")
        if nq > 1:
            raise ValueError("causal: the MLA decode kernel is causal; causal=False runs only with one query token")
    if nq > nk:
        raise ValueError(f"q: {nq} query tokens, more than the cache's {nk} (the causal MLA decode needs Nq <= Nk)")
    for name, t in (("q", q), ("kv_cache", kv_cache)):
        if t.device.type not in _DEVICE_TYPES:
            raise ValueError(f"{name}: the kernels run on a CUDA device, got a {t.device.type} tensor")
    if kv_cache.device != q.device:
        raise ValueError(f"kv_cache: must be on q's device {q.device}, got {kv_cache.device}")
    if torch.is_grad_enabled() and any(t.requires_grad for t in (q, kv_cache)):
        raise ValueError("q, kv_cache: the MLA decode has no backward; call it under torch.no_grad()")
    scale = check_scale(softmax_scale, 192)
    if not torch.compiler.is_compiling():
        check_device(q)
    o = torch.ops.attn_lineage.mla_decode(q.transpose(1, 2).contiguous(), kv_cache, scale)
    return o.transpose(1, 2)
