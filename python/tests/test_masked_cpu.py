"""Chapter 06's masked forward and the document mask through the Python layer, without a GPU:
which kernel each window, softcap and sink picks, the argument checks (ValueError naming the
argument), the fakes of attn_lineage::masked_fwd and ::varlen_fwd, torch.compile without graph
breaks, and the reference's masks (window, documents, softcap, sink) against plain formulas."""

import math

from harness import need_torch, raises, torch

if torch is not None:
    from attn_lineage import flash_attn_func, flash_attn_varlen_func
    from attn_lineage import reference as R

BF16 = torch.bfloat16 if torch is not None else None


def _qkv(device="meta", dtype=None, b=2, nq=100, nk=70, hq=4, hkv=2, d=64):
    dtype = dtype or BF16
    return (torch.zeros(b, nq, hq, d, dtype=dtype, device=device),
            torch.zeros(b, nk, hkv, d, dtype=dtype, device=device),
            torch.zeros(b, nk, hkv, d, dtype=dtype, device=device))


def _traced_ops(fn, *args):
    explanation = torch._dynamo.explain(fn)(*args)
    assert explanation.graph_break_count == 0, explanation.break_reasons
    assert explanation.graph_count == 1
    return explanation.graphs[0].code


def test_each_option_picks_its_kernel():
    """Only-causal and dense windows stay on chapter 05's kernels (backward included); the rest
    go to chapter 06's masked forward."""
    need_torch()
    q, k, v = _qkv()
    sink = torch.zeros(4, device="meta")
    cases = [  # (kwargs, the op traced)
        (dict(window_size=(-1, -1)), "attn_lineage.fwd"),
        (dict(window_size=(-1, 0)), "attn_lineage.fwd"),                  # causal
        (dict(causal=True, window_size=(-1, 5)), "attn_lineage.fwd"),     # causal sets right = 0
        (dict(window_size=(16, 0)), "attn_lineage.masked_fwd"),
        (dict(window_size=(16, 3)), "attn_lineage.masked_fwd"),
        (dict(window_size=(-1, 3)), "attn_lineage.masked_fwd"),
        (dict(softcap=30.0), "attn_lineage.masked_fwd"),
        (dict(softcap=30.0, causal=True, window_size=(64, -1)), "attn_lineage.masked_fwd"),
        (dict(learnable_sink=sink, causal=True), "attn_lineage.masked_fwd"),
    ]
    for kwargs, op in cases:
        code = _traced_ops(lambda q, k, v: flash_attn_func(q, k, v, **kwargs) * 2, q, k, v)
        assert op + "(" in code or op + ".default" in code, (kwargs, code)
        other = "attn_lineage.masked_fwd" if op == "attn_lineage.fwd" else "attn_lineage.fwd("
        assert other not in code, (kwargs, code)


def test_masked_fake_shapes():
    need_torch()
    for dtype in (torch.bfloat16, torch.float16):
        for d in (64, 128, 256):
            q, k, v = _qkv(dtype=dtype, d=d)
            o, lse = flash_attn_func(q, k, v, window_size=(32, 8), return_lse=True)
            assert o.shape == q.shape and o.dtype == dtype and o.device.type == "meta"
            assert lse.shape == (2, 4, 100) and lse.dtype == torch.float32
    o, lse = flash_attn_func(q, k, v, learnable_sink=torch.zeros(4, device="meta"), return_lse=True)
    assert o.shape == q.shape and lse.shape == (2, 4, 100)


