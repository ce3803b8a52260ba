"""The project's correctness check in PyTorch: the fp64 reference, the same-precision naive
yardstick and the acceptance rule of common/compare.hpp, ported (DEVELOPERS.md, "Correctness").

Every tensor here is in the kernels' layout, [B, H, N, d]; K and V have Hkv heads (GQA).
For checked row r, with s_r the row's magnitude, e_r its max abs error, n the naive's largest
row error and u = max(u(dtype), 64 u(fp32)), a kernel passes when

    e_r <= 2 n + u s_r                                        for every row r
    ||out - ref||_2 <= 2 ||naive - ref||_2 + u sqrt(sum_r width s_r^2)

O is judged per row (s_r = max |ref| of the row), the LSE per row with the tensor's
magnitude max(1, max |LSE|), gradients as one row (the whole tensor). NaN never passes, an
expected -inf (an empty row's LSE) must be matched exactly, and a naive yardstick that
overflowed fails the check.
"""

import math

import torch

UNIT_ROUNDOFF = {torch.bfloat16: 2.0 ** -8, torch.float16: 2.0 ** -11, torch.float32: 2.0 ** -24}


def _expand_kv(t, heads):
    """[B, Hkv, N, d] -> [B, heads, N, d]: query head h reads KV head h / (heads / Hkv)."""
    return t.repeat_interleave(heads // t.shape[1], dim=1)


def _visible(nq, nk, causal, device):
    """Bottom-right aligned causal mask [Nq, Nk]: query i sees key j iff j <= i + Nk - Nq."""
    if not causal:
        return torch.ones(nq, nk, dtype=torch.bool, device=device)
    i = torch.arange(nq, device=device)[:, None]
    j = torch.arange(nk, device=device)[None, :]
    return j <= i + (nk - nq)


def window_visible(nq, nk, left, right, device):
    """FlashAttention's window_size mask [Nq, Nk], bottom-right aligned: query i (key position
    q = i + Nk - Nq) sees key j iff q - left <= j <= q + right (-1: no bound on that side)."""
    i = torch.arange(nq, device=device)[:, None] + (nk - nq)
    j = torch.arange(nk, device=device)[None, :]
    vis = torch.ones(nq, nk, dtype=torch.bool, device=device)
    if left >= 0:
        vis &= j >= i - left
    if right >= 0:
        vis &= j <= i + right
    return vis


def document_visible(cu_seqlens, causal, device):
    """The document mask of packed sequences [total, total]: a token sees its own document's
    tokens (causal: not later ones). cu_seqlens: a list [0, l0, l0 + l1, ..., total]."""
    total = cu_seqlens[-1]
    doc = torch.zeros(total, dtype=torch.long, device=device)
    for d, (a, b) in enumerate(zip(cu_seqlens, cu_seqlens[1:])):
        doc[a:b] = d
    vis = doc[:, None] == doc[None, :]
    if causal:
        vis &= torch.ones(total, total, dtype=torch.bool, device=device).tril()
    return vis


def _scores(s, softcap):
    return softcap * torch.tanh(s / softcap) if softcap else s


def forward_reference(q, k, v, causal, scale, dtype=torch.float64, *, visible=None, softcap=0.0, sink=None):
    """O and LSE in `dtype` arithmetic, differentiable (empty rows: O = 0, LSE = -inf).

    visible: a bool mask [Nq, Nk] (or broadcastable to [B, H, Nq, Nk]) used instead of
    `causal`; softcap > 0: scores softcap tanh(s / softcap); sink: [H] logits, one more term
    e^sink_h in each row's denominator with no value row (the LSE counts it; an empty row
    then has LSE = sink_h)."""
    hq = q.shape[1]
    q, k, v = q.to(dtype), _expand_kv(k.to(dtype), hq), _expand_kv(v.to(dtype), hq)
    s = _scores(scale * (q @ k.transpose(-1, -2)), softcap)
    vis = visible if visible is not None else _visible(q.shape[2], k.shape[2], causal, q.device)
    s = s.masked_fill(~vis, -math.inf)
    m = s.amax(-1, keepdim=True)
    if sink is not None:
        m = torch.maximum(m, sink.to(dtype).reshape(1, hq, 1, 1).expand_as(m))
    m = torch.where(torch.isinf(m), torch.zeros_like(m), m).detach()
    p = torch.exp(s - m)
    l = p.sum(-1, keepdim=True)
    if sink is not None:
        l = l + torch.exp(sink.to(dtype).reshape(1, hq, 1, 1) - m)
    o = (p / torch.where(l == 0, torch.ones_like(l), l)) @ v
    lse = (m + torch.log(l)).squeeze(-1)
    return o, lse


def backward_reference(q, k, v, dout, causal, scale, *, visible=None, softcap=0.0, sink=None):
    """fp64 dQ, dK, dV (dK, dV summed over each KV head's group); visible, softcap and sink as
    forward_reference's, and with a sink also dLoss/dsink [H] (a fourth)."""
    q64, k64, v64 = (t.detach().to(torch.float64).requires_grad_() for t in (q, k, v))
    s64 = None if sink is None else sink.detach().to(torch.float64).requires_grad_()
    o, _ = forward_reference(q64, k64, v64, causal, scale, visible=visible, softcap=softcap, sink=s64)
    ins = (q64, k64, v64) + (() if s64 is None else (s64,))
    return torch.autograd.grad(o, ins, dout.to(torch.float64))


def naive_same_precision(q, k, v, dout, causal, scale, *, visible=None, softcap=0.0, sink=None):
    """The yardstick: fp32 arithmetic, P, O (and dS and the gradients) rounded to the inputs'
    dtype, as common/reference.cpp's naive_forward/backward_same_precision. Returns
    (O, LSE, dQ, dK, dV) in fp32, and with a sink and dout also dLoss/dsink [H] (fp32, a sixth);
    dQ, dK, dV are None when dout is None. visible, softcap and sink as forward_reference's."""
    dt = q.dtype
    hq, hkv = q.shape[1], k.shape[1]
    qf, kf, vf = q.float(), _expand_kv(k.float(), hq), _expand_kv(v.float(), hq)
    raw = scale * (qf @ kf.transpose(-1, -2))
    s = _scores(raw, softcap)
    vis = visible if visible is not None else _visible(q.shape[2], k.shape[2], causal, q.device)
    s = s.masked_fill(~vis, -math.inf)
    m = s.amax(-1, keepdim=True)
    if sink is not None:
        m = torch.maximum(m, sink.float().reshape(1, hq, 1, 1).expand_as(m))
    empty = torch.isinf(m)
    m0 = torch.where(empty, torch.zeros_like(m), m)
    e = torch.exp(s - m0)
    l = e.sum(-1, keepdim=True)
    if sink is not None:
        l = l + torch.exp(sink.float().reshape(1, hq, 1, 1) - m0)
    p = (e / torch.where(l == 0, torch.ones_like(l), l)).to(dt).float()
    o = p @ vf
    lse = torch.where(empty, m, m0 + torch.log(l)).squeeze(-1)
    o_stored = o.to(dt).float()
    if dout is None:
        return o_stored, lse, None, None, None
    do = dout.float()
    dp = do @ vf.transpose(-1, -2)
    dsum = (do * o_stored).sum(-1, keepdim=True)
    dscore = 1 - torch.tanh(raw / softcap) ** 2 if softcap else 1.0  # score'(tau S)
    ds = (p * (dp - dsum) * dscore).to(dt).float()
    dq = (scale * (ds @ kf)).to(dt).float()
    b, nk, d = k.shape[0], k.shape[2], k.shape[3]
    g = hq // hkv
    dk = (scale * (ds.transpose(-1, -2) @ qf)).reshape(b, hkv, g, nk, d).sum(2).to(dt).float()
    dv = (p.transpose(-1, -2) @ do).reshape(b, hkv, g, nk, v.shape[3]).sum(2).to(dt).float()
    if sink is None:
        return o_stored, lse, dq, dk, dv
    # dLoss/dsink_h = -sum_i e^(sink_h - LSE_i) D_i over the batch and the rows
    dsink = -(torch.exp(sink.float().reshape(1, hq, 1) - lse) * dsum.squeeze(-1)).sum((0, 2))
    return o_stored, lse, dq, dk, dv, dsink


def _stats(out, ref, width):
    """Per-row max error and max |ref|, the L2 error, and the count of NaN or unmatched infs."""
    out = out.detach().to(torch.float64).reshape(-1, width)
    ref = ref.detach().to(torch.float64).reshape(-1, width)
    both_neg_inf = (ref == -math.inf) & (out == -math.inf)
    bad = (~torch.isfinite(out) & ~both_neg_inf) | ((ref == -math.inf) & (out != -math.inf))
    err = torch.where(both_neg_inf | bad, torch.zeros_like(out), (out - ref).abs())
    ref_abs = torch.where(torch.isfinite(ref), ref.abs(), torch.zeros_like(ref))
    return dict(row_err=err.amax(1), row_ref=ref_abs.amax(1), l2=float(err.pow(2).sum().sqrt()),
                max_abs=float(err.max()), ref_max=float(ref_abs.max()), bad=int(bad.sum()), checked=out.numel())


def accept(out, ref, naive, stored, magnitude="row"):
    """The acceptance rule (common/compare.hpp: accept()). `magnitude`: "row" (O), "log"
    (the LSE) or "tensor" (gradients). Returns (passed, margin, reason)."""
    if magnitude not in ("row", "log", "tensor"):
        raise ValueError(f"magnitude: row, log or tensor, got {magnitude!r}")
    width = 1 if magnitude == "log" else ref.shape[-1]
    kern, nv = _stats(out, ref, width), _stats(naive, ref, width)
    u = max(UNIT_ROUNDOFF[stored], 64 * UNIT_ROUNDOFF[torch.float32])
    n = nv["max_abs"]
    if magnitude == "tensor":
        s = max(nv["ref_max"], kern["ref_max"]) or 1.0
        tol = torch.tensor([2 * n + u * s], dtype=torch.float64)
        row_err = torch.tensor([kern["max_abs"]], dtype=torch.float64)
        l2_tol = 2 * nv["l2"] + u * math.sqrt(kern["checked"]) * s
    else:
        if magnitude == "log":
            s_r = torch.full_like(kern["row_ref"], max(1.0, float(kern["row_ref"].max())))
        else:
            s_r = kern["row_ref"]
        tol = 2 * n + u * s_r
        row_err = kern["row_err"]
        l2_tol = 2 * nv["l2"] + u * math.sqrt(float((width * s_r * s_r).sum()))
    ratio = torch.where(tol > 0, row_err / tol.clamp_min(1e-300),
                        torch.where(row_err > 0, torch.full_like(row_err, math.inf), torch.zeros_like(row_err)))
    margin = float(ratio.max())
    if kern["bad"]:
        return False, margin, f"{kern['bad']} elements are NaN/inf or miss an expected -inf"
    if nv["bad"] or not math.isfinite(n):
        return False, margin, "the same-precision yardstick overflowed: no tolerance can be set"
    if not margin <= 1.0:
        worst = int(ratio.argmax())
        return False, margin, f"max abs error {float(row_err[worst]):.3g} > tolerance {float(tol[worst]):.3g}"
    if not kern["l2"] <= l2_tol:
        return False, margin, f"L2 error {kern['l2']:.3g} > {l2_tol:.3g}"
    return True, margin, ""
