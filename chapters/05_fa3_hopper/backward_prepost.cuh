#pragma once
/// \file backward_prepost.cuh
/// \brief The backward's preprocess and postprocess kernels, around every backward step's
///        main kernel: backward_gpu.cu runs them for the chapter's binary, and the C library
///        of python/ (python/csrc/lineage_c.cu) for PyTorch tensors.
///
/// preprocess: D_i = rowsum(dO_i o O_i), the LSE in base 2, dQ's accumulator and the order
/// counters zeroed. postprocess: dQ = tau x accumulator, in the input dtype.

#include <cuda_runtime.h>

#include "backward_launch.cuh"
#include "backward_tiles.hpp"
#include "fa3_common.cuh"

namespace attn::ch05 {

constexpr int kPrepThreads = 256;  // the preprocess: D/8 threads per row, 32 or 16 rows per block
constexpr int kPostThreads = 256;  // the postprocess: one query block's tile per block
constexpr int kPostOldBlocks = 1024;  // postprocess_by_element's grid

/// D/8 threads per padded row r of one query head (r < Tr Br), 8 elements (16 bytes) of O and
/// dO each: D_r = dO_r . O_r and the LSE in base 2 (+inf where the row is empty or padding:
/// 2^(s - inf) = 0, never NaN); zeroes the row's d floats of dQ's accumulator (its share of
/// it, as two float4 a thread) and the order counters. The first version, one warp per row
/// (preprocess_by_warp, below), read 2 bytes a lane and load: 142 us at d = 64, N = 8K,
/// H = 32, where d = 128 with the same bytes took 76.5 us.
template <class T, int D>
__global__ void __launch_bounds__(kPrepThreads) preprocess(const Fa3BwdParams p) {
  constexpr int kLanes = D / 8;  // threads of a row: 8 or 16 consecutive lanes of one warp
  const int rows_pad = p.n_qblocks * p.block_rows;
  const long long rows = (long long)p.batch * p.heads * rows_pad;
  const long long row = (long long)blockIdx.x * (kPrepThreads / kLanes) + threadIdx.x / kLanes;
  const int c8 = threadIdx.x % kLanes;
  const bool live = row < rows;  // every lane takes part in the shuffles below
  const long long bh = live ? row / rows_pad : 0;
  const int r = live ? int(row % rows_pad) : p.nq;
  float acc = 0.f;
  if (r < p.nq) {
    const long long at = (bh * p.nq + r) * D + 8 * c8;
    const uint4 vo = *reinterpret_cast<const uint4*>(static_cast<const T*>(p.o) + at);
    const uint4 vd = *reinterpret_cast<const uint4*>(static_cast<const T*>(p.dout) + at);
    const T* o = reinterpret_cast<const T*>(&vo);
    const T* dout = reinterpret_cast<const T*>(&vd);
#pragma unroll
    for (int e = 0; e < 8; ++e) acc += float(o[e]) * float(dout[e]);
  }
#pragma unroll
  for (int off = kLanes / 2; off > 0; off /= 2) acc += __shfl_xor_sync(0xffffffffu, acc, off);
  if (!live) return;
  float4* z = reinterpret_cast<float4*>(p.dq_accum + row * D + 8 * c8);
  z[0] = z[1] = make_float4(0.f, 0.f, 0.f, 0.f);
  if (c8 == 0) {
    p.delta[row] = acc;
    const float l = r < p.nq ? p.lse[bh * p.nq + r] : -INFINITY;
    p.lse2[row] = l == -INFINITY ? INFINITY : l * float(kLog2e);
    if (r % p.block_rows == 0) {
      p.dq_order[(row / p.block_rows) * 2] = 0;
      p.dq_order[(row / p.block_rows) * 2 + 1] = 0;
    }
  }
}

/// The first preprocess, one warp per padded row (2 bytes a lane and load at d = 64). Kept
/// only so that one run can time both (ATTN_CH05_BWD_PREPROCESS=warp); the README's
/// before/after comes from there.
template <class T>
__global__ void preprocess_by_warp(const Fa3BwdParams p) {
  const int rows_pad = p.n_qblocks * p.block_rows;
  const long long rows = (long long)p.batch * p.heads * rows_pad;
  const long long row = (long long)blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  if (row >= rows) return;
  const long long bh = row / rows_pad;
  const int r = int(row % rows_pad);
  float acc = 0.f;
  if (r < p.nq) {
    const T* o = static_cast<const T*>(p.o) + (bh * p.nq + r) * p.d;
    const T* dout = static_cast<const T*>(p.dout) + (bh * p.nq + r) * p.d;
    for (int c = lane; c < p.d; c += 32) acc += float(o[c]) * float(dout[c]);
  }
#pragma unroll
  for (int off = 16; off > 0; off /= 2) acc += __shfl_xor_sync(0xffffffffu, acc, off);
  for (int c = lane; c < p.d; c += 32) p.dq_accum[row * p.d + c] = 0.f;
  if (lane == 0) {
    p.delta[row] = acc;
    const float l = r < p.nq ? p.lse[bh * p.nq + r] : -INFINITY;
    p.lse2[row] = l == -INFINITY ? INFINITY : l * float(kLog2e);
    if (r % p.block_rows == 0) {
      p.dq_order[(row / p.block_rows) * 2] = 0;
      p.dq_order[(row / p.block_rows) * 2 + 1] = 0;
    }
  }
}

/// dQ = tau x accumulator, in the input dtype, laid out [B][Hq][Nq][d]: one thread block
/// per query block of one head (Br x d floats, one contiguous run in every layout,
/// backward_tiles.hpp). The run is read in order, a float4 per thread and load, and each
/// float4 (four columns of one row in every layout: dq_tile_position()) is stored scaled
/// to its place in a row-major shared tile; then each thread converts four columns of a
/// row and writes them as 8 bytes, a warp 256 contiguous bytes of one row. Every float
/// read once, every dQ element written once, no division by a run-time number. (It
/// replaces a grid-stride loop of one element per thread, which read the fragment-ordered
/// layouts in scattered 4-byte pieces: postprocess_by_element, below.)
template <class T, int D>
__global__ void __launch_bounds__(kPostThreads) postprocess(const Fa3BwdParams p) {
  constexpr int kLd = D + 8;  // 8 floats of padding: a quarter-warp's float4 stores hit 32 banks
  constexpr int kMaxRows = 80;  // block_rows: 64, or 80 (b13)
  __shared__ __align__(16) float tile[kMaxRows * kLd];
  const int br = p.block_rows;
  const long long t = blockIdx.x;  // (head bh, query block i)
  const long long bh = t / p.n_qblocks;
  const int i = int(t % p.n_qblocks);
  const DqLayout layout = p.dq_transposed    ? DqLayout::transposed
                          : p.dq_whole_tiles    ? DqLayout::whole_tiles
                          : p.dq_fragment_order ? DqLayout::fragments : DqLayout::rows;
  const float4* src = reinterpret_cast<const float4*>(p.dq_accum + t * (br * D));
  for (int v = threadIdx.x; v < br * D / 4; v += kPostThreads) {
    int r, c;
    dq_tile_position(layout, 4 * v, br, D, &r, &c);
    const float4 x = __ldcs(src + v);  // read once: streaming, evict first
    if (dq_float4_is_column(layout)) {  // four rows of one column (b13's transposed halves)
      tile[r * kLd + c] = p.scale * x.x;
      tile[(r + 1) * kLd + c] = p.scale * x.y;
      tile[(r + 2) * kLd + c] = p.scale * x.z;
      tile[(r + 3) * kLd + c] = p.scale * x.w;
    } else {
      *reinterpret_cast<float4*>(&tile[r * kLd + c]) = make_float4(p.scale * x.x, p.scale * x.y, p.scale * x.z, p.scale * x.w);
    }
  }
  __syncthreads();
  T* dq = static_cast<T*>(p.dq) + (bh * p.nq + (long long)i * br) * D;
  const int rows = min(br, p.nq - i * br);  // the padding rows past nq stay behind
  for (int v = threadIdx.x; v < rows * (D / 4); v += kPostThreads) {
    const int r = v / (D / 4), c = 4 * (v % (D / 4));
    const float4 x = *reinterpret_cast<const float4*>(&tile[r * kLd + c]);
    *reinterpret_cast<uint2*>(dq + r * D + c) = make_uint2(pack2<T>(x.x, x.y), pack2<T>(x.z, x.w));
  }
}

/// The first postprocess, one element per thread of a grid-stride loop (a 64-bit division
/// and a layout lookup per element; 4-byte reads scattered over the fragment order). Kept
/// only so that one run can time both (ATTN_CH05_BWD_POSTPROCESS=element); the README's
/// before/after comes from there.
template <class T>
__global__ void postprocess_by_element(const Fa3BwdParams p) {
  const long long n = (long long)p.batch * p.heads * p.nq * p.d;
  for (long long k = (long long)blockIdx.x * blockDim.x + threadIdx.x; k < n; k += (long long)gridDim.x * blockDim.x) {
    const int c = int(k % p.d);
    const long long rowg = k / p.d;
    const int r = int(rowg % p.nq);
    const long long bh = rowg / p.nq;
    const int br = p.block_rows;
    const long long at = p.dq_transposed       ? dq_accum_transposed_index(bh, r, c, p.n_qblocks, br, p.d)
                         : p.dq_whole_tiles    ? dq_accum_tile_index(bh, r, c, p.n_qblocks, br, p.d)
                         : p.dq_fragment_order ? dq_accum_fragment_index(bh, r, c, p.n_qblocks, br, p.d)
                                               : dq_accum_index(bh, r, c, p.n_qblocks, br, p.d);
    static_cast<T*>(p.dq)[k] = T(p.scale * p.dq_accum[at]);
  }
}

}  // namespace attn::ch05