def test_masked_argument_checks():
    need_torch()
    q, k, v = _qkv()
    sink = torch.zeros(4, device="meta")
    with raises(ValueError, r"^window_size: expected a pair of ints"):
        flash_attn_func(q, k, v, window_size=(1.5, 0))
    with raises(ValueError, r"^window_size: each bound"):
        flash_attn_func(q, k, v, window_size=(0, -3))
    with raises(ValueError, r"^softcap: expected a number"):
        flash_attn_func(q, k, v, softcap="big")
    with raises(ValueError, r"^softcap: must be finite"):
        flash_attn_func(q, k, v, softcap=float("inf"))
    with raises(ValueError, r"^learnable_sink: expected shape \(4,\)"):
        flash_attn_func(q, k, v, learnable_sink=torch.zeros(2, device="meta"))
    with raises(ValueError, r"^learnable_sink: dtype int32"):
        flash_attn_func(q, k, v, learnable_sink=torch.zeros(4, dtype=torch.int32, device="meta"))
    with raises(ValueError, r"^learnable_sink: must be on q's device"):
        flash_attn_func(q, k, v, learnable_sink=torch.zeros(4))
    with raises(ValueError, r"^learnable_sink: expected a tensor"):
        flash_attn_func(q, k, v, learnable_sink=[0.0] * 4)
    with raises(ValueError, r"^learnable_sink: no kernel takes a learnable sink and a softcap"):
        flash_attn_func(q, k, v, softcap=5.0, learnable_sink=sink)
    with raises(ValueError, r"^window_size: \(16, 4\) with softcap"):
        flash_attn_func(q, k, v, softcap=5.0, window_size=(16, 4))
    with raises(ValueError, r"^window_size: \(-1, 4\) with learnable_sink"):
        flash_attn_func(q, k, v, learnable_sink=sink, window_size=(-1, 4))
    with raises(ValueError, r"^q: head dim 96 has no kernel"):
        flash_attn_func(*_qkv(d=96), window_size=(8, 8))
    # the masked backward (chapter 06's sm90a one): d = 64 and 128 through the fakes, gradients of
    # the inputs' shapes (the sink's too); d = 256 has a forward but no backward, refused at the forward
    for kwargs in (dict(window_size=(8, 0)), dict(softcap=3.0), dict(learnable_sink=sink.clone().requires_grad_())):
        leaves = [t.clone().requires_grad_() for t in (q, k, v)]
        flash_attn_func(*leaves, **kwargs).float().sum().backward()
        assert [t.grad.shape for t in leaves] == [q.shape, k.shape, v.shape]
        if "learnable_sink" in kwargs:
            assert kwargs["learnable_sink"].grad.shape == (4,) and kwargs["learnable_sink"].grad.dtype == torch.float32
    q256, k256, v256 = _qkv(d=256)
    for kwargs in (dict(window_size=(8, 0)), dict(softcap=3.0), dict(learnable_sink=sink)):
        leaves = [t.clone().requires_grad_() for t in (q256, k256, v256)]
        with raises(ValueError, r"^q: head dim 256 has a forward kernel but no backward kernel"):
            flash_attn_func(*leaves, **kwargs)
        with torch.no_grad():
            flash_attn_func(*leaves, **kwargs)
    with raises(ValueError, r"no backward kernel"):
        flash_attn_func(q256, k256, v256, learnable_sink=sink.clone().requires_grad_())
    # a window that is only causal keeps chapter 05's backward
    leaves = [t.clone().requires_grad_() for t in (q, k, v)]
    flash_attn_func(*leaves, window_size=(-1, 0)).float().sum().backward()
    assert leaves[0].grad.shape == q.shape


def _packed(device="meta", total=300, hq=4, hkv=2, d=64, dtype=None):
    dtype = dtype or BF16
    return (torch.zeros(total, hq, d, dtype=dtype, device=device),
            torch.zeros(total, hkv, d, dtype=dtype, device=device),
            torch.zeros(total, hkv, d, dtype=dtype, device=device))


def test_varlen_fake_shapes_and_compile():
    need_torch()
    q, k, v = _packed()
    cu = torch.tensor([0, 1, 100, 300], dtype=torch.int32)
    for dev in ("meta", "cpu"):  # values unknown on meta; read and checked on the CPU
        c = cu.to(dev)
        o, lse = flash_attn_varlen_func(q, k, v, c, c, 200, 200, causal=True, return_lse=True)
        assert o.shape == q.shape and o.dtype == BF16 and lse.shape == (4, 300) and lse.dtype == torch.float32
    cm = cu.to("meta")
    code = _traced_ops(lambda q, k, v, c: flash_attn_varlen_func(q, k, v, c, c, 200, 200) * 2, q, k, v, cm)
    assert "attn_lineage.varlen_fwd" in code, code
    torch._dynamo.reset()
    f = torch.compile(lambda q, k, v, c: flash_attn_varlen_func(q, k, v, c, c, 200, 200, return_lse=True),
                      fullgraph=True, backend="aot_eager")
    o, lse = f(q, k, v, cm)
    assert o.shape == q.shape and lse.shape == (4, 300)
    from torch._subclasses.fake_tensor import FakeTensorMode
    with FakeTensorMode(allow_non_fake_inputs=True) as mode:
        fq, fk, fv, fc = (mode.from_tensor(t) for t in (q, k, v, cm))
        fo, flse = torch.ops.attn_lineage.varlen_fwd(fq, fk, fv, fc, False, 0.125)
        assert fo.shape == q.shape and flse.shape == (4, 300)
        qt, kt, vt = (mode.from_tensor(t.transpose(1, 2).contiguous()) for t in _qkv())
        fo, flse = torch.ops.attn_lineage.masked_fwd(qt, kt, vt, None, True, 0.125, 16, 0, 0.0)
        assert fo.shape == qt.shape and flse.shape == qt.shape[:3]


