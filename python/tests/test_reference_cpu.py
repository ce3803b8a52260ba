"""The fp64 reference, the naive yardstick and the ported acceptance rule, on the CPU: the
rule must pass correct results and fail broken ones (DEVELOPERS.md: tests must be able to fail)."""

import math

from harness import need_torch, raises, torch

if torch is not None:
    from attn_lineage import reference as R


def _inputs(b=2, hq=4, hkv=2, nq=37, nk=53, d=64, dtype=None, seed=0, shift=0.0):
    g = torch.Generator().manual_seed(seed)
    dtype = dtype or torch.bfloat16
    q = (torch.randn(b, hq, nq, d, generator=g) + shift).to(dtype)
    k = (torch.randn(b, hkv, nk, d, generator=g) + shift).to(dtype)
    v = torch.randn(b, hkv, nk, d, generator=g).to(dtype)
    do = torch.randn(b, hq, nq, d, generator=g).to(dtype)
    return q, k, v, do


def test_reference_matches_sdpa_math():
    need_torch()
    q, k, v, _ = _inputs(nq=53, nk=53)
    for causal in (False, True):
        o, lse = R.forward_reference(q, k, v, causal, 0.125)
        kk, vv = (t.double().repeat_interleave(2, dim=1) for t in (k, v))
        want = torch.nn.functional.scaled_dot_product_attention(q.double(), kk, vv, is_causal=causal, scale=0.125)
        assert torch.allclose(o, want, atol=1e-12), float((o - want).abs().max())
        s = 0.125 * q.double() @ kk.transpose(-1, -2)
        if causal:
            s = s.masked_fill(torch.ones(53, 53, dtype=torch.bool).triu(1), -math.inf)
        assert torch.allclose(lse, torch.logsumexp(s, -1), atol=1e-12)


def test_causal_is_bottom_right_with_empty_rows():
    need_torch()
    q, k, v, _ = _inputs(nq=40, nk=30)
    o, lse = R.forward_reference(q, k, v, True, 0.125)
    # query i sees key j iff j <= i + nk - nq: rows 0..9 see nothing
    assert torch.all(o[:, :, :10] == 0) and torch.all(lse[:, :, :10] == -math.inf)
    assert torch.all(torch.isfinite(lse[:, :, 10:]))
    # row 10 sees key 0 alone: O = V_0 of its KV head
    assert torch.allclose(o[:, :, 10], v[:, :, 0].double().repeat_interleave(2, dim=1), atol=1e-12)


def test_backward_reference_matches_autograd_of_sdpa():
    need_torch()
    q, k, v, do = _inputs(nq=29, nk=29)
    dq, dk, dv = R.backward_reference(q, k, v, do, True, 0.2)
    q64, k64, v64 = (t.double().requires_grad_() for t in (q, k, v))
    o = torch.nn.functional.scaled_dot_product_attention(q64, k64.repeat_interleave(2, 1), v64.repeat_interleave(2, 1),
                                                         is_causal=True, scale=0.2)
    want = torch.autograd.grad(o, (q64, k64, v64), do.double())
    for got, w in zip((dq, dk, dv), want):
        assert torch.allclose(got, w, atol=1e-10)


def test_backward_reference_has_no_nan_on_empty_rows():
    need_torch()
    q, k, v, do = _inputs(nq=40, nk=30)
    for g in R.backward_reference(q, k, v, do, True, 0.125):
        assert torch.isfinite(g).all()
    dq = R.backward_reference(q, k, v, do, True, 0.125)[0]
    assert torch.all(dq[:, :, :10] == 0)


def test_masked_gradients_of_the_yardstick_and_the_reference():
    """The masked backward's yardstick (softcap's score', the sink's gradient) against fp64
    autograd: in fp32 inputs the two agree to fp32 rounding."""
    need_torch()
    q, k, v, do = _inputs(nq=40, nk=60, dtype=torch.float32)
    vis = R.window_visible(40, 60, 16, 0, q.device)
    sink = torch.linspace(-1.0, 2.0, 4)
    for cap, snk in ((2.0, None), (0.0, sink)):
        refs = R.backward_reference(q, k, v, do, False, 0.3, visible=vis, softcap=cap, sink=snk)
        _, _, *naive = R.naive_same_precision(q, k, v, do, False, 0.3, visible=vis, softcap=cap, sink=snk)
        assert len(refs) == len(naive) == (4 if snk is not None else 3)
        for r, n in zip(refs, naive):
            assert torch.allclose(n.double(), r, rtol=1e-4, atol=1e-5), float((n.double() - r).abs().max())


