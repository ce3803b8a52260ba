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
