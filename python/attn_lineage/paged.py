"""Decoding through chapter 07's paged decode kernel, inside a transformers model.

    import attn_lineage.hf as hf
    from attn_lineage.paged import paged_generate, paged_greedy
    hf.register()
    tokens = paged_greedy(model, prompt_ids, new_tokens=64, page_size=16)   # model: attn_implementation="lineage"
    out = paged_generate(model, prompt_ids, max_new_tokens=64, do_sample=False)   # model.generate() over the pages

With paged_greedy the model keeps no cache of its own: it is called with use_cache=False and
explicit position_ids, so the key and value states that reach the attention function are
exactly the new tokens' (after RoPE for Llama; GPT-2 has none). While a PagedKVCache is active
(`with cache.active():`), the "lineage" attention function hands them to it: on prefill (no
past, Nq = Nk) it writes them into the pages of `module.layer_idx` and runs chapter 05's causal
forward; on a decode step (Nq = Nk = 1) it appends the token's key and value to the pages and
runs flash_attn_with_kvcache over them. The model only has to pass its attention module (with a `layer_idx`) as the
attention function's first argument, as Llama's and GPT-2's do.

model.generate() runs over the same pages through PagedKVCache.hf_cache(), a transformers Cache
(transformers 5) whose update() writes each layer's new tokens into the pages and hands back the
new tokens only; paged_generate() builds the store and calls generate() inside `active()`.
Only hf_cache() imports transformers.
"""

from contextlib import contextmanager

import torch

from .ops import _KV8, DECODE_8BIT_MIN_PAGE, _codes_of, _kv8_dtype, attention_bhnd, flash_attn_with_kvcache

_ACTIVE = []  # the PagedKVCache that the "lineage" attention function writes to, if any


def active_cache():
    """The PagedKVCache inside whose `active()` block we are, or None."""
    return _ACTIVE[-1] if _ACTIVE else None


