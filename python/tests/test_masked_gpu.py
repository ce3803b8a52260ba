"""Chapter 06's final masked forward and sm90a masked backward through the Python API on a Hopper
GPU, against the fp64 reference under the project's acceptance rule (attn_lineage.reference): windows
(two-sided, causal sliding, left-unbounded) with Nq != Nk and empty rows, softcap, learned sinks,
GQA, d = 64, 128 and 256, bf16 and fp16; flash_attn_varlen_func on packed documents, one of
them a single token. Skipped without a GPU, the C library, or an sm_90 device."""

import math

from harness import need_gpu, raises, torch

if torch is not None:
    from attn_lineage import flash_attn_func, flash_attn_varlen_func
    from attn_lineage import reference as R


def _inputs(b, nq, nk, hq, hkv, d, dtype, seed, shift=0.0):
    g = torch.Generator(device="cuda").manual_seed(seed)
    q = (torch.randn(b, nq, hq, d, generator=g, device="cuda") + shift).to(dtype)
    k = (torch.randn(b, nk, hkv, d, generator=g, device="cuda") + shift).to(dtype)
    v = torch.randn(b, nk, hkv, d, generator=g, device="cuda").to(dtype)
    return q, k, v


def _bhnd(t):
    return t.transpose(1, 2)


def _check(what, got, ref, naive, dtype, magnitude):
    ok, margin, why = R.accept(got, ref, naive, dtype, magnitude)
    assert ok, f"{what}: {why} (margin {margin:.2f})"


# (batch, nq, nk, heads, kv_heads, d, dtype, causal, window_size, softcap, sink?)
CASES = [
    (2, 300, 520, 8, 2, 128, torch.bfloat16, False, (100, 20), 0.0, False),   # two-sided, Nq < Nk, GQA 4:1
    (1, 520, 300, 4, 1, 64, torch.bfloat16, False, (64, 0), 0.0, False),      # causal sliding, 220 empty rows, MQA
    (1, 333, 333, 2, 2, 256, torch.float16, False, (-1, 7), 0.0, False),      # no left bound, d = 256
    (2, 257, 257, 4, 2, 64, torch.float16, True, (-1, -1), 1.5, False),       # causal softcap
    (1, 1000, 1000, 4, 2, 64, torch.bfloat16, True, (128, -1), 2.0, False),   # softcap + causal sliding
    (1, 77, 200, 2, 2, 128, torch.bfloat16, False, (-1, -1), 30.0, False),    # dense softcap, N below a tile
    (2, 200, 333, 4, 2, 64, torch.bfloat16, True, (-1, -1), 0.0, True),       # causal sink, GQA
    (1, 129, 129, 4, 4, 256, torch.bfloat16, False, (-1, -1), 0.0, True),     # dense sink, d = 256
    (1, 400, 300, 8, 2, 128, torch.float16, False, (64, 0), 0.0, True),       # sink + sliding, empty rows
]


def _run(case, seed):
    b, nq, nk, hq, hkv, d, dtype, causal, window, cap, with_sink = case
    q, k, v = _inputs(b, nq, nk, hq, hkv, d, dtype, seed)
    sink = None
    if with_sink:  # logits near log(Nk): the sink takes a visible share of each row
        g = torch.Generator(device="cuda").manual_seed(seed + 1000)
        sink = torch.randn(hq, generator=g, device="cuda") + math.log(nk)
    o, lse = flash_attn_func(q, k, v, causal=causal, window_size=window, softcap=cap, learnable_sink=sink,
                             return_lse=True)
    torch.cuda.synchronize()
    assert o.shape == q.shape and o.dtype == dtype and lse.shape == (b, hq, nq)
    left, right = window
    if causal:
        right = 0
    vis = R.window_visible(nq, nk, left, right, q.device)
    tau = 1.0 / math.sqrt(d)
    o_ref, lse_ref = R.forward_reference(_bhnd(q), _bhnd(k), _bhnd(v), False, tau, visible=vis, softcap=cap,
                                         sink=sink)
    n_o, n_lse, *_ = R.naive_same_precision(_bhnd(q), _bhnd(k), _bhnd(v), None, False, tau, visible=vis,
                                            softcap=cap, sink=sink)
    tag = f"{case}"
    _check(f"{tag} O", _bhnd(o), o_ref, n_o, dtype, "row")
    _check(f"{tag} LSE", lse, lse_ref, n_lse, dtype, "log")
    return o, lse, vis


def test_windows_softcap_sinks_against_the_reference():
    need_gpu()
    for i, case in enumerate(CASES):
        _run(case, seed=200 + i)


