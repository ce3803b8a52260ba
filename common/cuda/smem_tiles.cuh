#pragma once
/// \file smem_tiles.cuh
/// \brief Shared-memory tiles of 16-bit elements: the XOR swizzle that keeps
///        ldmatrix free of bank conflicts, precomputed per-lane ldmatrix
///        addresses (`SwizzledLane`), and the two ways a block fills a tile
///        from global memory (`copy_tile` through registers, `load_tile` by
///        cp.async).
///
/// A tile holds ROWS rows of D elements (T = __nv_bfloat16 or __half), that is
/// D / 8 chunks of 16 bytes per row. Shared memory has 32 banks of 4 bytes: one
/// row of 8 chunks (128 bytes) covers every bank once.
///
/// **The swizzle.** Chunk c of row r is stored at chunk c ^ (r % 8) of that row:
///
///     row r, logical chunk:   0 1 2 3 4 5 6 7      (8 chunks = 128 bytes = all 32 banks)
///     r = 0 stored at chunk:  0 1 2 3 4 5 6 7
///     r = 1 stored at chunk:  1 0 3 2 5 4 7 6
///     r = 2 stored at chunk:  2 3 0 1 6 7 4 5
///     ...
///
/// Eight rows read at the same logical chunk (what one ldmatrix phase does) land
/// in eight different 16-byte bank groups: no conflicts, no padding. The rows of a
/// global-memory tile stay contiguous 16-byte chunks, so the copy stays coalesced.

#include <cstddef>
#include <cstdint>

#include "common/cuda/cp_async.cuh"
#include "common/cuda/smem_addr.cuh"

namespace attn::cuda {

/// Index (in 16-byte chunks) of chunk `c` of row `r` in a swizzled tile whose rows
/// are `kChunks` chunks long.
template <int kChunks>
__device__ __forceinline__ int swizzle(int r, int c) {
  static_assert(kChunks % 8 == 0, "the swizzle permutes groups of 8 chunks");
  return r * kChunks + (c ^ (r & 7));
}

/// A lane's ldmatrix addresses into a swizzled tile, precomputed. Each lane reads
/// rows whose index mod 8 never changes (fragments move in steps of 8 or 16 rows)
/// and chunks 2k + hi for a fixed parity bit hi, so the swizzle c ^ (r % 8) takes
/// only four values per lane: four base registers plus compile-time offsets reach
/// every fragment, instead of one register per fragment address.
///
/// The three lane patterns of attention (ldmatrix_x4 order: matrices 0..3 = lanes
/// 0-7, 8-15, 16-23, 24-31):
///
///     A operand, rows x k (Q, or K in a backward):   row = lane % 16,                 hi = lane / 16
///     B operand, n x k (K for S = Q K^T):            row = (lane / 16) * 8 + lane % 8, hi = (lane / 8) % 2
///     B operand by .trans, k x n (V for O = P V):    row = lane % 8 + ((lane / 8) % 2) * 8, hi = lane / 16
template <int kChunks>
struct SwizzledLane {
  uint32_t base[4];
  /// `tile`: shared address of the tile; `row`: the row this lane points at when
  /// row_off = 0; `hi`: the lane's chunk parity bit.
  __device__ __forceinline__ SwizzledLane(uint32_t tile, int row, int hi) {
#pragma unroll
    for (int q = 0; q < 4; ++q) base[q] = tile + uint32_t(row * kChunks + ((2 * q + hi) ^ (row & 7))) * 16u;
  }
  /// Address of row (row + row_off), chunk (c2 + hi); row_off a multiple of 8 and c2
  /// even, both compile-time constants after unrolling.
  __device__ __forceinline__ uint32_t at(int row_off, int c2) const {
    return base[(c2 & 7) >> 1] + uint32_t(row_off * kChunks + (c2 & ~7)) * 16u;
  }
};

/// Rows [r0, r0 + ROWS) of a [n][D] tensor of 16-bit elements into a [ROWS][D]
/// shared tile the plain way: each thread loads 16 bytes into registers and stores
/// them, then the caller's barrier makes the tile visible. kSwizzled selects the
/// XOR-swizzled layout; otherwise rows are stored as they are in global memory.
/// Rows at or past n are zero.
template <int ROWS, int D, int kThreads, bool kSwizzled, class T>
__device__ __forceinline__ void copy_tile(T* tile, const T* g, int r0, int n) {
  constexpr int KC = D / 8;
#pragma unroll
  for (int k = 0; k < ROWS * KC / kThreads; ++k) {
    const int idx = threadIdx.x + k * kThreads, r = idx / KC, c = idx % KC;
    const uint4 v = r0 + r < n ? *reinterpret_cast<const uint4*>(g + std::size_t(r0 + r) * D + c * 8)
                               : make_uint4(0u, 0u, 0u, 0u);
    *reinterpret_cast<uint4*>(tile + (kSwizzled ? swizzle<KC>(r, c) : r * KC + c) * 8) = v;
  }
}

/// Rows [r0, r0 + ROWS) of a [n][D] tensor of 16-bit elements into a swizzled
/// [ROWS][D] shared tile at `tile`, 16 bytes per cp.async, by all kThreads threads;
/// rows at or past n are zero-filled. Thread x always copies chunk x % (D/8) of
/// rows x / (D/8) + k * RS, so its source and destination advance by constant
/// strides (immediate offsets, no per-chunk address registers). The caller
/// commits the group and waits for it (cp_async.cuh).
template <int ROWS, int D, int kThreads, class T>
__device__ __forceinline__ void load_tile(uint32_t tile, const T* g, int r0, int n) {
  constexpr int KC = D / 8, RS = kThreads / KC;  // chunks per row; rows one pass covers
  static_assert(RS % 8 == 0 && ROWS % RS == 0, "whole passes; the swizzle repeats every 8 rows");
  const int rb = threadIdx.x / KC, c = threadIdx.x % KC;
  const uint32_t dst = tile + uint32_t(rb * KC + (c ^ (rb & 7))) * 16u;
  const T* src = g + std::size_t(r0 + rb) * D + c * 8;
#pragma unroll
  for (int k = 0; k < ROWS / RS; ++k) {
    const bool valid = r0 + rb + k * RS < n;
    cp_async_16(dst + uint32_t(k * RS * KC) * 16u, valid ? src + std::size_t(k) * RS * D : g, valid);
  }
}

/// load_tile for a tensor whose rows are `ld` elements apart (16-bit elements): chapter 06's
/// masked kernels read the packed varlen layout [tokens][heads][d], where ld = heads * d.
/// Kept beside load_tile rather than folded into it, so that the kernels of chapters
/// 04 and 05, measured with load_tile's compile-time stride, keep their machine code.
template <int ROWS, int D, int kThreads, class T>
__device__ __forceinline__ void load_tile_ld(uint32_t tile, const T* g, int r0, int n, long long ld) {
  constexpr int KC = D / 8, RS = kThreads / KC;
  static_assert(RS % 8 == 0 && ROWS % RS == 0, "whole passes; the swizzle repeats every 8 rows");
  const int rb = threadIdx.x / KC, c = threadIdx.x % KC;
  const uint32_t dst = tile + uint32_t(rb * KC + (c ^ (rb & 7))) * 16u;
  const T* src = g + (r0 + rb) * ld + c * 8;
#pragma unroll
  for (int k = 0; k < ROWS / RS; ++k) {
    const bool valid = r0 + rb + k * RS < n;
    cp_async_16(dst + uint32_t(k * RS * KC) * 16u, valid ? src + k * RS * ld : g, valid);
  }
}

}  // namespace attn::cuda