def test_varlen_argument_checks():
    need_torch()
    f = flash_attn_varlen_func
    q, k, v = _packed()
    cu = torch.tensor([0, 1, 100, 300], dtype=torch.int32)
    with raises(ValueError, r"^q: expected a 3-d tensor"):
        f(q[None], k, v, cu, cu, 200, 200)
    with raises(ValueError, r"^k: 299 tokens, q has 300"):
        f(q, k[1:], v[1:], cu, cu, 200, 200)
    with raises(ValueError, r"^cu_seqlens_q: expected an int32 tensor"):
        f(q, k, v, cu.long(), cu, 200, 200)
    with raises(ValueError, r"^cu_seqlens_k: expected an int32 tensor"):
        f(q, k, v, cu, [0, 300], 200, 200)
    with raises(ValueError, r"^cu_seqlens_q: must run from 0 to the total tokens 300"):
        f(q, k, v, cu[:-1], cu, 200, 200)
    with raises(ValueError, r"^cu_seqlens_q: every document needs at least one token"):
        bad = torch.tensor([0, 100, 100, 300], dtype=torch.int32)
        f(q, k, v, bad, bad, 200, 200)
    with raises(ValueError, r"^cu_seqlens_k: must equal cu_seqlens_q"):
        f(q, k, v, cu, torch.tensor([0, 2, 100, 300], dtype=torch.int32), 200, 200)
    with raises(ValueError, r"^max_seqlen_k: 150 is below the longest document \(200"):
        f(q, k, v, cu, cu, 200, 150)
    with raises(ValueError, r"^max_seqlen_q: expected an int >= 1"):
        f(q, k, v, cu, cu, None, 200)
    with raises(ValueError, r"^window_size: .*no window"):
        f(q, k, v, cu, cu, 200, 200, window_size=(8, 0))
    with raises(ValueError, r"^softcap: .*no softcap"):
        f(q, k, v, cu, cu, 200, 200, softcap=2.0)
    with raises(ValueError, r"^learnable_sink: .*no learnable sink"):
        f(q, k, v, cu, cu, 200, 200, learnable_sink=torch.zeros(4, device="meta"))
    with raises(ValueError, r"^causal: expected a bool"):
        f(q, k, v, cu, cu, 200, 200, causal=1)
    with raises(ValueError, r"^q: head dim 32 has no kernel"):
        f(*_packed(d=32), cu, cu, 200, 200)
    with raises(ValueError, r"^k: 3 KV heads"):
        f(*_packed(hkv=3), cu, cu, 200, 200)
    with raises(ValueError, r"^q, k, v: .*no backward"):
        f(q.clone().requires_grad_(), k, v, cu, cu, 200, 200)
    with raises(ValueError, r"^q: the kernels run on a CUDA device"):
        f(*_packed("cpu"), cu, cu, 200, 200)