def _judge_all(q, k, v, do, causal, out, grads):
    scale = 0.125
    o_ref, lse_ref = R.forward_reference(q, k, v, causal, scale)
    refs = R.backward_reference(q, k, v, do, causal, scale)
    n_o, n_lse, *n_grads = R.naive_same_precision(q, k, v, do, causal, scale)
    res = [R.accept(out[0], o_ref, n_o, q.dtype, "row"), R.accept(out[1], lse_ref, n_lse, q.dtype, "log")]
    res += [R.accept(g, r, n, q.dtype, "tensor") for g, r, n in zip(grads, refs, n_grads)]
    return res


def test_rule_passes_the_naive_against_itself_rounded_otherwise():
    """A correct result rounded in another order (fp32 reference rounded to bf16) passes."""
    need_torch()
    for causal in (False, True):
        q, k, v, do = _inputs(nq=40, nk=30, shift=0.5)
        o32, lse32 = R.forward_reference(q, k, v, causal, 0.125, dtype=torch.float32)
        q32, k32, v32 = (t.float().requires_grad_() for t in (q, k, v))
        o_g, _ = R.forward_reference(q32, k32, v32, causal, 0.125, dtype=torch.float32)
        grads = torch.autograd.grad(o_g, (q32, k32, v32), do.float())
        res = _judge_all(q, k, v, do, causal, (o32.to(q.dtype), lse32), [g.to(q.dtype) for g in grads])
        for ok, margin, why in res:
            assert ok, why
            assert margin < 1.0


def test_rule_fails_a_dropped_key_block():
    need_torch()
    q, k, v, do = _inputs(nq=64, nk=256)
    o_bad, lse_bad = R.forward_reference(q, k[:, :, :192], v[:, :, :192], False, 0.125, dtype=torch.float32)
    o_ref, lse_ref = R.forward_reference(q, k, v, False, 0.125)
    n_o, n_lse, *_ = R.naive_same_precision(q, k, v, None, False, 0.125)
    ok, margin, why = R.accept(o_bad.to(q.dtype), o_ref, n_o, q.dtype, "row")
    assert not ok and margin > 1 and "tolerance" in why
    ok, _, _ = R.accept(lse_bad, lse_ref, n_lse, q.dtype, "log")
    assert not ok


def test_rule_fails_nan_and_a_missed_minus_inf():
    need_torch()
    q, k, v, do = _inputs(nq=40, nk=30)
    o_ref, lse_ref = R.forward_reference(q, k, v, True, 0.125)
    n_o, n_lse, *_ = R.naive_same_precision(q, k, v, None, True, 0.125)
    o = o_ref.to(q.dtype).clone()
    o[0, 0, 20, 3] = float("nan")
    ok, _, why = R.accept(o, o_ref, n_o, q.dtype)
    assert not ok and "NaN" in why
    lse = lse_ref.float().clone()
    lse[1, 1, 0] = 0.0  # an empty row whose LSE is not -inf
    ok, _, why = R.accept(lse, lse_ref, n_lse, q.dtype, "log")
    assert not ok and "-inf" in why
    ok, _, _ = R.accept(lse_ref.float(), lse_ref, n_lse, q.dtype, "log")
    assert ok


def test_rule_fails_a_wrong_gradient():
    need_torch()
    q, k, v, do = _inputs(nq=48, nk=48)
    refs = R.backward_reference(q, k, v, do, True, 0.125)
    naive = R.naive_same_precision(q, k, v, do, True, 0.125)[2:]
    dk_bad = refs[1].clone()
    dk_bad[:, :, -1] = 0  # the last key's gradient never written
    assert R.accept(refs[1].to(q.dtype), refs[1], naive[1], q.dtype, "tensor")[0]
    assert not R.accept(dk_bad.to(q.dtype), refs[1], naive[1], q.dtype, "tensor")[0]


def test_rule_refuses_an_unknown_magnitude():
    need_torch()
    x = torch.zeros(2, 2)
    with raises(ValueError, r"^magnitude"):
        R.accept(x, x, x, torch.bfloat16, "rows")