def test_empty_window_rows():
    """Rows whose window holds no key: 0 and LSE -inf; with a sink, 0 and LSE = the sink."""
    need_gpu()
    o, lse, vis = _run(CASES[1], seed=301)
    empty = ~vis.any(-1)
    assert int(empty.sum()) >= 200
    assert torch.all(o[:, empty] == 0) and torch.all(lse[:, :, empty] == -math.inf)
    q, k, v = _inputs(1, 400, 300, 8, 2, 128, torch.float16, seed=302)
    sink = torch.linspace(-1, 1, 8, device="cuda")
    o, lse = flash_attn_func(q, k, v, window_size=(64, 0), learnable_sink=sink, return_lse=True)
    assert torch.all(o[:, :100] == 0)
    assert torch.allclose(lse[0, :, :100], sink[:, None].expand(8, 100))


def test_a_window_wider_than_the_keys_is_dense():
    """window (Nk, Nk) keeps every key: the masked kernel's output equals chapter 05's dense one
    up to rounding."""
    need_gpu()
    q, k, v = _inputs(1, 300, 300, 4, 2, 128, torch.bfloat16, seed=303)
    o_w, lse_w = flash_attn_func(q, k, v, window_size=(300, 300), return_lse=True)
    o_d, lse_d = flash_attn_func(q, k, v, return_lse=True)
    assert torch.allclose(o_w.float(), o_d.float(), atol=2e-2)
    assert torch.allclose(lse_w, lse_d, atol=1e-3)
    # bounds near 2^31 are clipped to the keys (no int overflow in the mask): the same tiles, the same bits
    o_big = flash_attn_func(q, k, v, window_size=(2 ** 31 - 1, 2 ** 31 - 1))
    assert torch.equal(o_big, o_w)


def test_masked_side_stream_and_compile():
    need_gpu()
    q, k, v = _inputs(2, 333, 333, 4, 2, 128, torch.bfloat16, seed=304)
    f = lambda q, k, v: flash_attn_func(q, k, v, window_size=(50, 0), softcap=3.0) * 2  # noqa: E731
    want = f(q, k, v)
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        qs = q * 1  # written on the side stream just before the call
        got = f(qs, k, v)
    torch.cuda.current_stream().wait_stream(s)
    torch.cuda.synchronize()
    assert torch.equal(got, want)
    torch._dynamo.reset()
    assert torch.equal(torch.compile(f, fullgraph=True)(q, k, v), want)


def test_masked_gpu_argument_errors():
    need_gpu()
    q, k, v = _inputs(1, 64, 64, 4, 2, 64, torch.bfloat16, seed=305)
    with raises(ValueError, r"^learnable_sink: must be on q's device"):
        flash_attn_func(q, k, v, learnable_sink=torch.zeros(4))
    q256, k256, v256 = _inputs(1, 64, 64, 4, 2, 256, torch.bfloat16, seed=306)
    with raises(ValueError, r"no backward kernel"):
        flash_attn_func(q256.clone().requires_grad_(), k256, v256, window_size=(8, 0))


# (batch, nq, nk, heads, kv_heads, d, dtype, causal, window_size, softcap, sink?)
GRAD_CASES = [
    (2, 300, 520, 8, 2, 128, torch.bfloat16, False, (100, 20), 0.0, False),   # two-sided, Nq < Nk, GQA 4:1
    (1, 520, 300, 4, 1, 64, torch.bfloat16, False, (64, 0), 0.0, False),      # causal sliding, 220 empty rows
    (2, 257, 257, 4, 2, 64, torch.float16, True, (-1, -1), 1.5, False),       # causal softcap
    (1, 1000, 1000, 4, 2, 128, torch.bfloat16, True, (128, -1), 2.0, False),  # softcap + causal sliding
    (2, 200, 333, 4, 2, 64, torch.bfloat16, True, (-1, -1), 0.0, True),       # causal sink, GQA
    (1, 400, 300, 8, 2, 128, torch.float16, False, (64, 0), 0.0, True),       # sink + sliding, empty rows
]


