#pragma once
/// \file fa1_tiles.cuh
/// \brief What chapter 03's two kernels share: the thread layout, staging a tile of
///        rows from HBM into padded fp32 shared memory, and warp reductions.
///
/// Both kernels run 256 threads per block, seen as a 16 x 16 grid for the tile
/// products (thread (tx, ty) owns rows ty, ty+16, ... and columns tx, tx+16, ... of
/// every output tile) and as 8 warps for the row-wise softmax statistics.

#include <cstddef>
#include <cstdint>
#include <cstring>

#include "common/cuda/types.cuh"

namespace attn::ch03 {

constexpr int kThreads = 256;
constexpr int kWarps = kThreads / 32;

/// Row stride of a staged Q/K/V/dO tile: one float of padding, so the 16 different
/// rows a warp reads in one instruction (rows tx + 16b) fall in 16 different banks.
template <int D> constexpr int tile_ld() { return D + 1; }
/// Row stride of an S/P/dS tile: 16 floats of padding, so the two rows a warp writes
/// (ty = 2w and 2w + 1) fall in opposite halves of the 32 banks.
template <int Bc> constexpr int score_ld() { return Bc + 16; }

/// Copies `rows` rows of a row-major [.. x D] tensor of T into the fp32 tile
/// dst[Capacity][D + 1] and zero-fills rows rows .. Capacity-1, so that a partial
/// block computes on zeros (finite), never on stale or uninitialised values.
/// 16-byte loads: each thread moves 8 fp16/bf16 elements of one row per iteration.
template <class T, int D, int Capacity>
__device__ __forceinline__ void stage_rows(const T* __restrict__ src, int rows, float* __restrict__ dst) {
  constexpr int kVec = 16 / int(sizeof(T));
  constexpr int kPerRow = D / kVec;
  static_assert(D % kVec == 0, "rows must split into 16-byte vectors");
  for (int e = threadIdx.x; e < Capacity * kPerRow; e += kThreads) {
    const int r = e / kPerRow, c0 = (e % kPerRow) * kVec;
    float* out = dst + r * tile_ld<D>() + c0;
    if (r < rows) {
      const uint4 raw = *reinterpret_cast<const uint4*>(src + std::size_t(r) * D + c0);
      T x[kVec];
      memcpy(x, &raw, sizeof raw);  // well-defined type punning; register moves after compilation
#pragma unroll
      for (int k = 0; k < kVec; ++k) out[k] = to_float(x[k]);
    } else {
#pragma unroll
      for (int k = 0; k < kVec; ++k) out[k] = 0.f;
    }
  }
}

__device__ __forceinline__ float warp_max(float x) {
#pragma unroll
  for (int offset = 16; offset > 0; offset /= 2) x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, offset));
  return x;
}

__device__ __forceinline__ float warp_sum(float x) {
#pragma unroll
  for (int offset = 16; offset > 0; offset /= 2) x += __shfl_xor_sync(0xffffffffu, x, offset);
  return x;
}

}  // namespace attn::ch03
