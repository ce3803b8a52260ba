"""The Python layer without a GPU: argument checks, the fake (meta) implementations, autograd
wiring through the fake backward, and torch.compile tracing without graph breaks."""

from harness import need_torch, raises, torch

if torch is not None:
    import attn_lineage
    from attn_lineage import flash_attn_func

BF16 = torch.bfloat16 if torch is not None else None


def _qkv(device="cpu", dtype=None, b=2, nq=100, nk=70, hq=4, hkv=2, d=64):
    dtype = dtype or torch.bfloat16
    q = torch.zeros(b, nq, hq, d, dtype=dtype, device=device)
    k = torch.zeros(b, nk, hkv, d, dtype=dtype, device=device)
    v = torch.zeros(b, nk, hkv, d, dtype=dtype, device=device)
    return q, k, v


def test_cpu_tensors_are_refused():
    need_torch()
    q, k, v = _qkv()
    with raises(ValueError, r"^q: .*CUDA device.*cpu"):
        flash_attn_func(q, k, v)


def test_cpu_k_is_refused_when_q_is_meta():
    need_torch()
    q, _, _ = _qkv("meta")
    _, k, v = _qkv()
    with raises(ValueError, r"^k: .*CUDA device"):
        flash_attn_func(q, k, v)


def test_wrong_dtype():
    need_torch()
    q, k, v = _qkv(dtype=torch.float32)
    with raises(ValueError, r"^q: dtype float32 has no kernel"):
        flash_attn_func(q, k, v)
    q, k, v = _qkv()
    with raises(ValueError, r"^k, v: dtypes must match"):
        flash_attn_func(q, k.half(), v.half())


def test_wrong_rank_and_type():
    need_torch()
    q, k, v = _qkv()
    with raises(ValueError, r"^q: expected a 4-d tensor"):
        flash_attn_func(q[0], k, v)
    with raises(ValueError, r"^v: expected a torch.Tensor"):
        flash_attn_func(q, k, [1, 2])


def test_head_dim_without_kernel():
    need_torch()
    q, k, v = _qkv(d=96)
    with raises(ValueError, r"^q: head dim 96 has no kernel"):
        flash_attn_func(q, k, v)
    q, k, v = _qkv(d=64)
    with raises(ValueError, r"^k: head dim 128 differs"):
        flash_attn_func(q, torch.zeros(2, 70, 2, 128, dtype=BF16), torch.zeros(2, 70, 2, 128, dtype=BF16))


def test_backward_head_dim_refused_at_the_forward():
    need_torch()
    q, k, v = _qkv("meta", d=256)
    q.requires_grad_()
    with raises(ValueError, r"^q: head dim 256 has a forward kernel but no backward"):
        flash_attn_func(q, k, v)
    with torch.no_grad():  # the forward alone runs at d = 256
        assert flash_attn_func(q, k, v).shape == q.shape


def test_gqa_heads_must_divide():
    need_torch()
    q, k, v = _qkv(hq=4, hkv=3)
    with raises(ValueError, r"^k: 3 KV heads do not divide q's 4 heads"):
        flash_attn_func(q, k, v)


def test_shapes_must_agree():
    need_torch()
    q, k, v = _qkv()
    with raises(ValueError, r"^v: shape .* must equal k's"):
        flash_attn_func(q, k, v[:, :10])
    with raises(ValueError, r"^k: batch 1 differs"):
        flash_attn_func(q, k[:1], v[:1])
    with raises(ValueError, r"positive"):
        flash_attn_func(q[:, :0], k, v)


