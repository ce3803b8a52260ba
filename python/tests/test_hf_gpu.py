"""attn_implementation="lineage" in Hugging Face transformers (python/examples/hf_lineage.py's
checks on a smaller model). Skipped without transformers, a GPU or the library."""

import importlib.util

from harness import need_gpu, raises, skip, torch


def _need_transformers():
    if importlib.util.find_spec("transformers") is None:
        skip("transformers is not importable")


def _llama(impl, dtype, layers=2, head_dim=64):
    from transformers import AutoModelForCausalLM, LlamaConfig
    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=512, hidden_size=4 * head_dim, intermediate_size=11 * head_dim,
                      num_hidden_layers=layers, num_attention_heads=4, num_key_value_heads=2,
                      max_position_embeddings=1024, initializer_range=0.1)
    return AutoModelForCausalLM.from_config(cfg, attn_implementation=impl, torch_dtype=torch.float32).to(
        device="cuda", dtype=dtype)


def test_llama_prefill_and_gradients_match_sdpa():
    need_gpu()
    _need_transformers()
    import attn_lineage.hf as hf
    from attn_lineage.reference import accept
    hf.register()
    ids = torch.randint(0, 512, (2, 333), device="cuda", generator=torch.Generator("cuda").manual_seed(3))
    results = []
    for impl, dtype in (("sdpa", torch.float32), ("sdpa", torch.bfloat16), ("lineage", torch.bfloat16)):
        model = _llama(impl, dtype)
        out = model(ids, labels=ids)
        out.loss.backward()
        results.append((out.logits.detach().float(), {n: p.grad.float() for n, p in model.named_parameters()}))
    (lr, gr), (ls, gs), (ll, gl) = results
    ok, margin, why = accept(ll, lr, ls, torch.bfloat16, "row")
    assert ok, f"logits: {why} (margin {margin:.2f})"
    for name in gr:
        ok, margin, why = accept(gl[name], gr[name], gs[name], torch.bfloat16, "tensor")
        assert ok, f"{name}: {why} (margin {margin:.2f})"


def test_padding_and_dropout_are_refused():
    need_gpu()
    _need_transformers()
    import attn_lineage.hf as hf
    hf.register()
    model = _llama("lineage", torch.bfloat16, layers=1)
    ids = torch.randint(0, 512, (2, 40), device="cuda")
    mask = torch.ones_like(ids)
    mask[1, :5] = 0
    with raises(ValueError, r"attention_mask"):
        model(ids, attention_mask=mask)
    module = model.model.layers[0].self_attn
    q = torch.zeros(1, 4, 8, 64, device="cuda", dtype=torch.bfloat16)
    with raises(ValueError, r"^dropout"):
        hf.lineage_attention_forward(module, q, q[:, :2], q[:, :2], None, dropout=0.1)


def _contiguous_decode_logits(model, prompt, tokens):
    """The logits that pick each of `tokens` when `model` decodes them (teacher-forced) over
    transformers' own contiguous cache: [B, len(tokens), vocab] fp32."""
    with torch.no_grad():
        out = model(prompt, use_cache=True)
        logits, past = [out.logits[:, -1].float()], out.past_key_values
        for i in range(tokens.shape[1] - 1):
            out = model(tokens[:, i:i + 1], past_key_values=past, use_cache=True)
            logits.append(out.logits[:, -1].float())
            past = out.past_key_values
    return torch.stack(logits, 1)


def test_llama_paged_greedy_matches_the_contiguous_cache():
    """paged_greedy's logits at every step (GQA, pages of 1 and 16 tokens) against the fp32 SDPA
    model on the same tokens, with the lineage model over transformers' contiguous cache as the
    yardstick; every decode step must go through flash_attn_with_kvcache."""
    need_gpu()
    _need_transformers()
    import attn_lineage.hf as hf
    import attn_lineage.paged as paged
    from attn_lineage.reference import accept
    hf.register()
    layers, new = 2, 40
    lin, ref = _llama("lineage", torch.bfloat16, layers), _llama("sdpa", torch.float32, layers)
    prompt = torch.randint(0, 512, (2, 21), device="cuda", generator=torch.Generator("cuda").manual_seed(4))
    calls = []
    kernel = paged.flash_attn_with_kvcache
    paged.flash_attn_with_kvcache = lambda *a, **kw: calls.append(a[3].clone()) or kernel(*a, **kw)
    try:
        for page_size in (1, 16):
            calls.clear()
            tokens, logits = paged.paged_greedy(lin, prompt, new_tokens=new, page_size=page_size, return_logits=True)
            assert tuple(tokens.shape) == (2, new) and torch.equal(tokens, logits.argmax(-1))
            assert len(calls) == layers * (new - 1), f"{len(calls)} paged decode calls"
            assert calls[-1].tolist() == [21 + new - 1] * 2, f"last step's cache_seqlens {calls[-1].tolist()}"
            contiguous = _contiguous_decode_logits(lin, prompt, tokens)
            reference = _contiguous_decode_logits(ref, prompt, tokens)
            ok, margin, why = accept(logits, reference, contiguous, torch.bfloat16, "row")
            assert ok, f"page_size {page_size}: {why} (margin {margin:.2f})"
    finally:
        paged.flash_attn_with_kvcache = kernel


