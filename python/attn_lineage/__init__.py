"""attn_lineage: the tutorial's final kernels called from PyTorch.

    from attn_lineage import flash_attn_func
    o = flash_attn_func(q, k, v, causal=True)          # q, k, v: [B, N, H, d] bf16/fp16 on a Hopper GPU

The kernels live in a C library built from this repository (``./tutorial python`` builds
``build/lib/libattn_lineage_c.so``; python/README.md). Importing the package needs neither
the library nor a GPU: argument checks, the fake (meta) implementations and torch.compile
tracing all work without them.
"""

from ._lib import LibraryNotFound, KernelError, available as library_available
from .ops import (BACKWARD_HEAD_DIMS, DECODE_8BIT_HEAD_DIMS, DECODE_HEAD_DIMS, FORWARD_HEAD_DIMS, MASKED_HEAD_DIMS,
                  dequantize_kv_pages, flash_attn_func, flash_attn_varlen_func, flash_attn_with_kvcache, mla_decode,
                  quantize_kv_pages)

__all__ = ["flash_attn_func", "flash_attn_varlen_func", "flash_attn_with_kvcache", "DECODE_HEAD_DIMS",
           "MASKED_HEAD_DIMS", "mla_decode", "library_available", "LibraryNotFound", "KernelError", "FORWARD_HEAD_DIMS",
           "BACKWARD_HEAD_DIMS", "DECODE_8BIT_HEAD_DIMS", "quantize_kv_pages", "dequantize_kv_pages"]
