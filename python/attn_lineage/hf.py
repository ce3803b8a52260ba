"""Hugging Face transformers: the lineage kernels as an attention implementation.

    import attn_lineage.hf
    attn_lineage.hf.register()                       # once: attn_implementation="lineage"
    model = LlamaForCausalLM(config)                 # config._attn_implementation = "lineage"

register() adds "lineage" to transformers' AttentionInterface (and, where the library has it,
to AttentionMaskInterface, with a mask function that builds no mask: the kernels take causal
masking as a flag). Prefill and training run chapter 05's final forward and backward; decoding
with transformers' own (contiguous) cache runs the same forward with one query row, whose
bottom-right causal mask sees the whole cache. Inside a PagedKVCache's `active()` block
(attn_lineage.paged, paged_greedy), the cache takes the call instead: prefill writes the pages,
a decode step runs chapter 07's paged decode over them.

What the kernels do not do is refused with a ValueError, never ignored: a padding mask (a batch
of unequal lengths; checked outside torch.compile), sliding windows, dropout while training, a
head dim or dtype without a kernel. Importing this module needs transformers; the package
itself does not.
"""

import torch

from .ops import attention_bhnd
from .paged import active_cache

NAME = "lineage"


def lineage_attention_forward(module, query, key, value, attention_mask, dropout=0.0, scaling=None, is_causal=None,
                              **kwargs):
    """transformers' attention-function signature: query [B, Hq, Nq, d], key and value
    [B, Hkv, Nk, d]; returns (output [B, Nq, Hq, d], None): no attention weights."""
    if dropout and dropout > 0.0:
        raise ValueError(f"dropout: {dropout}: the lineage kernels have no dropout (set the config's attention "
                         f"dropout to 0, or call model.eval())")
    if kwargs.get("sliding_window") is not None:
        raise ValueError("sliding_window: the lineage attention implementation has no window inside transformers "
                         "(chapter 06's masked forward has no backward here; flash_attn_func(window_size=...) runs "
                         "it without gradients)")
    if attention_mask is not None:
        raise ValueError("attention_mask: the lineage kernels take causal masking as a flag, not a mask tensor "
                         "(register() installs a mask function that builds none; padded batches are not supported)")
    cache = active_cache()
    if cache is not None:
        return cache.attend(module, query, key, value, scaling), None
    causal = is_causal if is_causal is not None else getattr(module, "is_causal", True)
    out = attention_bhnd(query, key, value, causal=bool(causal), softmax_scale=scaling)
    return out, None


def lineage_mask(*args, attention_mask=None, local_size=None, **kwargs):
    """The mask function for "lineage": no mask at all (the kernels mask causally by a flag).
    Refuses what it cannot express: a padding mask with a zero (outside torch.compile, where
    the check would read the device) and a sliding window."""
    if local_size is not None:
        raise ValueError(f"local_size: a sliding window of {local_size} has no lineage kernel")
    if attention_mask is not None and attention_mask.dtype == torch.bool and not torch.compiler.is_compiling():
        if not bool(attention_mask.all()):
            raise ValueError("attention_mask: padded sequences have no lineage kernel (batch sequences of one "
                             "length, or use one sequence a batch)")
    elif attention_mask is not None and not torch.compiler.is_compiling():
        if not bool((attention_mask != 0).all()):
            raise ValueError("attention_mask: padded sequences have no lineage kernel")
    return None


def register():
    """Registers "lineage" with transformers; returns the transformers version it registered with."""
    import transformers
    from transformers import AttentionInterface
    AttentionInterface.register(NAME, lineage_attention_forward)
    try:
        from transformers import AttentionMaskInterface
    except ImportError:  # older transformers: the model hands its own mask (then refused above)
        AttentionMaskInterface = None
    if AttentionMaskInterface is not None:
        AttentionMaskInterface.register(NAME, lineage_mask)
    return transformers.__version__