def _paged_forced_logits(model, prompt, tokens, page_size, kv_dtype=None, decode_fn=None):
    """paged_greedy's loop with the tokens given (teacher-forced): [B, len(tokens), vocab] fp32."""
    import attn_lineage.paged as paged
    b, n0 = prompt.shape
    cache = paged.PagedKVCache(b, n0 + tokens.shape[1], page_size, device="cuda", kv_dtype=kv_dtype)
    if decode_fn is not None:
        cache.decode_fn = decode_fn
    out = []
    with torch.no_grad(), cache.active():
        pos = torch.arange(n0, device="cuda").expand(b, n0)
        out.append(model(prompt, position_ids=pos, use_cache=False).logits[:, -1].float())
        for i in range(tokens.shape[1] - 1):
            pos = torch.full((b, 1), n0 + i, device="cuda")
            out.append(model(tokens[:, i:i + 1], position_ids=pos, use_cache=False).logits[:, -1].float())
    return torch.stack(out, 1)


def test_llama_greedy_over_8bit_pages():
    """paged_greedy over FP8 and INT8 pages (d = 128: the final 8-bit decode kernel). Each step's
    logits, teacher-forced on the greedy tokens, against the same 8-bit cache read by the bf16
    kernel after dequantising it (code * scale rounded to bf16): the two differ by the kernels'
    arithmetic and bf16's rounding of the values, so by at most 8x what the bf16 path differs
    from itself over pages and over transformers' contiguous cache."""
    need_gpu()
    _need_transformers()
    import attn_lineage.hf as hf
    import attn_lineage.paged as paged
    from attn_lineage import dequantize_kv_pages, flash_attn_with_kvcache
    hf.register()
    model = _llama("lineage", torch.bfloat16, head_dim=128)
    prompt = torch.randint(0, 512, (2, 37), device="cuda", generator=torch.Generator("cuda").manual_seed(5))
    new = 24
    # the bf16 path's own spread: over pages against over the contiguous cache, on its greedy tokens
    tb, lb = paged.paged_greedy(model, prompt, new_tokens=new, page_size=16, return_logits=True)
    spread = (lb - _contiguous_decode_logits(model, prompt, tb)).abs().max().item()

    def dequantised(q, kc, vc, seqlens, table, softmax_scale, kv_layout, k_scale, v_scale):
        kb, vb = (dequantize_kv_pages(c, s, "HND").to(torch.bfloat16) for c, s in ((kc, k_scale), (vc, v_scale)))
        return flash_attn_with_kvcache(q, kb, vb, seqlens, table, softmax_scale=softmax_scale, kv_layout=kv_layout)

    for kv_dtype in ("fp8", "int8"):
        calls = []
        kernel = paged.flash_attn_with_kvcache
        paged.flash_attn_with_kvcache = lambda *a, **kw: calls.append(a[1].dtype) or kernel(*a, **kw)
        try:
            tokens, logits = paged.paged_greedy(model, prompt, new_tokens=new, page_size=16, return_logits=True,
                                                kv_dtype=kv_dtype)
        finally:
            paged.flash_attn_with_kvcache = kernel
        code = torch.float8_e4m3fn if kv_dtype == "fp8" else torch.int8
        assert calls == [code] * (2 * (new - 1)), f"{kv_dtype}: decode calls {calls[:4]}..."
        assert torch.equal(tokens, logits.argmax(-1))
        forced = _paged_forced_logits(model, prompt, tokens, 16, kv_dtype)
        assert torch.equal(forced.argmax(-1), tokens), f"{kv_dtype}: the teacher-forced run picks other tokens"
        ref = _paged_forced_logits(model, prompt, tokens, 16, kv_dtype, decode_fn=dequantised)
        diff = (forced - ref).abs().max().item()
        assert diff <= 8 * spread + 1e-3, (f"{kv_dtype}: 8-bit kernel vs the dequantised pages: {diff:.4g}, "
                                           f"the bf16 path's spread {spread:.4g}")


def test_llama_generate_through_the_pages():
    """model.generate() with the pages as its cache (paged_generate: hf_cache, transformers 5):
    the same greedy tokens as paged_greedy's loop, which runs the same kernels on the same pages,
    over bf16 and INT8 pages (head dim 128: the 8-bit kernel has only that one)."""
    need_gpu()
    _need_transformers()
    import attn_lineage.hf as hf
    import attn_lineage.paged as paged
    hf.register()
    model = _llama("lineage", torch.bfloat16, head_dim=128)
    prompt = torch.randint(0, 512, (2, 29), device="cuda", generator=torch.Generator("cuda").manual_seed(6))
    new = 32
    for kv_dtype in (None, "int8"):
        loop = paged.paged_greedy(model, prompt, new_tokens=new, page_size=16, kv_dtype=kv_dtype)
        out = paged.paged_generate(model, prompt, max_new_tokens=new, page_size=16, kv_dtype=kv_dtype,
                                   do_sample=False, min_new_tokens=new, attention_mask=torch.ones_like(prompt),
                                   pad_token_id=0)
        assert torch.equal(out[:, :29], prompt) and torch.equal(out[:, 29:], loop), (kv_dtype, out[:, 29:], loop)
