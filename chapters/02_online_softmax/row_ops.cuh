#pragma once
/// \file row_ops.cuh
/// \brief What the chapter-02 kernels (steps/v1..v4) share: the arguments, how a block walks a row of
///        S with 16-byte loads, and the warp and block reductions of m, l and (m, l).
///
/// A row splits into an unaligned head, a body of float4 and a tail (RowSplit in
/// softmax_model.hpp, where the CPU tests check that every score has exactly one owner).
/// P has the same layout as S and both come from cudaMalloc (256-byte aligned), so a
/// row of P splits exactly as its row of S.

#include <cstdint>

#include "common/cuda/fast_math.cuh"
#include "common/cuda/index.cuh"
#include "common/errors.hpp"
#include "common/online_softmax.hpp"
#include "softmax_model.hpp"

namespace attn::ch02 {

/// Everything a kernel of this chapter needs; one struct for all four, passed by value.
struct RowArgs {
  const float* S;  ///< [rows][nk]
  float* P;        ///< [rows][nk], softmax variants
  float* lse;      ///< [rows]
  const float* V;  ///< [batch][kv_heads][nk][dv], fused variant
  float* O;        ///< [rows][dv], fused variant
  long long rows;  ///< batch * heads * nq
  int nq, nk, dv;
  int heads, kv_heads;
  bool causal;
  float tau;  ///< softmax scale: x_ij = tau * S_ij
};

/// Each step lives in its own file (steps/vN_*.cu) and namespace, with one launcher of
/// the same name in each: `vN::launch(args)` runs step N on every row, on the default
/// stream. v3 keeps a row in registers and accepts only rows that fit
/// (row_fits_in_registers()); the caller runs v2 for longer ones.
namespace v1 {
void launch(const RowArgs& a);
}
namespace v2 {
void launch(const RowArgs& a);
}
namespace v3 {
void launch(const RowArgs& a);
}
namespace v4 {
void launch(const RowArgs& a);
}

constexpr unsigned kFullMask = 0xffffffffu;

/// The last key row `row` sees (bottom-right causal mask); negative for an empty row.
__device__ __forceinline__ int row_last_visible(const RowArgs& a, long long row) {
  const int i = int(row % a.nq);
  return a.causal ? min(a.nk - 1, i + cuda::causal_diag(a.nq, a.nk)) : a.nk - 1;
}

/// The split of one row (RowSplit, softmax_model.hpp) at its address in memory.
__device__ __forceinline__ RowSplit split_row(const float* row, int n) {
  return split_row(reinterpret_cast<unsigned long long>(row), n);
}

__device__ __forceinline__ float4 neg_inf4() {
  return make_float4(neg_inf<float>(), neg_inf<float>(), neg_inf<float>(), neg_inf<float>());
}

/// x = tau * s, or -inf when key j is masked.
__device__ __forceinline__ float score(float s, int j, int last, float tau) {
  return j <= last ? tau * s : neg_inf<float>();
}

/// The four scores of body float4 `v`: one 16-byte load, scaled and masked.
__device__ __forceinline__ float4 load_scores4(const float* row, RowSplit g, int v, int last, float tau) {
  const float4 s = __ldg(reinterpret_cast<const float4*>(row + g.head) + v);
  const int j = g.head + 4 * v;
  return make_float4(score(s.x, j, last, tau), score(s.y, j + 1, last, tau), score(s.z, j + 2, last, tau),
                     score(s.w, j + 3, last, tau));
}

/// One unaligned head or tail score j, as a float4 whose other lanes are -inf.
__device__ __forceinline__ float4 load_score1(const float* row, int j, int last, float tau) {
  float4 x = neg_inf4();
  x.x = j <= last ? tau * __ldg(row + j) : neg_inf<float>();
  return x;
}

__device__ __forceinline__ float max4(float4 x) { return fmaxf(fmaxf(x.x, x.y), fmaxf(x.z, x.w)); }
__device__ __forceinline__ float sum4(float4 x) { return (x.x + x.y) + (x.z + x.w); }
/// \f$e^{x - \mathrm{shift}}\f$ for one score: \f$2^y\f$ of \f$y = (x - \mathrm{shift}) \log_2 e\f$
/// by the hardware's approximation (`ex2.approx.ftz`, one `MUFU.EX2`, about 2 ulp; results
/// below \f$2^{-126}\f$ flush to 0, which changes nothing next to the row's maximum, of
/// weight 1): `cuda::exp2_approx` of common/cuda/fast_math.cuh. Three instructions where
/// `expf` takes nine. The subtraction comes first, in natural
/// units, so the rounding of y is relative to \f$|x - \mathrm{shift}|\f$, small for every
/// weight that matters; folding \f$\log_2 e\f$ into the scores instead rounds each one by
/// \f$|x| u\f$ (the test "the exp2 form ... matches the exp form" measures both). A masked
/// score, \f$-\infty\f$, gives 0.
__device__ __forceinline__ float exp_score(float x, float shift) {
  return cuda::exp2_approx((x - shift) * float(kLog2e));
}

/// exp_score lane by lane (masked lanes give e^-inf = 0).
__device__ __forceinline__ float4 exp4(float4 x, float shift) {
  return make_float4(exp_score(x.x, shift), exp_score(x.y, shift), exp_score(x.z, shift), exp_score(x.w, shift));
}
__device__ __forceinline__ float4 scale4(float4 x, float c) { return make_float4(x.x * c, x.y * c, x.z * c, x.w * c); }

/// One sweep over a thread's share of the row: f(x) for each of its float4 of scores,
/// kUnroll 16-byte loads issued before the first is used. Slots past the body and the
/// head/tail floats arrive padded with -inf, which every f here ignores.
template <class F>
__device__ __forceinline__ void sweep(const float* row, RowSplit g, int last, float tau, F&& f) {
  const int t = threadIdx.x;
  for (int v0 = t; v0 < g.nvec; v0 += kUnroll * kThreads) {
    float4 x[kUnroll];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int v = v0 + u * kThreads;
      x[u] = v < g.nvec ? load_scores4(row, g, v, last, tau) : neg_inf4();
    }
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) f(x[u]);
  }
  if (t < g.head) f(load_score1(row, t, last, tau));
  if (t < g.tail) f(load_score1(row, g.tail_start() + t, last, tau));
}

