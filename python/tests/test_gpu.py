"""The kernels through the Python API on a Hopper GPU, against the fp64 reference under the
project's acceptance rule (attn_lineage.reference: common/compare.hpp ported), at awkward
shapes: N not a multiple of the tile, N below one tile, Nq != Nk causal (bottom-right, with
empty rows), several batches and heads, GQA, mean-shifted inputs. Skipped without a GPU, the
C library, or an sm_90 device."""

import math

from harness import need_gpu, raises, torch

if torch is not None:
    from attn_lineage import flash_attn_func
    from attn_lineage import reference as R

# (batch, nq, nk, heads, kv_heads, d, causal)
SHAPES = [
    (2, 1000, 1000, 4, 4, 64, True),     # N not a multiple of any tile
    (1, 77, 77, 2, 2, 128, False),       # N below one tile
    (2, 300, 520, 8, 2, 128, True),      # Nq < Nk causal, GQA 4:1
    (1, 520, 300, 4, 1, 64, True),       # Nq > Nk causal: 220 empty rows, MQA
    (3, 129, 257, 6, 3, 64, False),      # several batches, GQA 2:1
    (1, 200, 333, 2, 2, 256, True),      # d = 256 (forward only)
]


def _inputs(b, nq, nk, hq, hkv, d, dtype, seed, shift=0.0):
    g = torch.Generator(device="cuda").manual_seed(seed)
    q = (torch.randn(b, nq, hq, d, generator=g, device="cuda") + shift).to(dtype)
    k = (torch.randn(b, nk, hkv, d, generator=g, device="cuda") + shift).to(dtype)
    v = torch.randn(b, nk, hkv, d, generator=g, device="cuda").to(dtype)
    do = torch.randn(b, nq, hq, d, generator=g, device="cuda").to(dtype)
    return q, k, v, do


def _bhnd(t):
    return t.transpose(1, 2)


def _check(what, got, ref, naive, dtype, magnitude):
    ok, margin, why = R.accept(got, ref, naive, dtype, magnitude)
    assert ok, f"{what}: {why} (margin {margin:.2f})"
    return margin


def _run_shape(shape, dtype, seed, shift=0.0, scale=None):
    b, nq, nk, hq, hkv, d, causal = shape
    q, k, v, do = _inputs(b, nq, nk, hq, hkv, d, dtype, seed, shift)
    tau = scale if scale is not None else 1.0 / math.sqrt(d)
    backward = d in (64, 128)
    leaves = [t.clone().requires_grad_(backward) for t in (q, k, v)]
    o, lse = flash_attn_func(*leaves, causal=causal, softmax_scale=scale, return_lse=True)
    torch.cuda.synchronize()
    assert o.shape == q.shape and lse.shape == (b, hq, nq)
    o_ref, lse_ref = R.forward_reference(_bhnd(q), _bhnd(k), _bhnd(v), causal, tau)
    dout = _bhnd(do) if backward else None
    n_o, n_lse, *n_grads = R.naive_same_precision(_bhnd(q), _bhnd(k), _bhnd(v), dout, causal, tau)
    tag = f"{shape} {dtype}"
    _check(f"{tag} O", _bhnd(o), o_ref, n_o, dtype, "row")
    _check(f"{tag} LSE", lse, lse_ref, n_lse, dtype, "log")
    if not backward:
        return
    o.backward(do)
    torch.cuda.synchronize()
    refs = R.backward_reference(_bhnd(q), _bhnd(k), _bhnd(v), dout, causal, tau)
    for name, leaf, ref, naive in zip(("dQ", "dK", "dV"), leaves, refs, n_grads):
        assert leaf.grad.shape == leaf.shape and leaf.grad.dtype == dtype
        _check(f"{tag} {name}", _bhnd(leaf.grad), ref, naive, dtype, "tensor")


def test_forward_backward_bf16():
    need_gpu()
    for i, shape in enumerate(SHAPES):
        _run_shape(shape, torch.bfloat16, seed=i)


def test_forward_backward_fp16_mean_shifted():
    need_gpu()
    for i, shape in enumerate(SHAPES[:4]):
        _run_shape(shape, torch.float16, seed=100 + i, shift=0.5)


def test_softmax_scale():
    need_gpu()
    _run_shape((1, 200, 200, 2, 2, 64, True), torch.bfloat16, seed=7, scale=0.05)


def test_empty_rows_are_zero_with_minus_inf_lse():
    need_gpu()
    q, k, v, _ = _inputs(1, 300, 100, 2, 2, 64, torch.bfloat16, seed=3)
    o, lse = flash_attn_func(q, k, v, causal=True, return_lse=True)
    assert torch.all(o[:, :200] == 0)
    assert torch.all(lse[:, :, :200] == -math.inf)


def test_side_stream_and_non_contiguous_inputs():
    """Work on a side stream is ordered by that stream; [B, H, N, d] views go in as they are."""
    need_gpu()
    q, k, v, _ = _inputs(2, 333, 333, 4, 2, 128, torch.bfloat16, seed=11)
    want = flash_attn_func(q, k, v, causal=True)
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        qs = q * 1  # written on the side stream just before the call
        got = flash_attn_func(qs, k, v, causal=True)
        got2 = flash_attn_func(qs.transpose(1, 2).contiguous().transpose(1, 2), k, v, causal=True)
    torch.cuda.current_stream().wait_stream(s)
    torch.cuda.synchronize()
    assert torch.equal(got, want) and torch.equal(got2, want)