def test_scalar_arguments():
    need_torch()
    q, k, v = _qkv("meta")
    with raises(ValueError, r"^softmax_scale: must be finite and > 0"):
        flash_attn_func(q, k, v, softmax_scale=float("nan"))
    with raises(ValueError, r"^softmax_scale: expected a number"):
        flash_attn_func(q, k, v, softmax_scale="x")
    with raises(ValueError, r"^causal: expected a bool"):
        flash_attn_func(q, k, v, causal=1)
    with raises(ValueError, r"^window_size: expected a pair of ints"):
        flash_attn_func(q, k, v, window_size=(3,))
    with raises(ValueError, r"^window_size: each bound must be >= 0, or -1"):
        flash_attn_func(q, k, v, window_size=(-2, 0))
    with raises(ValueError, r"^softcap: must be finite and >= 0"):
        flash_attn_func(q, k, v, softcap=-1.0)


def test_fake_forward_shapes():
    need_torch()
    for dtype in (torch.bfloat16, torch.float16):
        for d in (64, 128, 256):
            q, k, v = _qkv("meta", dtype=dtype, d=d)
            o, lse = flash_attn_func(q, k, v, causal=True, return_lse=True)
            assert o.shape == q.shape and o.dtype == dtype and o.device.type == "meta"
            assert lse.shape == (2, 4, 100) and lse.dtype == torch.float32
            assert not lse.requires_grad


def test_fake_backward_shapes():
    need_torch()
    q, k, v = _qkv("meta", d=128)
    for t in (q, k, v):
        t.requires_grad_()
    o = flash_attn_func(q, k, v, causal=True)
    assert o.requires_grad
    o.sum().backward()
    for t in (q, k, v):
        assert t.grad is not None and t.grad.shape == t.shape and t.grad.dtype == t.dtype


def test_ops_are_registered_with_fakes():
    need_torch()
    q, k, v = (t.transpose(1, 2).contiguous() for t in _qkv("meta"))
    o, lse = torch.ops.attn_lineage.fwd(q, k, v, False, 0.125)
    assert o.shape == q.shape and lse.shape == q.shape[:3]
    dq, dk, dv = torch.ops.attn_lineage.bwd(o, q, k, v, o, lse, False, 0.125)
    assert dq.shape == q.shape and dk.shape == k.shape and dv.shape == v.shape
    # FakeTensorMode (what torch.compile traces with) uses the same fakes
    from torch._subclasses.fake_tensor import FakeTensorMode
    with FakeTensorMode(allow_non_fake_inputs=True) as mode:
        fq, fk, fv = (mode.from_tensor(t) for t in (q, k, v))
        fo, flse = torch.ops.attn_lineage.fwd(fq, fk, fv, True, 0.125)
        assert fo.shape == q.shape and flse.dtype == torch.float32


def _model(q, k, v):
    return flash_attn_func(q, k, v, causal=True).float().square().mean()


def test_compile_has_no_graph_break():
    need_torch()
    q, k, v = _qkv("meta")
    explanation = torch._dynamo.explain(_model)(q, k, v)
    assert explanation.graph_break_count == 0, explanation.break_reasons
    assert explanation.graph_count == 1
    code = explanation.graphs[0].code
    assert "attn_lineage.fwd" in code, code


def test_compile_fullgraph_forward_and_backward():
    need_torch()
    torch._dynamo.reset()
    compiled = torch.compile(_model, fullgraph=True, backend="aot_eager")
    q, k, v = _qkv("meta")
    q.requires_grad_()
    loss = compiled(q, k, v)
    assert loss.shape == ()
    loss.backward()
    assert q.grad.shape == q.shape


def test_library_absent_is_a_clear_error():
    need_torch()
    import os
    from attn_lineage import _lib
    saved = (_lib._lib, os.environ.get("ATTN_LINEAGE_LIB"), os.environ.get("ATTN_LINEAGE_BUILD"))
    if saved[0] is not None:
        return  # already loaded in this process: nothing to prove
    os.environ["ATTN_LINEAGE_LIB"] = "/nonexistent/libattn_lineage_c.so"
    os.environ.pop("ATTN_LINEAGE_BUILD", None)  # a build named there would be found
    try:
        if _lib.candidates()[-1].is_file():
            return  # the repository's build has it; the search would find it
        with raises(_lib.LibraryNotFound, r"\./tutorial python"):
            _lib.load()
        assert not attn_lineage.library_available()
    finally:
        if saved[1] is None:
            del os.environ["ATTN_LINEAGE_LIB"]
        else:
            os.environ["ATTN_LINEAGE_LIB"] = saved[1]
        if saved[2] is not None:
            os.environ["ATTN_LINEAGE_BUILD"] = saved[2]


