"""attn_lineage.paged without a GPU or transformers: the paged store's bookkeeping (pages, block
table, lengths) on CPU tensors, and which attention call a prefill and a decode step make, with
stand-in attention functions."""

from types import SimpleNamespace

from harness import need_torch, raises, torch

if torch is not None:
    from attn_lineage.paged import PagedKVCache, active_cache


def _kv(b, hkv, n, d, seed):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(b, hkv, n, d, generator=g).to(torch.bfloat16),
            torch.randn(b, hkv, n, d, generator=g).to(torch.bfloat16))


def test_block_table_spreads_a_sequence_over_distinct_pages():
    need_torch()
    cache = PagedKVCache(3, 70, page_size=16, device="cpu")
    assert cache.max_pages == 5 and cache.capacity == 80
    assert cache.block_table.dtype == torch.int32 and tuple(cache.block_table.shape) == (3, 5)
    flat = cache.block_table.flatten()
    assert len(set(flat.tolist())) == flat.numel() == 15  # no page shared by two (sequence, block) pairs
    assert int(flat.max()) == 14 and int(flat.min()) == 0
    assert (cache.block_table[:, 1] - cache.block_table[:, 0]).abs().min() > 1  # a sequence's pages not adjacent


def test_append_writes_pages_and_advances_lengths():
    need_torch()
    for page_size in (1, 4, 16):
        cache = PagedKVCache(2, 40, page_size=page_size, device="cpu")
        k0, v0 = _kv(2, 3, 13, 8, seed=1)
        cache.append(0, k0, v0)  # a prompt crossing page boundaries
        steps = [_kv(2, 3, 1, 8, seed=10 + i) for i in range(6)]
        for k, v in steps:
            cache.append(0, k, v)
        assert cache.lengths[0] == 19 and cache.cache_seqlens(0).tolist() == [19, 19]
        assert cache.cache_seqlens(0).dtype == torch.int32
        assert tuple(cache.k_pages[0].shape) == (2 * cache.max_pages, 3, page_size, 8)
        k_all = torch.cat([k0] + [k for k, _ in steps], 2)
        v_all = torch.cat([v0] + [v for _, v in steps], 2)
        kg, vg = cache.gather(0)
        assert torch.equal(kg, k_all) and torch.equal(vg, v_all), f"page_size {page_size}"
        # token t of sequence b lies in page block_table[b, t // page_size], slot t % page_size
        for b, t in ((0, 0), (1, 12), (1, 13), (0, 18)):
            page = int(cache.block_table[b, t // page_size])
            assert torch.equal(cache.k_pages[0][page, :, t % page_size], k_all[b, :, t]), (page_size, b, t)
        assert 1 not in cache.lengths  # layers are allocated on their first write


def test_append_refuses_overflow_and_wrong_shapes():
    need_torch()
    cache = PagedKVCache(2, 8, page_size=4, device="cpu")
    k, v = _kv(2, 2, 8, 8, seed=2)
    cache.append(0, k, v)
    with raises(ValueError, r"^key: 8 \+ 1 tokens exceed the cache's 8"):
        cache.append(0, k[:, :, :1], v[:, :, :1])
    with raises(ValueError, r"^key: layer 0 holds 2 heads of dim 8"):
        cache.append(0, *_kv(2, 1, 1, 8, seed=3))
    with raises(ValueError, r"^key, value"):
        cache.append(1, *_kv(3, 2, 1, 8, seed=4))
    with raises(ValueError, r"^page_size"):
        PagedKVCache(2, 8, page_size=12, device="cpu")


def test_attend_prefills_then_decodes_through_the_pages():
    need_torch()
    cache = PagedKVCache(2, 32, page_size=4, device="cpu")
    calls = []
    cache.prefill_fn = lambda q, k, v, causal, softmax_scale: calls.append(("prefill", causal, k.shape[2])) or \
        torch.zeros(q.shape[0], q.shape[2], q.shape[1], q.shape[3])

    def decode(q, k_pages, v_pages, seqlens, block_table, softmax_scale, kv_layout):
        calls.append(("decode", kv_layout, seqlens.tolist(), k_pages is cache.k_pages[layer.layer_idx]))
        return torch.zeros(q.shape)

    cache.decode_fn = decode
    layer = SimpleNamespace(layer_idx=1)
    q = torch.zeros(2, 4, 10, 8, dtype=torch.bfloat16)
    k, v = _kv(2, 2, 10, 8, seed=5)
    assert active_cache() is None
    with cache.active():
        assert active_cache() is cache
        o = cache.attend(layer, q, k, v)
        assert tuple(o.shape) == (2, 10, 4, 8)
        for _ in range(3):
            o = cache.attend(layer, q[:, :, :1], *_kv(2, 2, 1, 8, seed=6))
            assert tuple(o.shape) == (2, 1, 4, 8)
        with raises(ValueError, r"^query: 2 query and 2 key tokens at layer 1 holding 13"):
            cache.attend(layer, q[:, :, :2], k[:, :, :2], v[:, :, :2])
        with raises(ValueError, r"^module: SimpleNamespace has no integer layer_idx"):
            cache.attend(SimpleNamespace(), q, k, v)
    assert active_cache() is None
    assert calls == [("prefill", True, 10), ("decode", "HND", [11, 11], True), ("decode", "HND", [12, 12], True),
                     ("decode", "HND", [13, 13], True)]


def test_the_lineage_attention_function_hands_its_call_to_the_active_cache():
    need_torch()
    import attn_lineage.hf as hf  # needs no transformers until register()
    cache = PagedKVCache(1, 8, page_size=2, device="cpu")
    seen = []
    cache.prefill_fn = lambda q, k, v, causal, softmax_scale: seen.append(softmax_scale) or q.transpose(1, 2)
    layer = SimpleNamespace(layer_idx=0, is_causal=True)
    q = torch.zeros(1, 2, 3, 8, dtype=torch.bfloat16)
    k, v = _kv(1, 1, 3, 8, seed=7)
    with cache.active():
        o, weights = hf.lineage_attention_forward(layer, q, k, v, None, scaling=0.25)
    assert weights is None and tuple(o.shape) == (1, 3, 2, 8) and seen == [0.25]
    assert cache.lengths[0] == 3 and torch.equal(cache.gather(0)[1], v)


def _steps8(seed, n, scale=1.0):
    return [tuple(t * scale for t in _kv(2, 3, 1, 16, seed=seed + i)) for i in range(n)]


def test_8bit_pages_hold_the_values_within_a_step_of_their_grid():
    """fp8 and int8 pages, a prompt across page boundaries then decode tokens, one of them larger
    than everything before it: gather() gives code * scale within one step of the final grid (INT8)
    or E4M3's rounding; the scales are [pages, Hkv] fp32, the codes E4M3 or int8 in [-127, 127]."""
    need_torch()
    for kv_dtype, code_dtype in (("fp8", torch.float8_e4m3fn), ("int8", torch.int8)):
        for page_size in (8, 16):
            cache = PagedKVCache(2, 48, page_size=page_size, device="cpu", kv_dtype=kv_dtype)
            k0, v0 = _kv(2, 3, 21, 16, seed=1)
            cache.append(0, k0, v0)
            steps = _steps8(20, 4) + _steps8(30, 1, scale=5.0) + _steps8(40, 3)
            for k, v in steps:
                cache.append(0, k, v)
            assert cache.k_pages[0].dtype == code_dtype and cache.k_scales[0].dtype == torch.float32
            assert tuple(cache.k_scales[0].shape) == (2 * cache.max_pages, 3)
            assert cache.lengths[0] == 29 and cache.cache_seqlens(0).tolist() == [29, 29]
            k_all = torch.cat([k0] + [k for k, _ in steps], 2).float()
            v_all = torch.cat([v0] + [v for _, v in steps], 2).float()
            for got, want, scales in zip(cache.gather(0), (k_all, v_all), (cache.k_scales[0], cache.v_scales[0])):
                # each token's scale: its page's (block_table[b, t // page_size]) for its head
                t = torch.arange(29)
                page = cache.block_table[:, t // page_size].long()                   # [2, 29]
                step = scales[page].permute(0, 2, 1)[..., None].expand_as(got)       # [2, 3, 29, 16]
                err = (got - want).abs()
                if kv_dtype == "int8":
                    assert bool((err <= step * 1.0001).all()), (page_size, float((err / step).max()))
                else:
                    assert bool((err <= want.abs() * 2.0 ** -3 + step * 2.0 ** -8).all()), page_size


def test_8bit_page_scale_rule():
    """A page's first write sets its scale to amax / Q; a token under the scale keeps it and the
    earlier codes; a token three times the page's amax doubles the scale twice (x4), and the earlier
    slots are quantised again from their values."""
    need_torch()
    cache = PagedKVCache(1, 16, page_size=8, device="cpu", kv_dtype="int8")
    x = torch.zeros(1, 1, 1, 4)
    x[..., 0] = 2.0
    cache.append(0, x, x)
    page = int(cache.block_table[0, 0])
    s0 = float(cache.k_scales[0][page, 0])
    assert s0 == float(torch.tensor(2.0) / 127) and int(cache.k_pages[0][page, 0, 0, 0]) == 127
    before = cache.k_pages[0][page].clone()
    y = torch.full((1, 1, 1, 4), 0.75)
    cache.append(0, y, y)
    assert float(cache.k_scales[0][page, 0]) == s0 and torch.equal(cache.k_pages[0][page, :, :1], before[:, :1])
    assert int(cache.k_pages[0][page, 0, 1, 0]) == 48  # 0.75 / s0 = 47.6
    z = torch.full((1, 1, 1, 4), -6.0)  # 3x the amax: the scale grows by 2^2
    cache.append(0, z, z)
    s2 = float(cache.k_scales[0][page, 0])
    assert s2 == s0 * 4
    assert int(cache.k_pages[0][page, 0, 0, 0]) == round(127 / 4)  # 2.0 again from its value
    assert int(cache.k_pages[0][page, 0, 2, 0]) == round(-6.0 / s2)
    kg, _ = cache.gather(0)
    assert int(cache.k_pages[0][page, 0, 1, 0]) == 12  # 48 s0 / (4 s0)
    assert torch.allclose(kg[0, 0, :, 0], torch.tensor([2.0, 0.75, -6.0]), atol=s2 / 2 + 1e-6)
    # an all-zero write to a fresh page keeps scale 0 and zero codes (never 0 * inf)
    zero = PagedKVCache(1, 16, page_size=8, device="cpu", kv_dtype="fp8")
    zero.append(0, torch.zeros(1, 2, 3, 4), torch.zeros(1, 2, 3, 4))
    assert bool((zero.k_scales[0] == 0).all()) and bool((zero.gather(0)[0] == 0).all())
    with raises(ValueError, r"^page_size: 4; 8-bit pages hold at least 8 tokens"):
        PagedKVCache(1, 16, page_size=4, device="cpu", kv_dtype="int8")
    with raises(ValueError, r"^kv_dtype"):
        PagedKVCache(1, 16, page_size=8, device="cpu", kv_dtype="int4")


def test_8bit_decode_passes_the_scales():
    need_torch()
    cache = PagedKVCache(2, 32, page_size=8, device="cpu", kv_dtype="fp8")
    seen = []
    cache.prefill_fn = lambda q, k, v, causal, softmax_scale: torch.zeros(q.shape[0], q.shape[2], q.shape[1],
                                                                          q.shape[3])

    def decode(q, k_pages, v_pages, seqlens, block_table, softmax_scale, kv_layout, k_scale, v_scale):
        seen.append((k_pages.dtype, k_scale is cache.k_scales[0], v_scale is cache.v_scales[0], seqlens.tolist()))
        return torch.zeros(q.shape)

    cache.decode_fn = decode
    layer = SimpleNamespace(layer_idx=0)
    q = torch.zeros(2, 4, 10, 16, dtype=torch.bfloat16)
    with cache.active():
        cache.attend(layer, q, *_kv(2, 2, 10, 16, seed=8))
        cache.attend(layer, q[:, :, :1], *_kv(2, 2, 1, 16, seed=9))
    assert seen == [(torch.float8_e4m3fn, True, True, [11, 11])]


def _ref_prefill(query, key, value, causal, softmax_scale):
    o = torch.nn.functional.scaled_dot_product_attention(query, key, value, is_causal=causal, scale=softmax_scale,
                                                         enable_gqa=True)
    return o.transpose(1, 2)


def _ref_decode(q, k_pages, v_pages, seqlens, block_table, softmax_scale, kv_layout):
    """A decode step read through the block table (HND pages, one length a batch): what the
    paged kernel computes, in the pages' dtype's values and fp32 arithmetic."""
    assert kv_layout == "HND"
    n, ps = int(seqlens[0]), k_pages.shape[2]
    pos = torch.arange(n)
    page = block_table[:, pos // ps].long()
    slot = (pos % ps).expand(page.shape[0], n)
    k, v = (p[page, :, slot].transpose(1, 2).float() for p in (k_pages, v_pages))  # [B, Hkv, n, d]
    o = torch.nn.functional.scaled_dot_product_attention(q.transpose(1, 2).float(), k, v, scale=softmax_scale,
                                                         enable_gqa=True)
    return o.transpose(1, 2).to(q.dtype)


def _tiny_llama(impl):
    from transformers import AutoModelForCausalLM, LlamaConfig
    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=256, hidden_size=128, intermediate_size=256, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
                      initializer_range=0.1)
    return AutoModelForCausalLM.from_config(cfg, attn_implementation=impl, dtype=torch.float32).eval()


def test_generate_through_the_pages():
    """model.generate() with the pages as its cache (hf_cache, transformers 5), the attention calls
    replaced by fp32 references that read the pages through the block table: the same greedy
    tokens as SDPA over transformers' own cache; every step a page write, one prefill and one
    decode call a layer a step; what generate() cannot do with pages (beam search) refused."""
    need_torch()
    import importlib.util
    if importlib.util.find_spec("transformers") is None:
        from harness import skip
        skip("transformers is not importable")
    import attn_lineage.hf as hf
    import attn_lineage.paged as paged
    hf.register()
    sdpa, lin = _tiny_llama("sdpa"), _tiny_llama("lineage")
    ids = torch.randint(0, 256, (2, 9), generator=torch.Generator().manual_seed(1))
    new = 12
    kw = dict(do_sample=False, min_new_tokens=new, attention_mask=torch.ones_like(ids), pad_token_id=0)
    want = sdpa.generate(ids, max_new_tokens=new, **kw)
    store = PagedKVCache(2, 9 + new, page_size=4, device="cpu", dtype=torch.float32)
    calls = []
    store.prefill_fn = lambda *a, **kw: calls.append("prefill") or _ref_prefill(*a, **kw)
    store.decode_fn = lambda *a, **kw: calls.append("decode") or _ref_decode(*a, **kw)
    with store.active():
        got = lin.generate(ids, past_key_values=store.hf_cache(2), max_new_tokens=new, **kw)
    assert torch.equal(got, want), (got[:, 9:].tolist(), want[:, 9:].tolist())
    assert calls == ["prefill"] * 2 + ["decode"] * (2 * (new - 1)), calls[:6]
    assert store.lengths == {0: 9 + new - 1, 1: 9 + new - 1} and store._written == {}
    # paged_generate makes the same store (bf16 pages, the package's attention calls: here the
    # references) and returns generate()'s tokens
    kernels = paged.attention_bhnd, paged.flash_attn_with_kvcache
    paged.attention_bhnd, paged.flash_attn_with_kvcache = _ref_prefill, _ref_decode
    try:
        bf16 = paged.paged_generate(lin, ids, max_new_tokens=new, page_size=4, **kw)
        store16 = PagedKVCache(2, 9 + new, page_size=4, device="cpu")
        store16.prefill_fn, store16.decode_fn = _ref_prefill, _ref_decode
        with store16.active():
            manual = lin.generate(ids, past_key_values=store16.hf_cache(2), max_new_tokens=new, **kw)
        assert torch.equal(bf16, manual)
        with raises(ValueError, r"^num_beams: 2; the paged cache holds one sequence a row"):
            paged.paged_generate(lin, ids, max_new_tokens=4, page_size=4, num_beams=2, **kw)
    finally:
        paged.attention_bhnd, paged.flash_attn_with_kvcache = kernels