/// The writing sweep: reads the row again and stores out = f(x) with 16-byte stores.
template <class F>
__device__ __forceinline__ void sweep_write(const float* row, float* out, RowSplit g, int last, float tau, F&& f) {
  const int t = threadIdx.x;
  float4* out4 = reinterpret_cast<float4*>(out + g.head);
  for (int v0 = t; v0 < g.nvec; v0 += kUnroll * kThreads) {
    float4 x[kUnroll];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int v = v0 + u * kThreads;
      x[u] = v < g.nvec ? load_scores4(row, g, v, last, tau) : neg_inf4();
    }
#pragma unroll
    for (int u = 0; u < kUnroll; ++u)
      if (v0 + u * kThreads < g.nvec) out4[v0 + u * kThreads] = f(x[u]);
  }
  if (t < g.head) out[t] = f(load_score1(row, t, last, tau)).x;
  if (t < g.tail) out[g.tail_start() + t] = f(load_score1(row, g.tail_start() + t, last, tau)).x;
}

// ----------------------------------------------------------------------------- reductions
//
// A butterfly of __shfl_xor_sync leaves every lane with the result, in log2(32) = 5 steps:
//
//   step    1: offset 16     2: offset 8    ...   5: offset 1
//   lane i combines with lane i ^ offset, so after step k each lane holds the result
//   of its group of 2^k lanes, and after step 5 of all 32.
//
// A block reduction then writes one result per warp to shared memory and every warp
// reduces those (at most 32) again, so every thread of the block ends with the same value.

__device__ __forceinline__ float warp_max(float x) {
#pragma unroll
  for (int offset = 16; offset > 0; offset /= 2) x = fmaxf(x, __shfl_xor_sync(kFullMask, x, offset));
  return x;
}

__device__ __forceinline__ float warp_sum(float x) {
#pragma unroll
  for (int offset = 16; offset > 0; offset /= 2) x += __shfl_xor_sync(kFullMask, x, offset);
  return x;
}

/// (m, l) of every lane merged with (+): lane i merges with lane i ^ offset. (+) is
/// commutative, but a (+) b and b (+) a may round differently in the last place once the
/// compiler fuses l_a w_a + l_b w_b into one multiply-add; so both lanes of a pair compute
/// (lower lane) (+) (upper lane), and all 32 lanes end with bit-identical (m, l).
__device__ __forceinline__ SoftmaxState<float> warp_merge(SoftmaxState<float> s) {
  const int lane = threadIdx.x % 32;
  // EXERCISE ch02.4: merge the (m, l) of the 32 lanes with a butterfly of __shfl_xor_sync
  //| (void)lane;  // TODO: your code here (s must end as the (+) of all 32 lanes' states, in every lane)
#pragma unroll
  for (int offset = 16; offset > 0; offset /= 2) {
    const SoftmaxState<float> other{__shfl_xor_sync(kFullMask, s.m, offset), __shfl_xor_sync(kFullMask, s.l, offset)};
    const bool upper = lane & offset;
    s = merge(upper ? other : s, upper ? s : other);
  }
  // END EXERCISE
  return s;
}

/// Block-wide max and sum (v1's three passes).
__device__ __forceinline__ float block_max(float x) {
  __shared__ float part[32];
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  x = warp_max(x);
  if (lane == 0) part[warp] = x;
  __syncthreads();
  x = warp_max(lane < int(blockDim.x / 32) ? part[lane] : neg_inf<float>());
  __syncthreads();  // part[] may be written again by a later call
  return x;
}

__device__ __forceinline__ float block_sum(float x) {
  __shared__ float part[32];
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  x = warp_sum(x);
  if (lane == 0) part[warp] = x;
  __syncthreads();
  x = warp_sum(lane < int(blockDim.x / 32) ? part[lane] : 0.f);
  __syncthreads();
  return x;
}

/// Block-wide (+) of the threads' (m, l): lanes, then warps, as the picture above.
__device__ __forceinline__ SoftmaxState<float> block_merge(SoftmaxState<float> s) {
  __shared__ float part_m[32], part_l[32];
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  s = warp_merge(s);
  if (lane == 0) {
    part_m[warp] = s.m;
    part_l[warp] = s.l;
  }
  __syncthreads();
  s = lane < int(blockDim.x / 32) ? SoftmaxState<float>{part_m[lane], part_l[lane]} : SoftmaxState<float>::identity();
  s = warp_merge(s);
  __syncthreads();
  return s;
}

}  // namespace attn::ch02