# ----------------------------------------------------------------------------- paged decode

def _decode_args(device="cpu", b=3, hq=8, hkv=2, d=128, pages=10, page_size=16, max_pages=4, layout="NHD"):
    q = torch.zeros(b, 1, hq, d, dtype=BF16, device=device)
    shape = (pages, page_size, hkv, d) if layout == "NHD" else (pages, hkv, page_size, d)
    kc = torch.zeros(shape, dtype=BF16, device=device)
    vc = torch.zeros(shape, dtype=BF16, device=device)
    table = torch.zeros(b, max_pages, dtype=torch.int32, device=device)
    lens = torch.ones(b, dtype=torch.int32, device=device)
    return q, kc, vc, lens, table


def test_kvcache_argument_checks():
    need_torch()
    from attn_lineage import flash_attn_with_kvcache as f
    q, kc, vc, lens, table = _decode_args()
    with raises(ValueError, r"^q: .*CUDA device"):
        f(q, kc, vc, lens, table)
    with raises(ValueError, r"^q: 2 query tokens"):
        f(torch.cat([q, q], 1), kc, vc, lens, table)
    with raises(ValueError, r"^q: dtype float16"):
        f(q.half(), kc, vc, lens, table)
    with raises(ValueError, r"^q: head dim 256 has no paged decode kernel"):
        q2, kc2, vc2, _, _ = _decode_args(d=256)
        f(q2, kc2, vc2, lens, table)
    with raises(ValueError, r"^k_cache: 3 KV heads"):
        q2, kc2, vc2, _, _ = _decode_args(hkv=3)
        f(q2, kc2, vc2, lens, table)
    with raises(ValueError, r"^k_cache: page size 12 must be a power of two"):
        q2, kc2, vc2, _, _ = _decode_args(page_size=12)
        f(q2, kc2, vc2, lens, table)
    with raises(ValueError, r"^block_table: expected int32"):
        f(q, kc, vc, lens, table.long())
    with raises(ValueError, r"^cache_seqlens: 65 outside"):
        f(q, kc, vc, 65, table)
    with raises(ValueError, r"^cache_seqlens: expected"):
        f(q, kc, vc, lens.long(), table)
    with raises(ValueError, r"^kv_layout"):
        f(q, kc, vc, lens, table, kv_layout="HDN")
    qm, kcm, vcm, lm, tm = _decode_args("meta")
    with raises(ValueError, r"^block_table: the kernels run on a CUDA device, got a cpu"):
        f(qm, kcm, vcm, lm, table)
    with raises(ValueError, r"no backward"):
        f(qm.requires_grad_(), kcm, vcm, lm, tm)


def test_kvcache_fake_shapes_and_compile():
    need_torch()
    from attn_lineage import flash_attn_with_kvcache as f
    for layout in ("NHD", "HND"):
        q, kc, vc, lens, table = _decode_args("meta", layout=layout)
        o, lse = f(q, kc, vc, lens, table, return_softmax_lse=True, kv_layout=layout)
        assert o.shape == q.shape and o.dtype == BF16 and lse.shape == (3, 8, 1) and lse.dtype == torch.float32
    explanation = torch._dynamo.explain(lambda *a: f(*a, kv_layout="HND") * 2)(q, kc, vc, lens, table)
    assert explanation.graph_break_count == 0, explanation.break_reasons
    assert "attn_lineage.paged_decode" in explanation.graphs[0].code


