#pragma once
/// \file cluster_merge.cuh
/// \brief The ⊕ of two key ranges held by the two thread blocks of a cluster, merged
///        through distributed shared memory (sm_90+): no partials in global memory and
///        no combine kernel.
///
/// A split-KV kernel whose two key ranges of a tile run as one cluster of two blocks
/// ends with each block holding its range's unnormalised O in accumulator fragments and
/// each row's (m, l). Rank 1 leaves them in its own shared memory; rank 0 maps that
/// memory (`cluster.map_shared_rank`), weighs both ranges by two_range_weights() and
/// writes O / l; a second `cluster.sync()` keeps rank 1's shared memory alive until
/// rank 0 has read it:
///
///     rank 1: O, (m, l) -> own smem   cluster.sync()                    cluster.sync()
///     rank 0:                         cluster.sync()   read, ⊕, store   cluster.sync()
///
/// The fragments are those of mma.sync and wgmma (common/cuda/frag_softmax.cuh): a thread
/// holds two rows and, per 8-column chunk c, four floats (row 0: e = 0, 1; row 1: e = 2, 3).
/// Both blocks run the same kernel, so a thread of rank 0 reads the very chunks that the
/// thread of the same index left in rank 1.
/// Used by chapter 06's MLA decode (gqa_mla/mla_tiles.cuh, gqa_mla/mla_tile64_sm90.cuh).

#include <cooperative_groups.h>

#include "common/cuda/fast_math.cuh"
#include "common/online_softmax.hpp"

namespace attn::hopper {

/// The ⊕ of a row's two key ranges as the weights of their unnormalised O:
/// O / l = wa O_a + wb O_b, with m = max(m_a, m_b), wa = 2^(m_a - m) / l, wb = 2^(m_b - m) / l
/// and l = l_a 2^(m_a - m) + l_b 2^(m_b - m); m in base-2 units of the scaled score. Both
/// ranges empty (m = -inf, l = 0): both weights 0, never NaN.
struct RangeWeights {
  float wa, wb;
};
__device__ __forceinline__ RangeWeights two_range_weights(float ma, float la, float mb, float lb) {
  const float shift = finite_max(fmaxf(ma, mb));
  const float w0 = attn::cuda::exp2_approx(ma - shift), w1 = attn::cuda::exp2_approx(mb - shift);
  const float l = la * w0 + lb * w1, inv = l > 0.f ? 1.f / l : 0.f;
  return {w0 * inv, w1 * inv};
}

/// Element e (0..3) of 8-column chunk c of a thread's accumulator fragments, kept either as
/// [chunks][4] (the mma.sync tiles) or flat (the wgmma tiles: 4 c + e).
template <int N>
__device__ __forceinline__ float frag_at(const float (&o)[N][4], int c, int e) {
  return o[c][e];
}
template <int N>
__device__ __forceinline__ float frag_at(const float (&o)[N], int c, int e) {
  return o[4 * c + e];
}

// Defined where cooperative groups have clusters: the host pass and sm_90+ (a file built for
// older GPUs too uses it under `#if __CUDA_ARCH__ >= 900`).
#if !defined(__CUDA_ARCH__) || __CUDA_ARCH__ >= 900
/// The merge of the two blocks of this cluster (ranks 0 and 1, both running the same kernel)
/// by the ⊕, for blocks of kThreads threads holding kChunks 8-column chunks of O each:
///
///     ClusterPairMerge<kChunks, kThreads>()(xo, xml, o, m, l, row, writes_ml, live, store);
///
/// by every thread of both blocks, after their last use of the shared memory at xo / xml.
/// Its members are rank 0's weights of its own range and of rank 1's, per row. They are the
/// object's rather than the call's so that they live in the calling kernel's frame, after its
/// own arrays, as they did when each kernel wrote the merge inline: arrays local to a helper
/// come first, and the register numbering of the whole kernel, hence its SASS, changes
/// (scripts/same_machine_code.py).
template <int kChunks, int kThreads>
struct ClusterPairMerge {
  float wa[2], wb[2];

  /// - xo: kChunks * kThreads float4 of this block's shared memory, xml: two floats per row of
  ///   the tile (both written in rank 1 only, read by rank 0 through the cluster).
  /// - frag: this thread's O (frag_at()); m / l: its two rows' m and l, the same in every
  ///   thread of a row; row: their indices in the tile; writes_ml(): this thread is the one of
  ///   its rows that stores their (m, l) (asked in rank 1 only).
  /// - live(r): row r of the thread is to be written (false past the end of the problem);
  ///   store(c, r, v0, v1): rank 0 writes the merged O / l of a live row r, chunk c: the
  ///   thread's two columns of it.
  template <class Frag, class Owner, class Live, class Store>
  __device__ __forceinline__ void operator()(float4* xo, float* xml, const Frag& frag, const float (&m)[2],
                                             const float (&l)[2], const int (&row)[2], const Owner& writes_ml,
                                             const Live& live, const Store& store) {
    namespace cg = cooperative_groups;
    const cg::cluster_group cluster = cg::this_cluster();
    if (cluster.block_rank() == 1) {
#pragma unroll
      for (int c = 0; c < kChunks; ++c)
        xo[c * kThreads + threadIdx.x] =
            make_float4(frag_at(frag, c, 0), frag_at(frag, c, 1), frag_at(frag, c, 2), frag_at(frag, c, 3));
      if (writes_ml())
#pragma unroll
        for (int r = 0; r < 2; ++r) xml[2 * row[r]] = m[r], xml[2 * row[r] + 1] = l[r];
    }
    cluster.sync();  // rank 1's partials are in its shared memory, visible to the cluster
    if (cluster.block_rank() == 0) {
      const float4* ro = cluster.map_shared_rank(xo, 1);
      const float* rml = cluster.map_shared_rank(xml, 1);
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        const RangeWeights w = two_range_weights(m[r], l[r], rml[2 * row[r]], rml[2 * row[r] + 1]);
        wa[r] = w.wa, wb[r] = w.wb;
      }
#pragma unroll
      for (int c = 0; c < kChunks; ++c) {
        const float4 v = ro[c * kThreads + threadIdx.x];  // rank 1's chunk c: row 0 in x, y, row 1 in z, w
#pragma unroll
        for (int r = 0; r < 2; ++r) {
          if (!live(r)) continue;
          store(c, r, frag_at(frag, c, 2 * r) * wa[r] + (r ? v.z : v.x) * wb[r],
                frag_at(frag, c, 2 * r + 1) * wa[r] + (r ? v.w : v.y) * wb[r]);
        }
      }
    }
    cluster.sync();  // rank 0 is done reading rank 1's shared memory: rank 1 may exit
  }
};
#endif

}  // namespace attn::hopper
