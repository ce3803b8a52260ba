// Chapter 07 - the launchers of the decode kernels (steps/v1_paged_decode.cu and
// steps/v2_split_k.cu), each instantiated for d = 64 and 128 and for paged and
// contiguous K/V.
#pragma once

#include "steps/decode_tile.cuh"

namespace attn::ch07::gpu {

/// v1: grid (Hkv x head chunks, B).
template <int D, class Kv>
void launch_v1(const DecodeParams& p, const Kv& kv, int batch, int kv_heads);

/// v2: the split kernel, grid (S, Hkv x head chunks, B), then the merge kernel, grid (Hq, B).
template <int D, class Kv>
void launch_v2(const DecodeParams& p, const Kv& kv, int batch, int kv_heads);

}  // namespace attn::ch07::gpu