def _decode8_args(device="cpu", kv_dtype=None, d=128, page_size=16, layout="HND", pages=10, hkv=2):
    q, kc, vc, lens, table = _decode_args(device, d=d, page_size=page_size, layout=layout, pages=pages, hkv=hkv)
    kv_dtype = kv_dtype or torch.float8_e4m3fn
    kc, vc = kc.to(kv_dtype), vc.to(kv_dtype)
    ks = torch.zeros(pages, hkv, dtype=torch.float32, device=device)
    return q, kc, vc, lens, table, ks, ks.clone()


def test_kvcache_8bit_argument_checks():
    need_torch()
    from attn_lineage import flash_attn_with_kvcache as f
    q, kc, vc, lens, table, ks, vs = _decode8_args("meta")
    with raises(ValueError, r"^k_scale: 8-bit pages need a float32 tensor \[pages=10, Hkv=2\]"):
        f(q, kc, vc, lens, table, kv_layout="HND")
    with raises(ValueError, r"^v_scale: expected float32 \[pages=10, Hkv=2\], got float16"):
        f(q, kc, vc, lens, table, kv_layout="HND", k_scale=ks, v_scale=vs.half())
    with raises(ValueError, r"^k_scale: expected float32 \[pages=10, Hkv=2\], got float32 \(10, 3\)"):
        f(q, kc, vc, lens, table, kv_layout="HND", k_scale=torch.zeros(10, 3, device="meta"), v_scale=vs)
    with raises(ValueError, r"^v_cache: dtype int8 differs from k_cache's float8_e4m3fn"):
        f(q, kc, vc.to(torch.int8), lens, table, kv_layout="HND", k_scale=ks, v_scale=vs)
    with raises(ValueError, r"^k_cache: dtype float16 has no kernel"):
        f(q, kc.half(), vc.half(), lens, table, kv_layout="HND")
    with raises(ValueError, r"^k_scale, v_scale: only for 8-bit pages"):
        f(q, kc.to(BF16), vc.to(BF16), lens, table, kv_layout="HND", k_scale=ks, v_scale=vs)
    with raises(ValueError, r"^q: head dim 64 has no paged decode kernel over 8-bit pages \(128\)"):
        q2, kc2, vc2, _, _, ks2, vs2 = _decode8_args("meta", d=64)
        f(q2, kc2, vc2, lens, table, kv_layout="HND", k_scale=ks2, v_scale=vs2)
    with raises(ValueError, r"^k_cache: page size 4: the 8-bit decode copies pages of at least 8 tokens"):
        q2, kc2, vc2, _, _, ks2, vs2 = _decode8_args("meta", page_size=4, kv_dtype=torch.int8)
        f(q2, kc2, vc2, lens, table, kv_layout="HND", k_scale=ks2, v_scale=vs2)
    with raises(ValueError, r"^k_scale: the kernels run on a CUDA device, got a cpu tensor"):
        f(q, kc, vc, lens, table, kv_layout="HND", k_scale=torch.zeros(10, 2), v_scale=vs)


def test_kvcache_8bit_fake_shapes_and_compile():
    need_torch()
    from attn_lineage import flash_attn_with_kvcache as f
    for kv_dtype in (torch.float8_e4m3fn, torch.int8):
        for layout in ("NHD", "HND"):
            q, kc, vc, lens, table, ks, vs = _decode8_args("meta", kv_dtype, layout=layout)
            o, lse = f(q, kc, vc, lens, table, return_softmax_lse=True, kv_layout=layout, k_scale=ks, v_scale=vs)
            assert o.shape == q.shape and o.dtype == BF16 and lse.shape == (3, 8, 1) and lse.dtype == torch.float32
    q, kc, vc, lens, table, ks, vs = _decode8_args("meta")
    g = lambda q, kc, vc, lens, table, ks, vs: f(q, kc, vc, lens, table, kv_layout="HND", k_scale=ks,  # noqa: E731
                                                   v_scale=vs) * 2
    explanation = torch._dynamo.explain(g)(q, kc, vc, lens, table, ks, vs)
    assert explanation.graph_break_count == 0, explanation.break_reasons
    assert "attn_lineage.paged_decode_8bit" in explanation.graphs[0].code