def test_masked_backward_against_the_reference():
    """dQ, dK, dV (and the sink's gradient) from chapter 06's sm90a masked backward, against fp64."""
    need_gpu()
    for i, case in enumerate(GRAD_CASES):
        b, nq, nk, hq, hkv, d, dtype, causal, window, cap, with_sink = case
        q, k, v = _inputs(b, nq, nk, hq, hkv, d, dtype, seed=500 + i)
        g = torch.Generator(device="cuda").manual_seed(600 + i)
        do = torch.randn(b, nq, hq, d, generator=g, device="cuda").to(dtype)
        sink = (torch.randn(hq, generator=g, device="cuda") + math.log(nk)).requires_grad_() if with_sink else None
        leaves = [t.clone().requires_grad_() for t in (q, k, v)]
        o = flash_attn_func(*leaves, causal=causal, window_size=window, softcap=cap, learnable_sink=sink)
        o.backward(do)
        torch.cuda.synchronize()
        left, right = window
        if causal:
            right = 0
        vis = R.window_visible(nq, nk, left, right, q.device)
        tau = 1.0 / math.sqrt(d)
        refs = R.backward_reference(_bhnd(q), _bhnd(k), _bhnd(v), _bhnd(do), False, tau, visible=vis, softcap=cap,
                                    sink=sink)
        _, _, *naive = R.naive_same_precision(_bhnd(q), _bhnd(k), _bhnd(v), _bhnd(do), False, tau, visible=vis,
                                              softcap=cap, sink=sink)
        for name, leaf, ref, n in zip(("dQ", "dK", "dV"), leaves, refs, naive):
            assert leaf.grad.shape == leaf.shape and leaf.grad.dtype == dtype
            _check(f"{case} {name}", _bhnd(leaf.grad), ref, n, dtype, "tensor")
        if with_sink:
            assert sink.grad.shape == (hq,) and sink.grad.dtype == torch.float32
            _check(f"{case} dsink", sink.grad.reshape(1, hq), refs[3].reshape(1, hq), naive[3].reshape(1, hq),
                   dtype, "tensor")


def test_masked_backward_side_stream_and_compile():
    """The masked backward in the caller's stream order, and under torch.compile (no graph break)."""
    need_gpu()
    q, k, v = _inputs(2, 333, 333, 4, 2, 64, torch.bfloat16, seed=700)

    def grads(f, q, k, v):
        leaves = [t.clone().requires_grad_() for t in (q, k, v)]
        f(*leaves).float().sum().backward()
        return [t.grad for t in leaves]

    f = lambda q, k, v: flash_attn_func(q, k, v, window_size=(50, 0), softcap=3.0)  # noqa: E731
    want = grads(f, q, k, v)
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        got = grads(f, q * 1, k, v)
    torch.cuda.current_stream().wait_stream(s)
    torch.cuda.synchronize()
    for a, b in zip(got, want):  # dQ's adds in any order: equal up to rounding, not bit for bit
        assert torch.allclose(a.float(), b.float(), rtol=1e-2, atol=1e-2)
    torch._dynamo.reset()
    got = grads(torch.compile(f, fullgraph=True), q, k, v)
    for a, b in zip(got, want):
        assert torch.allclose(a.float(), b.float(), rtol=1e-2, atol=1e-2)


# ----------------------------------------------------------------------------- varlen