def test_compiled_matches_eager():
    need_gpu()
    q, k, v, do = _inputs(1, 257, 257, 4, 2, 64, torch.bfloat16, seed=5)

    def f(q, k, v):
        return flash_attn_func(q, k, v, causal=True) * 2

    torch._dynamo.reset()
    compiled = torch.compile(f, fullgraph=True)
    leaves = [t.clone().requires_grad_() for t in (q, k, v)]
    leaves_c = [t.clone().requires_grad_() for t in (q, k, v)]
    out, out_c = f(*leaves), compiled(*leaves_c)
    out.backward(do)
    out_c.backward(do)
    assert torch.equal(out, out_c)
    for a, c in zip(leaves, leaves_c):
        # dQ's adds come in any order (not deterministic): equal up to the last bits
        assert torch.allclose(a.grad.float(), c.grad.float(), rtol=1e-2, atol=1e-2)


def test_gpu_argument_errors():
    need_gpu()
    q, k, v, _ = _inputs(1, 64, 64, 4, 2, 64, torch.bfloat16, seed=1)
    with raises(ValueError, r"^k: the kernels run on a CUDA device, got a cpu tensor"):
        flash_attn_func(q, k.cpu(), v.cpu())
    with raises(ValueError, r"^k: 3 KV heads"):
        flash_attn_func(q, k[:, :, :1].expand(-1, -1, 3, -1), v[:, :, :1].expand(-1, -1, 3, -1))
    with raises(ValueError, r"^q: head dim 32"):
        flash_attn_func(q[..., :32], k[..., :32], v[..., :32])


# ----------------------------------------------------------------------------- paged decode