def test_quantize_kv_pages():
    """Chapter 07's format: scale = amax / 448 or / 127 per (page, KV head), value = code * scale
    within half a step of the grid (INT8) or E4M3's relative half-ulp; a zero page keeps scale 0;
    both layouts give the same codes and scales."""
    need_torch()
    from attn_lineage import dequantize_kv_pages, quantize_kv_pages
    g = torch.Generator().manual_seed(3)
    x = torch.randn(5, 16, 2, 128, generator=g)  # NHD: [pages, page_size, Hkv, d]
    x[1, :, 0] *= 50                             # one (page, head) with a large scale
    x[2] = 0                                     # a page of zeros
    for kv_dtype, qmax in (("fp8", 448.0), ("int8", 127.0)):
        codes, scale = quantize_kv_pages(x.to(BF16), kv_dtype, "NHD")
        assert codes.dtype == (torch.float8_e4m3fn if kv_dtype == "fp8" else torch.int8)
        assert codes.shape == x.shape and scale.shape == (5, 2) and scale.dtype == torch.float32
        amax = x.to(BF16).float().abs().amax(dim=(1, 3))
        assert torch.allclose(scale, amax / qmax)
        assert bool((scale[2] == 0).all()) and bool((codes[2].float() == 0).all())
        back = dequantize_kv_pages(codes, scale, "NHD")
        err = (back - x.to(BF16).float()).abs()
        step = scale[:, None, :, None].expand_as(err)
        if kv_dtype == "int8":
            assert bool((err <= 0.5 * step + 1e-4 * step).all()), float((err / step.clamp_min(1e-30)).max())
            assert int(codes.abs().max()) == 127
        else:
            # E4M3: 3 mantissa bits (half an ulp, 2^-4 relative), subnormal steps of 2^-9 below 2^-6
            assert bool((err <= torch.maximum(x.to(BF16).float().abs() * 2.0 ** -4, 2.0 ** -10 * step)).all())
        c2, s2 = quantize_kv_pages(x.to(BF16).transpose(1, 2), kv_dtype, "HND")
        assert torch.equal(s2, scale) and torch.equal(c2.transpose(1, 2).float(), codes.float())
    with raises(ValueError, r"^kv_dtype"):
        quantize_kv_pages(x, "int4")
    with raises(ValueError, r"^kv_layout"):
        quantize_kv_pages(x, "fp8", "NDH")


def test_hf_module_imports_without_transformers():
    need_torch()
    import importlib.util
    import attn_lineage.hf as hf  # needs no transformers until register()
    if importlib.util.find_spec("transformers") is None:
        with raises(ImportError, r"transformers"):
            hf.register()
    q = torch.zeros(1, 4, 8, 64, device="meta", dtype=BF16)
    with raises(ValueError, r"^attention_mask"):
        hf.lineage_attention_forward(None, q, q[:, :2], q[:, :2], torch.ones(1, 1, 8, 8, device="meta"))
    with raises(ValueError, r"^local_size"):
        hf.lineage_mask(attention_mask=None, local_size=128)
    with raises(ValueError, r"^attention_mask: padded"):
        hf.lineage_mask(attention_mask=torch.tensor([[True, False]]))
    assert hf.lineage_mask(attention_mask=torch.ones(2, 3, dtype=torch.bool)) is None
    out, weights = hf.lineage_attention_forward(None, q, q[:, :2], q[:, :2], None, scaling=0.1)
    assert out.shape == (1, 8, 4, 64) and weights is None
