#!/usr/bin/env python3
"""A Llama-like and a GPT-2-like model, built from their configs with seeded random weights
(nothing is downloaded), run with attn_implementation="lineage" and compared with SDPA.

    PYTHONPATH=python python3 python/examples/hf_lineage.py [--time]

For each model: prefill logits and one training step's gradients, judged by the project's rule
(attn_lineage.reference.accept) with the fp32 SDPA model as the reference and the bf16 SDPA
model as the yardstick (the kernel's error may be up to twice SDPA's, plus a unit roundoff
of the row); 64 greedy tokens from SDPA's generate() (contiguous cache) and from the lineage
model through paged_greedy (chapter 07's paged decode), with how many of the fp32 model's tokens
each keeps as the yardstick (random weights give near-ties, so one bf16 rounding can flip a
token: a difference passes when the lineage keeps as many as SDPA bf16); whether torch.compile
breaks the graph at the attention. Needs a Hopper GPU, transformers, and the library (./tutorial python).
"""
import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import attn_lineage.hf as hf  # noqa: E402
from attn_lineage.paged import paged_greedy  # noqa: E402
from attn_lineage.reference import accept  # noqa: E402
from transformers import AutoModelForCausalLM, GPT2Config, LlamaConfig  # noqa: E402

CONFIGS = {  # head dim 64 in both; the Llama one with GQA (8 query heads, 2 KV heads)
    "llama": lambda: LlamaConfig(vocab_size=2048, hidden_size=512, intermediate_size=1408, num_hidden_layers=4,
                                 num_attention_heads=8, num_key_value_heads=2, max_position_embeddings=2048,
                                 initializer_range=0.1),
    "gpt2": lambda: GPT2Config(vocab_size=2048, n_embd=512, n_layer=4, n_head=8, n_positions=2048,
                               attn_pdrop=0.0, resid_pdrop=0.0, embd_pdrop=0.0, initializer_range=0.1),
}


def build(kind, impl, dtype):
    torch.manual_seed(0)  # the same weights for every implementation
    model = AutoModelForCausalLM.from_config(CONFIGS[kind](), attn_implementation=impl, torch_dtype=torch.float32)
    return model.to(device="cuda", dtype=dtype)


def step(model, ids):
    model.zero_grad(set_to_none=True)
    out = model(ids, labels=ids)
    out.loss.backward()
    return out.logits.detach().float(), out.loss.item(), {n: p.grad.float() for n, p in model.named_parameters()}


def kept(a, b):
    """How many tokens of a and b [B, T] agree in every sequence before the first difference."""
    return int((a == b).all(dim=0).long().cumprod(0).sum())


def timed(fn, reps=20):
    fn()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(reps):
        fn()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) / reps


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--time", action="store_true", help="also time prefill and a training step (SDPA: cuDNN)")
    args = ap.parse_args()
    print(f"transformers {hf.register()}, torch {torch.__version__}, {torch.cuda.get_device_name()}")
    torch.manual_seed(1)
    ids = torch.randint(0, 2048, (2, 500), device="cuda")  # 500 tokens: not a multiple of any tile
    ok = True
    for kind in CONFIGS:
        ref, sdpa, lin = build(kind, "sdpa", torch.float32), build(kind, "sdpa", torch.bfloat16), build(kind, "lineage", torch.bfloat16)
        (lr, loss_r, gr), (ls, loss_s, gs), (ll, loss_l, gl) = step(ref, ids), step(sdpa, ids), step(lin, ids)
        passed, margin, why = accept(ll, lr, ls, torch.bfloat16, "row")
        print(f"{kind}: prefill logits {'match' if passed else 'DIFFER'} (margin {margin:.2f}) {why}")
        verdicts = {n: accept(gl[n], gr[n], gs[n], torch.bfloat16, "tensor") for n in gr}
        gname = max(verdicts, key=lambda n: verdicts[n][1])
        gpass, (gmargin, gwhy) = all(v[0] for v in verdicts.values()), verdicts[gname][1:]
        print(f"{kind}: loss fp32 {loss_r:.5f}, sdpa {loss_s:.5f}, lineage {loss_l:.5f}; gradients "
              f"{'match' if gpass else 'DIFFER'} (worst margin {gmargin:.2f} at {gname}) {gwhy}")
        with torch.no_grad():
            prompt = ids[:, :16]
            kw = dict(max_new_tokens=64, do_sample=False, min_new_tokens=64, pad_token_id=0)
            t_r, t_s = ref.generate(prompt, **kw)[:, 16:], sdpa.generate(prompt, **kw)[:, 16:]
        t_l = paged_greedy(lin, prompt, new_tokens=64, page_size=16)
        same, kept_s, kept_l = kept(t_s, t_l), kept(t_r, t_s), kept(t_r, t_l)
        print(f"{kind}: greedy decode through the pages, {same} of 64 tokens identical to SDPA's (contiguous "
              f"cache) before the first difference; of the fp32 model's, SDPA bf16 keeps {kept_s}, lineage {kept_l}")
        if same < 64:
            print(f"{kind}: (random weights give near-ties in the logits: one bf16 rounding can flip a greedy token)")
        explanation = torch._dynamo.explain(lin)(ids)
        at_attention = [r for r in explanation.break_reasons if "lineage" in str(r) or "attn" in str(r).lower()]
        print(f"{kind}: torch.compile: {explanation.graph_break_count} graph breaks, {len(at_attention)} at the attention")
        ok = ok and passed and gpass and (same == 64 or kept_l >= kept_s) and not at_attention
        if args.time:
            from torch.nn.attention import SDPBackend, sdpa_kernel
            for name, model in (("sdpa (cuDNN)", sdpa), ("lineage", lin)):
                with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
                    with torch.no_grad():
                        t_fwd = timed(lambda: model(ids))
                    t_train = timed(lambda: model(ids, labels=ids).loss.backward())
                print(f"{kind}: {name}: prefill {t_fwd:.2f} ms, training step {t_train:.2f} ms (2 x 500 tokens)")
        del ref, sdpa, lin
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