class PagedKVCache:
    """Key and value pages for every layer in the kernel's own layout (kv_layout="HND"):
    `k_pages[layer]`, `v_pages[layer]` [pages, Hkv, page_size, d], allocated on a layer's first
    write with the shape of its key states. One block table for all layers, `block_table`
    [batch, max_pages] int32 on the device: sequence b's page j is page j * batch + b, so one
    sequence's pages are not adjacent in the pool. `cache_seqlens` [layers seen, batch] int32 on
    the device (row `layer` is what the kernel reads); `lengths[layer]` the same count on the host.
    All sequences of a batch have one length (a padded batch has no lineage kernel).

    kv_dtype "fp8" or "int8": the pages hold chapter 07's 8-bit codes (kv_quant.hpp), E4M3 or
    int8, with `k_scales[layer]`, `v_scales[layer]` [pages, Hkv] fp32, one scale per (page, KV
    head), and decode reads them with the final 8-bit kernel. A page's first write sets its scale
    to the amax of the slots written / Q (448 or 127): a prompt's pages are written whole. A later
    token that fits under the scale is quantised with it; one that does not doubles the scale
    until it fits, and the page's earlier slots are quantised again from their values (code *
    scale), as the chapter's pages grow. The prompt itself attends in bf16 (prefill reads no
    cache); the cache's codes serve the decode steps."""

    def __init__(self, batch, max_tokens, page_size=16, device="cuda", dtype=torch.bfloat16, kv_dtype=None):
        if page_size <= 0 or page_size & (page_size - 1):
            raise ValueError(f"page_size: {page_size} must be a power of two")
        self.codes = None if kv_dtype is None else _kv8_dtype(kv_dtype)  # None: pages of `dtype` values
        if self.codes is not None and page_size < DECODE_8BIT_MIN_PAGE:
            raise ValueError(f"page_size: {page_size}; 8-bit pages hold at least {DECODE_8BIT_MIN_PAGE} tokens "
                             f"(the 8-bit decode copies whole pages)")
        if batch <= 0 or max_tokens <= 0:
            raise ValueError(f"batch, max_tokens: expected positive sizes, got {batch} and {max_tokens}")
        self.batch, self.page_size, self.dtype, self.device = batch, page_size, dtype, torch.device(device)
        self.max_pages = -(-max_tokens // page_size)
        self.capacity = self.max_pages * page_size
        j = torch.arange(self.max_pages, dtype=torch.int32)[None, :]
        b = torch.arange(batch, dtype=torch.int32)[:, None]
        self.block_table = (j * batch + b).to(self.device)
        self.k_pages, self.v_pages, self.lengths, self._seqlens = {}, {}, {}, {}
        self.k_scales, self.v_scales = {}, {}  # 8-bit pages only
        self._written = {}  # layer -> tokens write() put in that its attention call has not seen yet
        # the attention calls, replaceable by stand-ins in tests without a GPU
        self.prefill_fn, self.decode_fn = attention_bhnd, flash_attn_with_kvcache

    def cache_seqlens(self, layer):
        """[batch] int32 on the device: the tokens in `layer`'s pages, as the kernel reads them."""
        return self._seqlens[layer]

    def append(self, layer, key, value):
        """Writes key and value [batch, Hkv, N, d] at positions lengths[layer] .. + N - 1 of
        `layer`'s pages and advances its length by N."""
        if key.dim() != 4 or key.shape != value.shape or key.shape[0] != self.batch:
            raise ValueError(f"key, value: expected two [batch={self.batch}, Hkv, N, d] tensors of one shape, got "
                             f"{tuple(key.shape)} and {tuple(value.shape)}")
        _, hkv, n, d = key.shape
        if layer not in self.k_pages:
            pages = self.batch * self.max_pages
            self.k_pages[layer] = torch.zeros(pages, hkv, self.page_size, d, dtype=self.codes or self.dtype,
                                              device=self.device)
            self.v_pages[layer] = torch.zeros_like(self.k_pages[layer])
            if self.codes is not None:
                self.k_scales[layer] = torch.zeros(pages, hkv, dtype=torch.float32, device=self.device)
                self.v_scales[layer] = torch.zeros_like(self.k_scales[layer])
            self.lengths[layer] = 0
            self._seqlens[layer] = torch.zeros(self.batch, dtype=torch.int32, device=self.device)
        if self.k_pages[layer].shape[1:] != (hkv, self.page_size, d):
            raise ValueError(f"key: layer {layer} holds {self.k_pages[layer].shape[1]} heads of dim "
                             f"{self.k_pages[layer].shape[3]}, got {hkv} of dim {d}")
        start = self.lengths[layer]
        if start + n > self.capacity:
            raise ValueError(f"key: {start} + {n} tokens exceed the cache's {self.capacity} "
                             f"({self.max_pages} pages of {self.page_size})")
        if self.codes is not None:
            self._write8(self.k_pages[layer], self.k_scales[layer], start, key)
            self._write8(self.v_pages[layer], self.v_scales[layer], start, value)
        else:
            pos = torch.arange(start, start + n, device=self.device)
            page = self.block_table[:, pos // self.page_size].long()  # [batch, N]
            slot = (pos % self.page_size).expand(self.batch, n)       # [batch, N]
            # advanced indices on either side of a slice: the indexed view is [batch, N, Hkv, d]
            self.k_pages[layer][page, :, slot] = key.transpose(1, 2).to(self.dtype)
            self.v_pages[layer][page, :, slot] = value.transpose(1, 2).to(self.dtype)
        self.lengths[layer] = start + n
        self._seqlens[layer] += n

    def _write8(self, codes, scales, start, x):
        """Tokens start .. start + N - 1 of x [batch, Hkv, N, d] into 8-bit pages: page by page
        (a prompt's pages, or a decode step's one), each with the scale rule above."""
        qmax = _KV8[self.codes][1]
        ps, n = self.page_size, x.shape[2]
        x = x.float()
        for j in range(start // ps, (start + n - 1) // ps + 1):  # the sequences' j-th pages
            page = self.block_table[:, j].long()                 # [batch]
            lo, hi = max(j * ps, start), min((j + 1) * ps, start + n)
            new = x[:, :, lo - start:hi - start]                  # [batch, Hkv, slots, d]
            s_old = scales[page]                                  # [batch, Hkv]
            values = codes[page].float() * s_old[:, :, None, None]
            values[:, :, lo - j * ps:hi - j * ps] = new
            a = new.abs().amax(dim=(2, 3))
            # a fresh (or all-zero) page: amax / Q of what is written; else the old scale, doubled
            # until the new slots fit under it
            grown = s_old * torch.exp2(torch.ceil(torch.log2((a / (s_old * qmax)).clamp_min(1.0))))
            grown = torch.where(grown * qmax < a, grown * 2, grown)
            s = torch.where(s_old > 0, grown, a / qmax)
            codes[page] = _codes_of(values, s[:, :, None, None], self.codes)
            scales[page] = s

    def gather(self, layer):
        """`layer`'s keys and values read back through the block table: [batch, Hkv, length, d] each
        (8-bit pages: their values, code * scale, in fp32)."""
        n = self.lengths[layer]
        pos = torch.arange(n, device=self.device)
        page = self.block_table[:, pos // self.page_size].long()
        slot = (pos % self.page_size).expand(self.batch, n)
        if self.codes is None:
            return tuple(p[layer][page, :, slot].transpose(1, 2) for p in (self.k_pages, self.v_pages))
        return tuple((c[layer][page, :, slot].float() * sc[layer][page][..., None]).transpose(1, 2)
                     for c, sc in ((self.k_pages, self.k_scales), (self.v_pages, self.v_scales)))

    def write(self, layer, key, value):
        """append() on behalf of transformers' cache (hf_cache()): the attention call that follows
        for `layer` finds these tokens already in the pages and does not append them again."""
        self.append(layer, key, value)
        self._written[layer] = key.shape[2]

    def attend(self, module, query, key, value, scaling=None):
        """The attention function's work while the cache is active: query [B, Hq, Nq, d], key and
        value [B, Hkv, Nk, d], the new tokens' only (appended here, unless write() has). Returns
        O [B, Nq, Hq, d]."""
        layer = getattr(module, "layer_idx", None)
        if not isinstance(layer, int):
            raise ValueError(f"module: {type(module).__name__} has no integer layer_idx, so the paged cache cannot "
                             f"tell its layers apart (decode with transformers' own cache instead)")
        nq, nk = query.shape[2], key.shape[2]
        written = self._written.pop(layer, 0)
        if written not in (0, nk):
            raise ValueError(f"key: {nk} tokens at layer {layer}, but the cache was just given {written}")
        held = self.lengths.get(layer, 0) - written  # the tokens before this call's
        if held == 0 and nq == nk:  # prefill: write the prompt, run the causal forward
            if not written:
                self.append(layer, key, value)
            return self.prefill_fn(query, key, value, causal=True, softmax_scale=scaling)
        if nq == 1 and nk == 1:  # decode: append the token, read the whole sequence through the pages
            if not written:
                self.append(layer, key, value)
            q = query.transpose(1, 2)  # [B, 1, Hq, d]
            scales = {} if self.codes is None else {"k_scale": self.k_scales[layer], "v_scale": self.v_scales[layer]}
            return self.decode_fn(q, self.k_pages[layer], self.v_pages[layer], self.cache_seqlens(layer),
                                  self.block_table, softmax_scale=scaling, kv_layout="HND", **scales)
        raise ValueError(f"query: {nq} query and {nk} key tokens at layer {layer} holding {held}; the paged "
                         f"cache takes a prompt (no past, Nq = Nk) or one token a step")

    def hf_cache(self, num_layers):
        """These pages as a transformers Cache (transformers 5), for model.generate(past_key_values=...)
        inside `active()`: each layer's update() writes the new tokens into the pages and hands back
        the new tokens only, which the "lineage" attention function passes to attend(). Needs
        transformers (imported here, not by the package)."""
        return _hf_cache_class()(self, num_layers)

    @contextmanager
    def active(self):
        """While inside, the "lineage" attention function reads and writes this cache."""
        _ACTIVE.append(self)
        try:
            yield self
        finally:
            _ACTIVE.remove(self)


@torch.no_grad()
def paged_greedy(model, prompt_ids, new_tokens=64, page_size=16, return_logits=False, kv_dtype=None):
    """Greedy decoding of `new_tokens` tokens after `prompt_ids` [B, N0] through a PagedKVCache:
    one prefill, then one model call a token with use_cache=False and explicit position_ids.
    kv_dtype "fp8" or "int8": the cache in 8-bit pages (PagedKVCache). Returns the new tokens
    [B, new_tokens] (and, with return_logits=True, the fp32 logits each was picked from,
    [B, new_tokens, vocab])."""
    b, n0 = prompt_ids.shape
    cache = PagedKVCache(b, n0 + new_tokens, page_size, device=prompt_ids.device, kv_dtype=kv_dtype)
    tokens, logits_seen = [], []
    with cache.active():
        pos = torch.arange(n0, device=prompt_ids.device).expand(b, n0)
        logits = model(prompt_ids, position_ids=pos, use_cache=False).logits[:, -1]
        for i in range(new_tokens):
            nxt = logits.argmax(-1)
            tokens.append(nxt)
            logits_seen.append(logits.float())
            if i + 1 < new_tokens:
                pos = torch.full((b, 1), n0 + i, device=prompt_ids.device)
                logits = model(nxt[:, None], position_ids=pos, use_cache=False).logits[:, -1]
    out = torch.stack(tokens, 1)
    return (out, torch.stack(logits_seen, 1)) if return_logits else out


def _hf_cache_class():
    """The transformers Cache class over a PagedKVCache (defined on first use: transformers is
    imported only here)."""
    global _HF_CACHE
    if _HF_CACHE is not None:
        return _HF_CACHE
    from transformers.cache_utils import Cache, CacheLayerMixin

    class PagedLayer(CacheLayerMixin):
        """One model layer's view of the pages: update() writes, the lengths are the store's."""
        is_compileable = False
        is_croppable = False
        is_sliding = False

        def __init__(self, store, layer_idx):
            super().__init__()
            self.store, self.layer_idx, self.batch_size = store, layer_idx, store.batch

        def lazy_initialization(self, key_states, value_states):
            self.is_initialized = True

        def update(self, key_states, value_states, *args, **kwargs):
            if not self.is_initialized:
                self.lazy_initialization(key_states, value_states)
            self.store.write(self.layer_idx, key_states, value_states)
            return key_states, value_states

        def get_mask_sizes(self, query_length):
            return self.get_seq_length() + query_length, 0

        def get_seq_length(self):
            return self.store.lengths.get(self.layer_idx, 0)

        def get_max_length(self):
            return self.store.capacity

        def reset(self):
            raise ValueError("reset: a paged cache is not reused; make a new PagedKVCache")

        def reorder_cache(self, beam_idx):
            raise ValueError("beam search: the paged cache keeps one sequence a row (no reordering)")

        def crop(self, tokens_to_remove):
            raise ValueError("crop: the paged cache does not roll back (assisted decoding is not supported)")

        def batch_repeat_interleave(self, repeats):
            raise ValueError("num_return_sequences > 1: the paged cache holds one sequence a row")

        def batch_select_indices(self, indices):
            raise ValueError("batch selection: the paged cache holds a fixed batch")

    class PagedCache(Cache):
        """A transformers Cache whose layers are a PagedKVCache's pages (attn_lineage.paged)."""

        def __init__(self, store, num_layers):
            super().__init__(layers=[PagedLayer(store, i) for i in range(num_layers)])
            self.store = store

    _HF_CACHE = PagedCache
    return PagedCache


_HF_CACHE = None


@torch.no_grad()
def paged_generate(model, input_ids, max_new_tokens=64, page_size=16, kv_dtype=None, **generate_kwargs):
    """model.generate() through the pages: a PagedKVCache for `input_ids` [B, N0] and
    `max_new_tokens`, handed to generate() as its past_key_values (hf_cache()) while active, so
    every prefill runs chapter 05's causal forward and every decode step chapter 07's paged
    decode (bf16, or 8-bit pages with kv_dtype "fp8" / "int8"). generate_kwargs go to generate()
    (greedy or sampling; not beam search, which reorders a cache). Returns what generate() does."""
    for name in ("num_beams", "num_return_sequences"):
        if generate_kwargs.get(name, 1) != 1:
            raise ValueError(f"{name}: {generate_kwargs[name]}; the paged cache holds one sequence a row of "
                             f"input_ids (no beam search, one sequence returned a prompt)")
    b, n0 = input_ids.shape
    store = PagedKVCache(b, n0 + max_new_tokens, page_size, device=input_ids.device, kv_dtype=kv_dtype)
    layers = model.config.get_text_config().num_hidden_layers
    with store.active():
        return model.generate(input_ids, past_key_values=store.hf_cache(layers), max_new_tokens=max_new_tokens,
                              **generate_kwargs)
