"""attn_implementation="lineage" in Hugging Face transformers (python/examples/hf_lineage.py's
checks on a smaller model). Skipped without transformers, a GPU or the library."""

import importlib.util

from harness import need_gpu, raises, skip, torch


def _need_transformers():
    if importlib.util.find_spec("transformers") is None:
        skip("transformers is not importable")


def _llama(impl, dtype, layers=2):
    from transformers import AutoModelForCausalLM, LlamaConfig
    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=512, hidden_size=256, intermediate_size=704, num_hidden_layers=layers,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=1024,
                      initializer_range=0.1)
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