def _paged_case(b, hq, hkv, d, page_size, lens, seed, layout):
    """A shuffled page pool holding each sequence's keys, and the same keys contiguous."""
    g = torch.Generator(device="cuda").manual_seed(seed)
    max_pages = max(-(-n // page_size) for n in lens) + 1
    pages = b * max_pages + 3
    perm = torch.randperm(pages, generator=g, device="cuda").to(torch.int32)
    table = perm[: b * max_pages].reshape(b, max_pages).contiguous()
    pool_k = torch.randn(pages, hkv, page_size, d, generator=g, device="cuda").to(torch.bfloat16)
    pool_v = torch.randn(pages, hkv, page_size, d, generator=g, device="cuda").to(torch.bfloat16)
    q = torch.randn(b, 1, hq, d, generator=g, device="cuda").to(torch.bfloat16)
    ks, vs = [], []
    for s, n in enumerate(lens):
        rows = table[s].long()
        ks.append(pool_k[rows].transpose(0, 1).reshape(hkv, -1, d)[:, :n])  # [Hkv, n, d]
        vs.append(pool_v[rows].transpose(0, 1).reshape(hkv, -1, d)[:, :n])
    if layout == "NHD":
        pool_k, pool_v = (t.transpose(1, 2).contiguous() for t in (pool_k, pool_v))
    lens_t = torch.tensor(lens, dtype=torch.int32, device="cuda")
    return q, pool_k, pool_v, lens_t, table, ks, vs


def _decode_case(b, hq, hkv, d, page_size, lens, seed, layout="HND"):
    from attn_lineage import flash_attn_with_kvcache
    q, pk, pv, lens_t, table, ks, vs = _paged_case(b, hq, hkv, d, page_size, lens, seed, layout)
    o, lse = flash_attn_with_kvcache(q, pk, pv, lens_t, table, return_softmax_lse=True, kv_layout=layout)
    _check_decode(q, o, lse, ks, vs, f"decode page {page_size} {layout}")


def _check_decode(q, o, lse, ks, vs, tag):
    """Each sequence of a decode step its own problem (Nq = 1, Nk = its length, keys ks[s] and
    values vs[s] [Hkv, n, d]): O and the LSE against the fp64 reference under the rule."""
    torch.cuda.synchronize()
    b, _, hq, d = q.shape
    assert o.shape == q.shape and lse.shape == (b, hq, 1)
    tau = 1.0 / math.sqrt(d)
    for s in range(b):
        qs = q[s].transpose(0, 1).unsqueeze(0)  # [1, Hq, 1, d]
        k, v = ks[s].unsqueeze(0), vs[s].unsqueeze(0)
        o_ref, lse_ref = R.forward_reference(qs, k, v, False, tau)
        n_o, n_lse, *_ = R.naive_same_precision(qs, k, v, None, False, tau)
        what = f"{tag} b{s} len {k.shape[2]}"
        _check(f"{what} O", o[s].transpose(0, 1).unsqueeze(0), o_ref, n_o, torch.bfloat16, "row")
        _check(f"{what} LSE", lse[s].reshape(1, hq, 1), lse_ref, n_lse, torch.bfloat16, "log")


def test_paged_decode_page_size_1_and_256():
    need_gpu()
    _decode_case(3, 8, 2, 128, 1, [1, 77, 300], seed=21)
    _decode_case(2, 4, 4, 64, 256, [1000, 3], seed=22)


def test_paged_decode_long_ragged_gqa_fa_layout():
    need_gpu()
    _decode_case(4, 32, 4, 128, 16, [5000, 17, 2049, 64], seed=23, layout="NHD")
    _decode_case(2, 16, 1, 64, 64, [33000, 129], seed=24)


def _decode8_case(b, hq, hkv, page_size, lens, seed, kv_dtype, layout="HND"):
    """8-bit pages: a bf16 pool quantised by quantize_kv_pages (one scale per page and KV head),
    the kernel against the fp64 reference on the dequantised values, code * scale."""
    from attn_lineage import dequantize_kv_pages, flash_attn_with_kvcache, quantize_kv_pages
    d = 128
    q, pk, pv, lens_t, table, _, _ = _paged_case(b, hq, hkv, d, page_size, lens, seed, layout)
    # outlier channels and a page of zeros: scales that differ by pages and heads, and scale 0
    pk[..., 5] *= 8
    pv[3] = 0
    (kc, ks), (vc, vs) = quantize_kv_pages(pk, kv_dtype, layout), quantize_kv_pages(pv, kv_dtype, layout)
    assert ks.shape == vs.shape == (pk.shape[0], hkv) and bool((vs[3] == 0).all())
    o, lse = flash_attn_with_kvcache(q, kc, vc, lens_t, table, return_softmax_lse=True, kv_layout=layout, k_scale=ks,
                                     v_scale=vs)
    kd, vd = dequantize_kv_pages(kc, ks, layout), dequantize_kv_pages(vc, vs, layout)
    if layout == "NHD":
        kd, vd = kd.transpose(1, 2), vd.transpose(1, 2)
    keys, values = [], []
    for s in range(b):  # each sequence's keys and values [Hkv, n, d] fp32, read through its block table
        rows = table[s].long()
        keys.append(kd[rows].transpose(0, 1).reshape(hkv, -1, d)[:, :lens[s]])
        values.append(vd[rows].transpose(0, 1).reshape(hkv, -1, d)[:, :lens[s]])
    _check_decode(q, o, lse, keys, values, f"{kv_dtype} decode page {page_size} {layout}")


def test_paged_decode_8bit_pages():
    need_gpu()
    _decode8_case(3, 8, 2, 8, [1, 77, 300], 31, "fp8")                        # the smallest page, GQA 4:1
    _decode8_case(4, 32, 4, 16, [5000, 17, 2049, 64], 32, "int8", "NHD")     # FlashAttention's layout
    _decode8_case(2, 16, 1, 64, [33000, 129], 33, "fp8", "NHD")               # MQA, long: three blocks an SM
    # long splits for every block: the four-blocks-an-SM row of the final kernel's table
    _decode8_case(8, 32, 8, 256, [32768, 1, 20000, 300, 32768, 7, 16000, 9000], 34, "int8")


def test_paged_decode_8bit_compiles_and_matches_the_dequantised_bf16_pages():
    """The same pool as codes and as bf16 values (code * scale rounded to bf16): the two kernels
    agree to bf16's rounding of those values; and torch.compile traces the 8-bit call whole."""
    need_gpu()
    from attn_lineage import dequantize_kv_pages, flash_attn_with_kvcache, quantize_kv_pages
    q, pk, pv, lens_t, table, _, _ = _paged_case(2, 8, 2, 128, 16, [100, 2000], 35, "HND")
    for kv_dtype in ("fp8", "int8"):
        (kc, ks), (vc, vs) = quantize_kv_pages(pk, kv_dtype, "HND"), quantize_kv_pages(pv, kv_dtype, "HND")
        f = lambda *a: flash_attn_with_kvcache(*a, kv_layout="HND", k_scale=ks, v_scale=vs)  # noqa: E731
        torch._dynamo.reset()
        o8 = f(q, kc, vc, lens_t, table)
        assert torch.equal(torch.compile(f, fullgraph=True)(q, kc, vc, lens_t, table), o8)
        kb, vb = (dequantize_kv_pages(c, sc, "HND").to(torch.bfloat16) for c, sc in ((kc, ks), (vc, vs)))
        ob = flash_attn_with_kvcache(q, kb, vb, lens_t, table, kv_layout="HND")
        err = (o8.float() - ob.float()).abs().max().item()
        assert err < 0.02, f"{kv_dtype}: 8-bit and bf16 pages of the same values differ by {err}"


def test_paged_decode_compiles():
    need_gpu()
    from attn_lineage import flash_attn_with_kvcache
    q, pk, pv, lens_t, table, _, _ = _paged_case(2, 8, 2, 128, 16, [100, 200], 25, "HND")
    f = lambda *a: flash_attn_with_kvcache(*a, kv_layout="HND")  # noqa: E731
    torch._dynamo.reset()
    assert torch.equal(torch.compile(f, fullgraph=True)(q, pk, pv, lens_t, table), f(q, pk, pv, lens_t, table))
