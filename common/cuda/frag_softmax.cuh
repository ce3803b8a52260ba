#pragma once
/// \file frag_softmax.cuh
/// \brief The online softmax on tensor-core accumulator fragments: the running
///        (m, ℓ) of a thread's two rows, updated one block of scores at a time, in base 2.
///
/// **The layout it works on.** `mma.sync.m16n8k16` (common/cuda/mma_sync.cuh) and
/// `wgmma.mma_async` (common/cuda/hopper/wgmma.cuh) leave the fp32 accumulator of a
/// warp's 16 rows in the same per-warp layout: lane l holds rows r0 = l / 4 and
/// r1 = l / 4 + 8, and of every 8-column chunk c the columns 8c + 2 (l % 4) + {0, 1}:
///
///     s[4c + 0], s[4c + 1] = S(r0, 8c + 2 (l % 4) + {0, 1})
///     s[4c + 2], s[4c + 3] = S(r1, 8c + 2 (l % 4) + {0, 1})     so  row of s[i] = (i >> 1) & 1
///
///                 chunk c:   cols 8c .. 8c+7
///     row r0   lane 4g+0: c0 c1 | lane 4g+1: c0 c1 | lane 4g+2: c0 c1 | lane 4g+3: c0 c1
///     row r1   lane 4g+0: c2 c3 | ...
///
/// So the four lanes of a *quad* (4g .. 4g+3) hold two whole rows: a row maximum is
/// a local loop plus two `__shfl_xor_sync` (1 and 2), and a row sum needs the same
/// two shuffles once, at the end. (m64nN wgmma is four warps of this, rows 16 w ..)
///
/// **The update** (FA2/FA3's rescaled accumulation; common/online_softmax.hpp is the
/// scalar form and its ⊕ merge), with c = τ log2 e folded into one FFMA per score:
/// \f[ m^{new} = \max(m, \max_j s_j),\quad P_j = 2^{c\, s_j - c\, m^{new}},\quad
///     \alpha = 2^{c\,(m - m^{new})},\quad \ell \leftarrow \alpha \ell + \textstyle\sum_j P_j,\quad
///     O \leftarrow \alpha O + P V \f]
/// m is kept in score units, so c s - c m is one FFMA; ℓ holds only this thread's
/// columns until finish(). A row that has seen only masked scores (-inf) keeps
/// m = -inf; every shift goes through finite_max(), so it yields P = 0 and α = 0,
/// never NaN, and finish() gives it 1/ℓ = 0 and LSE = -inf.

#include "common/cuda/fast_math.cuh"
#include "common/online_softmax.hpp"

namespace attn::cuda {

/// The exponential that RowSoftmax::update applies to each shifted score: MUFU.EX2
/// (exp2_approx) for every one. The policy is any callable `float(float x, int i)`,
/// i the score's index in the thread's fragment (a compile-time constant after
/// unrolling), so that a kernel can send some exponentials to another pipe (chapter 05's
/// Exp2TwoPipes: one in four as a polynomial on the FMA pipe) and keep the rest of the
/// update, and α's exponential, as they are here.
struct Exp2Mufu {
  __device__ __forceinline__ float operator()(float x, int /*i*/) const { return exp2_approx(x); }
};

/// **Row reductions in chains.** With one chain a row (kChains = 1), the update's row
/// maximum is NS / 2 dependent FMNMX and its row sum NS / 2 dependent FADD, each waiting
/// for the one before it (chapter 05's v17 at Bc = 192: two chains of 48). Split into
/// kChains partial chains a row, each over every kChains-th pair of the row's scores, the
/// same reductions are kChains times shorter (NS / (2 kChains) deep, then a tree of
/// log2 kChains), as FA4's row max (four partial maxima); the maximum is the same number,
/// the sum adds the same P in another order. Chapter 05's v21 introduces it:
///
///     row r's scores of a thread:  i = 4q + 2r + e   (q < NS / 4, e = 0, 1)
///     chain of s[i]:               e + 2 (q % (kChains / 2))     (kChains = 1: all in one)
template <int kChains>
__device__ __forceinline__ constexpr int row_chain(int i) {
  return kChains == 1 ? 0 : (i & 1) + 2 * ((i >> 2) % (kChains / 2));
}

/// The running (m, ℓ) of the two rows a thread holds in an accumulator fragment.
struct RowSoftmax {
  float m[2];
  float l[2];

  __device__ __forceinline__ void init() {
    m[0] = m[1] = neg_inf<float>();
    l[0] = l[1] = 0.f;
  }