def test_reference_masks_against_formulas():
    """The reference's window, document, softcap and sink against their definitions, entry by entry."""
    need_torch()
    vis = R.window_visible(5, 8, 2, 1, "cpu")  # q = i + 3
    for i in range(5):
        for j in range(8):
            assert bool(vis[i, j]) == (i + 3 - 2 <= j <= i + 3 + 1)
    assert R.window_visible(4, 4, -1, 0, "cpu").equal(torch.ones(4, 4, dtype=torch.bool).tril())
    assert R.window_visible(3, 6, -1, -1, "cpu").all()
    d = R.document_visible([0, 1, 4, 6], True, "cpu")
    doc = [0, 1, 1, 1, 2, 2]
    for i in range(6):
        for j in range(6):
            assert bool(d[i, j]) == (doc[i] == doc[j] and j <= i)
    g = torch.Generator().manual_seed(3)
    q, k, v = (torch.randn(1, 2, n, 16, generator=g, dtype=torch.float64) for n in (5, 7, 7))
    sink = torch.tensor([0.5, -1.0], dtype=torch.float64)
    vis = R.window_visible(5, 7, 3, 0, "cpu")
    o, lse = R.forward_reference(q, k, v, False, 0.3, visible=vis, softcap=2.0, sink=sink)
    for h in range(2):
        for i in range(5):
            s = [2.0 * math.tanh(0.3 * float(q[0, h, i] @ k[0, h, j]) / 2.0) for j in range(7) if vis[i, j]]
            js = [j for j in range(7) if vis[i, j]]
            den = sum(math.exp(x) for x in s) + math.exp(float(sink[h]))
            assert abs(float(lse[0, h, i]) - math.log(den)) < 1e-12
            want = sum(math.exp(x) * v[0, h, j] for x, j in zip(s, js)) / den
            assert torch.allclose(o[0, h, i], want, atol=1e-12)
    # an empty row with a sink: O = 0, LSE = the sink
    none = torch.zeros(5, 7, dtype=torch.bool)
    o, lse = R.forward_reference(q, k, v, False, 0.3, visible=none, sink=sink)
    assert torch.all(o == 0) and torch.allclose(lse[0, :, 0], sink)
    n_o, n_lse, *_ = R.naive_same_precision(q.float(), k.float(), v.float(), None, False, 0.3, visible=none,
                                            sink=sink)
    assert torch.all(n_o == 0) and torch.allclose(n_lse[0, :, 0], sink.float())


# ----------------------------------------------------------------------------- MLA decode

def _mla(device="meta", b=2, nq=3, h=16, nk=100, dq=576, dkv=576, dtype=None):
    dtype = dtype or BF16
    return (torch.zeros(b, nq, h, dq, dtype=dtype, device=device),
            torch.zeros(b, nk, dkv, dtype=dtype, device=device))


def test_mla_decode_fake_shapes_and_compile():
    need_torch()
    from attn_lineage import mla_decode
    q, kv = _mla()
    o = mla_decode(q, kv)
    assert o.shape == (2, 3, 16, 512) and o.dtype == BF16 and o.device.type == "meta"
    code = _traced_ops(lambda q, kv: mla_decode(q, kv) * 2, q, kv)
    assert "attn_lineage.mla_decode" in code, code
    o1 = mla_decode(*_mla(nq=1), causal=False)  # one query token: causal or not is the same
    assert o1.shape == (2, 1, 16, 512)


def test_mla_decode_argument_checks():
    need_torch()
    from attn_lineage import mla_decode as f
    q, kv = _mla()
    with raises(ValueError, r"^q: dtype float16 has no kernel"):
        f(q.half(), kv)
    with raises(ValueError, r"^kv_cache: expected a torch.Tensor"):
        f(q, None)
    with raises(ValueError, r"^q: expected \[batch, seqlen, heads, 576\]"):
        f(*_mla(dq=512)[:1], kv)
    with raises(ValueError, r"^kv_cache: expected \[batch, seqlen, 576\]"):
        f(q, kv[:, :, None])
    with raises(ValueError, r"^kv_cache: batch 1 differs"):
        f(q, kv[:1])
    with raises(ValueError, r"^q: 5 query tokens, more than the cache's 4"):
        f(*_mla(nq=5, nk=4))
    with raises(ValueError, r"^causal: the MLA decode kernel is causal"):
        f(q, kv, causal=False)
    with raises(ValueError, r"^causal: expected a bool"):
        f(q, kv, causal=0)
    with raises(ValueError, r"^softmax_scale: must be finite"):
        f(q, kv, softmax_scale=-1.0)
    with raises(ValueError, r"no backward"):
        f(q.clone().requires_grad_(), kv)
    with raises(ValueError, r"^q: the kernels run on a CUDA device"):
        f(*_mla("cpu"))
    with raises(ValueError, r"^kv_cache: the kernels run on a CUDA device"):
        f(q, _mla("cpu")[1])