def _varlen_case(lens, hq, hkv, d, dtype, causal, seed):
    cu = [0]
    for n in lens:
        cu.append(cu[-1] + n)
    total = cu[-1]
    g = torch.Generator(device="cuda").manual_seed(seed)
    q = torch.randn(total, hq, d, generator=g, device="cuda").to(dtype)
    k = torch.randn(total, hkv, d, generator=g, device="cuda").to(dtype)
    v = torch.randn(total, hkv, d, generator=g, device="cuda").to(dtype)
    cu_t = torch.tensor(cu, dtype=torch.int32, device="cuda")
    o, lse = flash_attn_varlen_func(q, k, v, cu_t, cu_t, max(lens), max(lens), causal=causal, return_lse=True)
    torch.cuda.synchronize()
    assert o.shape == q.shape and lse.shape == (hq, total) and lse.dtype == torch.float32
    vis = R.document_visible(cu, causal, q.device)
    tau = 1.0 / math.sqrt(d)
    p = lambda t: t.transpose(0, 1).unsqueeze(0)  # noqa: E731  [total, H, d] -> [1, H, total, d]
    o_ref, lse_ref = R.forward_reference(p(q), p(k), p(v), False, tau, visible=vis)
    n_o, n_lse, *_ = R.naive_same_precision(p(q), p(k), p(v), None, False, tau, visible=vis)
    tag = f"varlen {lens} causal={causal} {dtype}"
    _check(f"{tag} O", p(o), o_ref, n_o, dtype, "row")
    _check(f"{tag} LSE", lse.unsqueeze(0), lse_ref, n_lse, dtype, "log")
    # the one-token document sees itself alone: its output is its own value row
    for a, b in zip(cu, cu[1:]):
        if b - a == 1:
            want = v[a].repeat_interleave(hq // hkv, dim=0)
            assert torch.allclose(o[a].float(), want.float(), rtol=1e-2, atol=1e-3), tag
    return q, k, v, o, lse, cu


def test_varlen_documents_against_the_reference():
    need_gpu()
    _varlen_case([1, 128, 1, 370, 77], 8, 2, 128, torch.bfloat16, True, seed=400)
    _varlen_case([1, 128, 1, 370, 77], 8, 2, 128, torch.bfloat16, False, seed=401)
    _varlen_case([300, 1, 129], 4, 4, 64, torch.float16, True, seed=402)
    _varlen_case([5, 1000], 2, 1, 256, torch.bfloat16, False, seed=403)
    _varlen_case([1], 2, 2, 64, torch.bfloat16, True, seed=404)


def test_varlen_equals_flash_attn_func_per_document():
    """Each document of the packed batch against the same document alone through chapter 05's
    causal forward (another kernel: equal up to rounding)."""
    need_gpu()
    q, k, v, o, lse, cu = _varlen_case([200, 1, 333], 4, 2, 64, torch.bfloat16, True, seed=405)
    for a, b in zip(cu, cu[1:]):
        o_doc, lse_doc = flash_attn_func(q[None, a:b], k[None, a:b], v[None, a:b], causal=True, return_lse=True)
        assert torch.allclose(o[a:b].float(), o_doc[0].float(), rtol=2e-2, atol=2e-2), (a, b)
        assert torch.allclose(lse[:, a:b], lse_doc[0], atol=1e-3), (a, b)


def test_varlen_gpu_argument_errors():
    need_gpu()
    q = torch.zeros(10, 2, 64, dtype=torch.bfloat16, device="cuda")
    cu = torch.tensor([0, 4, 10], dtype=torch.int32, device="cuda")
    with raises(ValueError, r"^cu_seqlens_k: must equal cu_seqlens_q"):
        flash_attn_varlen_func(q, q, q, cu, torch.tensor([0, 5, 10], dtype=torch.int32, device="cuda"), 6, 6)
    with raises(ValueError, r"^cu_seqlens_q: must run from 0"):
        bad = torch.tensor([0, 4, 9], dtype=torch.int32, device="cuda")
        flash_attn_varlen_func(q, q, q, bad, bad, 6, 6)


# ----------------------------------------------------------------------------- MLA decode

def _mla_case(b, nq, h, nk, seed, scale=None):
    from attn_lineage import mla_decode
    g = torch.Generator(device="cuda").manual_seed(seed)
    q = torch.randn(b, nq, h, 576, generator=g, device="cuda").to(torch.bfloat16)
    kv = torch.randn(b, nk, 576, generator=g, device="cuda").to(torch.bfloat16)
    o = mla_decode(q, kv, softmax_scale=scale)
    torch.cuda.synchronize()
    assert o.shape == (b, nq, h, 512) and o.dtype == torch.bfloat16
    tau = scale if scale is not None else 1.0 / math.sqrt(192)
    k, v = kv[:, None], kv[:, None, :, :512]  # one latent head shared by every query head
    o_ref, _ = R.forward_reference(_bhnd(q), k, v, True, tau)
    n_o, *_ = R.naive_same_precision(_bhnd(q), k, v, None, True, tau)
    _check(f"mla B{b} Nq{nq} H{h} Nk{nk}", _bhnd(o), o_ref, n_o, torch.bfloat16, "row")
    return q, kv, o


def test_mla_decode_against_the_reference():
    need_gpu()
    _mla_case(2, 1, 16, 1000, seed=500)    # 16 packed rows: the mma.sync tile
    _mla_case(1, 2, 128, 4097, seed=501)   # 256 rows: the 64-row wgmma tile, split into key ranges
    _mla_case(3, 1, 128, 77, seed=502)     # a cache below two key blocks
    _mla_case(1, 4, 16, 5, seed=503)       # causal, Nq close to Nk: query 0 sees 2 keys
    _mla_case(4, 1, 32, 300, seed=504, scale=0.05)


def test_mla_decode_side_stream_and_compile():
    need_gpu()
    from attn_lineage import mla_decode
    q, kv, want = _mla_case(2, 1, 64, 2000, seed=505)
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        qs = q * 1  # written on the side stream just before the call
        got = mla_decode(qs, kv)
    torch.cuda.current_stream().wait_stream(s)
    torch.cuda.synchronize()
    assert torch.equal(got, want)
    torch._dynamo.reset()
    assert torch.equal(torch.compile(lambda q, kv: mla_decode(q, kv), fullgraph=True)(q, kv), want)