  /// s: this thread's scores of one block (NS floats, the layout above), replaced by
  /// P. alpha: the factor each row's O must be multiplied by before adding P V.
  /// exp2: the exponential of P (Exp2Mufu above unless a kernel passes its own).
  /// kChains: the row max and the row sum each as that many independent partial chains
  /// a row (1, 2 or 4; see row_chain above); 1, the default, is one chain a row.
  template <int kChains = 1, int NS, class Exp2 = Exp2Mufu>
  __device__ __forceinline__ void update(float (&s)[NS], float c, float (&alpha)[2], Exp2 exp2 = {}) {
    static_assert(kChains == 1 || kChains == 2 || kChains == 4, "1, 2 or 4 chains a row");
    static_assert(NS % (2 * kChains) == 0, "every chain takes as many scores");
    float mx[2][kChains];
#pragma unroll
    for (int r = 0; r < 2; ++r)
#pragma unroll
      for (int k = 0; k < kChains; ++k) mx[r][k] = k == 0 ? m[r] : neg_inf<float>();
#pragma unroll
    for (int i = 0; i < NS; ++i) {
      float& x = mx[(i >> 1) & 1][row_chain<kChains>(i)];
      x = fmaxf(x, s[i]);
    }
#pragma unroll
    for (int r = 0; r < 2; ++r) {
#pragma unroll
      for (int w = kChains / 2; w >= 1; w /= 2)  // the partial maxima joined (none for one chain)
#pragma unroll
        for (int k = 0; k < w; ++k) mx[r][k] = fmaxf(mx[r][k], mx[r][k + w]);
      mx[r][0] = fmaxf(mx[r][0], __shfl_xor_sync(0xffffffffu, mx[r][0], 1));
      mx[r][0] = fmaxf(mx[r][0], __shfl_xor_sync(0xffffffffu, mx[r][0], 2));
    }
    float shift[2];
    float ls[2][kChains];
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      shift[r] = finite_max(mx[r][0]) * c;
      // The difference of the maxima first, then the scale: exactly 0 (alpha = 1) when
      // the max did not change. m * c - shift would round m * c differently from the
      // shift of the tile that set m (or be contracted into one FMA), so every tile
      // would rescale l and O by a factor 1 + O(|m c| u) other than 1: a drift that
      // grows with the number of tiles (a long decode's LSE). m = -inf: 2^-inf = 0.
      alpha[r] = exp2_approx((m[r] - finite_max(mx[r][0])) * c);
      m[r] = mx[r][0];
      l[r] *= alpha[r];  // chain 0 of the row sum; chains 1.. start at 0
#pragma unroll
      for (int k = 1; k < kChains; ++k) ls[r][k] = 0.f;
    }
#pragma unroll
    for (int i = 0; i < NS; ++i) {
      const int r = (i >> 1) & 1, k = row_chain<kChains>(i);
      s[i] = exp2(fmaf(s[i], c, -shift[r]), i);  // a masked score is -inf: P = 0
      (k == 0 ? l[r] : ls[r][k]) += s[i];
    }
#pragma unroll
    for (int r = 0; r < 2; ++r)
#pragma unroll
      for (int w = kChains / 2; w >= 1; w /= 2)  // the partial sums joined into l
#pragma unroll
        for (int k = 0; k < w; ++k) (k == 0 ? l[r] : ls[r][k]) += ls[r][k + w];
  }

  /// Finishes the rows: ℓ summed over the quad, 1/ℓ (0 for an empty row) in inv_l,
  /// and the natural-log LSE = (c m + log2 ℓ) ln 2 (-inf for an empty row).
  __device__ __forceinline__ void finish(float c, float (&inv_l)[2], float (&lse)[2]) {
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      float sum = l[r];
      sum += __shfl_xor_sync(0xffffffffu, sum, 1);
      sum += __shfl_xor_sync(0xffffffffu, sum, 2);
      inv_l[r] = sum > 0.f ? 1.f / sum : 0.f;
      lse[r] = sum > 0.f ? (m[r] * c + __log2f(sum)) * float(kLn2) : neg_inf<float>();
    }
  }
};

/// O *= alpha, row by row (O in the same accumulator layout: row of o[i] = (i >> 1) & 1).
template <int NO>
__device__ __forceinline__ void rescale(float (&o)[NO], const float (&alpha)[2]) {
#pragma unroll
  for (int i = 0; i < NO; ++i) o[i] *= alpha[(i >> 1) & 1];
}

}  // namespace attn::cuda
