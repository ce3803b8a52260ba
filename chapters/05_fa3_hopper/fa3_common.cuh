#pragma once
/// \file fa3_common.cuh
/// \brief What every step of chapter 05 shares and never changes: the kernel
///        parameters, the shared-memory plan, masking and conversions on the MMA
///        accumulator layout (whose online softmax is common/cuda/frag_softmax.cuh).
///        The steps differ in how tiles arrive and who computes.
///
/// **Who owns what.** A thread block owns Br = 128 query rows. In steps 2-9, eight MMA
/// warps each own 16 of them, grouped as two warpgroups of 64 (step 1 keeps chapter
/// 04's layout: 4 warps of 2 x 16 rows, or 8 warps of 16 at d = 256):
///
///     rows   0- 15  warp 0  \                      with wgmma:  warpgroup 0 = warps 0-3,
///     rows  16- 31  warp 1   |  warpgroup 0          one m64 MMA covers rows 0-63
///     ...                    |
///     rows  48- 63  warp 3  /
///     rows  64- 79  warp 4  \  warpgroup 1
///     ...                    |
///     rows 112-127  warp 7  /
///
/// and within a warp, lane l holds rows r0 = l / 4 and r1 = l / 4 + 8, columns
/// 8c + 2 (l % 4) + {0, 1} of every 8-column chunk c (the accumulator layout of both
/// mma.sync and wgmma). So the four lanes of a quad hold two whole rows, and every
/// row reduction is a local loop plus two shuffles.

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include <cstdint>

#include "common/cuda/frag_softmax.cuh"
#include "common/cuda/hopper/roles.cuh"
#include "common/online_softmax.hpp"
#include "fa3_tiles.hpp"

namespace attn::ch05 {

/// Everything a kernel needs besides its tensor maps.
struct Fa3Params {
  void* o = nullptr;       ///< [B][Hq][Nq][d], the input dtype
  float* lse = nullptr;    ///< [B][Hq][Nq]
  int batch = 1, heads = 1, kv_heads = 1, nq = 0, nk = 0;
  float scale_log2 = 0;    ///< tau * log2(e): scores are turned into base-2 exponents
  bool causal = false;     ///< bottom-right aligned: row i sees keys j <= i + (nk - nq)
  int n_qtiles = 0;        ///< ceil(nq / Br)
  // fp8 (step 7) only: per-block dequantisation scales.
  const float* q_scale = nullptr;  ///< [B][Hq][ceil(Nq / 64)]
  const float* k_scale = nullptr;  ///< [B][Hkv][ceil(Nk / 64)]
  const float* v_scale = nullptr;  ///< [B][Hkv][d] (per channel)
  // dynamic tile scheduler (step 13) only: [0] the next tile past the first round, [1] the
  // blocks that found the list empty; both 0 between launches.
  int* tile_counter = nullptr;
};

// ----------------------------------------------------------------------------- shared memory
//
// One Q tile and a ring of kStages K and V tiles, each stored as TMA boxes of
// kRowBytes-byte swizzled rows, then the mbarriers. Every tile starts 1024-aligned.
//
//     | Q: Br x d | K stage 0 | K stage 1 | V stage 0 | V stage 1 | barriers |
//       Q as boxes: [box 0: Br rows x 128 B][box 1: Br rows x 128 B] ...  (d = 128 bf16: 2 boxes)

template <class T, int D, int Bc, int kStages, int kVRows = Bc, int kQRows = kBr>
struct SmemPlan {
  static constexpr int kElem = int(sizeof(T));
  static constexpr int kRowBytes = D * kElem >= 128 ? 128 : D * kElem;  ///< bytes per box row
  static constexpr int kBoxCols = kRowBytes / kElem;                    ///< elements per box row
  static constexpr int kBoxes = D / kBoxCols;                           ///< boxes across d
  static constexpr int kQBytes = kQRows * D * kElem;  ///< the Q tile (kQRows = Br: 128, or 192 in step 14)
  static constexpr int kKBytes = Bc * D * kElem;      ///< one K stage
  static constexpr int kVBytes = kVRows * D * kElem;  ///< one V stage (V^T for fp8: d rows of Bc)
  static constexpr int kQ = 0;
  static constexpr int kK = kQ + kQBytes;
  static constexpr int kV = kK + kStages * kKBytes;
  static constexpr int kBars = kV + kStages * kVBytes;
  static constexpr int kNumBars = 2 + 4 * kStages;  ///< full_q, empty_q, full/empty for K and V
  static constexpr int kBytes = kBars + 8 * kNumBars + 1024;  ///< + slack to align the base
  static_assert(kQBytes % 1024 == 0 && kKBytes % 1024 == 0 && kVBytes % 1024 == 0,
                "every tile must keep the next one 1024-aligned");
};

/// A lane's ldmatrix addresses into a tile of ROWS rows that TMA wrote as boxes of
/// 64 16-bit columns (128-byte rows, 128-byte swizzle), box b of the tile at byte
/// b * ROWS * 128: chapter 04's SwizzledLane (common/cuda/smem_tiles.cuh) for TMA's
/// layout, with the same interface, so that step 1 reads its fragments as chapter 04
/// does. Chunk c (16 bytes) of row r sits in box c / 8 at chunk (c % 8) ^ (r % 8).
///
///     tile (d = 128):  [ box 0: ROWS rows x chunks 0-7 ][ box 1: ROWS rows x chunks 8-15 ]
template <int ROWS>
struct TmaLane {
  uint32_t base[4];
  /// `tile`: shared address of the tile; `row`: the row this lane points at when
  /// row_off = 0; `hi`: the lane's chunk parity bit.
  __device__ __forceinline__ TmaLane(uint32_t tile, int row, int hi) {
#pragma unroll
    for (int q = 0; q < 4; ++q) base[q] = tile + uint32_t(row * 8 + ((2 * q + hi) ^ (row & 7))) * 16u;
  }
  /// Address of row (row + row_off), chunk (c2 + hi); row_off a multiple of 8 and c2
  /// even, both compile-time constants after unrolling.
  __device__ __forceinline__ uint32_t at(int row_off, int c2) const {
    return base[(c2 & 7) >> 1] + uint32_t((c2 >> 3) * ROWS * 8 + row_off * 8) * 16u;
  }
};

/// The dynamic shared memory base rounded up to 1024 bytes (the 128B swizzle's atom).
__device__ __forceinline__ unsigned char* align_1024(unsigned char* p) {
  return reinterpret_cast<unsigned char*>((reinterpret_cast<uintptr_t>(p) + 1023) & ~uintptr_t(1023));
}

/// The mbarriers of a K/V ring of kStages stages, laid out after the tiles:
/// full_q, empty_q, full_k[S], full_v[S], empty_k[S], empty_v[S].
template <int kStages>
struct Barriers {
  uint64_t* full_q;
  uint64_t* empty_q;
  uint64_t* full_k;
  uint64_t* full_v;
  uint64_t* empty_k;
  uint64_t* empty_v;
  __device__ __forceinline__ explicit Barriers(unsigned char* at) {
    full_q = reinterpret_cast<uint64_t*>(at);
    empty_q = full_q + 1;
    full_k = full_q + 2;
    full_v = full_k + kStages;
    empty_k = full_v + kStages;
    empty_v = empty_k + kStages;
  }
};

// ----------------------------------------------------------------------------- roles
//
// A warp-specialised kernel's roles compute what they need from scratch after the
// split (common/cuda/hopper/roles.cuh says why): the shared-memory base too.

/// align_1024(raw), computed anew (fresh_zero() keeps the compiler from reusing the
/// address it computed before the split).
__device__ __forceinline__ unsigned char* fresh_smem(unsigned char* raw) {
  return align_1024(raw + hopper::fresh_zero());
}

// ----------------------------------------------------------------------------- arithmetic

/// Two floats as one register of two 16-bit values (low half = first), round to nearest.
template <class T> __device__ __forceinline__ uint32_t pack2(float lo, float hi);
template <> __device__ __forceinline__ uint32_t pack2<__nv_bfloat16>(float lo, float hi) {
  const __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
  return *reinterpret_cast<const uint32_t*>(&v);
}
template <> __device__ __forceinline__ uint32_t pack2<__half>(float lo, float hi) {
  const __half2 v = __floats2half2_rn(lo, hi);
  return *reinterpret_cast<const uint32_t*>(&v);
}

// ----------------------------------------------------------------------------- online softmax
//
// The (m, l) update on the accumulator fragment is common/cuda/frag_softmax.cuh,
// shared with the other chapters' tensor-core kernels.
using attn::cuda::RowSoftmax;
using attn::cuda::rescale;
using attn::cuda::exp2_approx;

// ----------------------------------------------------------------------------- exponentials on two pipes
//
// An SM computes 16 MUFU.EX2 a clock, but 128 fp32 FMAs (steps 11 and 12). When the
// softmax waits on the MUFU unit, some of its 2^x can be computed on the FMA pipe
// instead (FA4's software exponential), from 2^x = 2^j 2^f with j = round(x):
//
//     t = x + 1.5 * 2^23          the FADD rounds x to an integer j, kept in t's low mantissa bits
//     f = x - (t - 1.5 * 2^23)    f in [-1/2, 1/2]
//     p = 1 + f (a1 + f (a2 + ...))   2^f: a polynomial fitted for relative error (Horner, FFMA)
//     2^x = bits(p) + (bits(t) << 23)   adding j to p's exponent field: one integer shift and add
//
// Degree 3 errs by at most 1.0e-4 relative, degree 4 by 2.9e-6 (fp32 arithmetic, measured
// on 2e5 points of [-1/2, 1/2]); MUFU.EX2 itself by about 2e-7. x is clamped at -127,
// where j = -127 and f = 0 give p = 1 exactly and bits 0: a masked score (-inf) gives P = +0.
// Four FADD/FMNMX and `kDegree` FFMA on the FMA pipe, a shift and an add on the integer pipe.

/// 2^x for x <= 0 on the FMA pipe (kDegree 3 or 4; see above). The coefficients were
/// fitted once (near-minimax relative error, Lawson's iteration) and rounded to fp32.
template <int kDegree>
__device__ __forceinline__ float exp2_fma(float x) {
  static_assert(kDegree == 3 || kDegree == 4, "fitted for degree 3 and 4");
  constexpr float kRound = 12582912.f;  // 1.5 * 2^23: x + kRound rounds x to an integer
  x = fmaxf(x, -127.f);
  const float t = x + kRound;
  const float f = x - (t - kRound);
  float q;
  if constexpr (kDegree == 3) {
    q = fmaf(fmaf(0.0550087579f, f, 0.242211387f), f, 0.693283021f);
  } else {
    q = fmaf(fmaf(fmaf(0.00958287157f, f, 0.0559065007f), f, 0.240240991f), f, 0.693124175f);
  }
  const float p = fmaf(q, f, 1.f);
  return __int_as_float(__float_as_int(p) + (__float_as_int(t) << 23));
}

/// Which exponentials of a thread's NS scores go to the FMA pipe: one in kEvery
/// (index i % kEvery == kEvery - 1), the rest to MUFU.EX2; kEvery = 0: none.
template <int kEvery, int kDegree>
__device__ __forceinline__ float exp2_two_pipes(float x, int i) {
  if constexpr (kEvery == 0) {
    return exp2_approx(x);
  } else {
    return i % kEvery == kEvery - 1 ? exp2_fma<kDegree>(x) : exp2_approx(x);
  }
}

/// exp2_two_pipes as RowSoftmax::update's exponential policy (common/cuda/frag_softmax.cuh).
template <int kEvery, int kDegree>
struct Exp2TwoPipes {
  __device__ __forceinline__ float operator()(float x, int i) const { return exp2_two_pipes<kEvery, kDegree>(x, i); }
};

/// RowSoftmax::update with one exponential in kEvery on the FMA pipe: the same (m, l)
/// state, the same alpha, the same P up to exp2_fma's error.
template <int kEvery, int kDegree, int NS>
__device__ __forceinline__ void softmax_update_two_pipes(RowSoftmax& sm, float (&s)[NS], float c,
                                                         float (&alpha)[2]) {
  sm.update(s, c, alpha, Exp2TwoPipes<kEvery, kDegree>{});
}

// ----------------------------------------------------------------------------- descriptors by addition
//
// make_desc (common/cuda/hopper/wgmma.cuh) builds a wgmma descriptor from a shared address:
// the address masked to 18 bits and shifted right by 4 into bits 0-13, the strides and the
// swizzle mode above. Built in the loop, that is five dependent instructions a wgmma (add,
// mask, shift, or, move: v21's SASS), 16 wgmmas a block at d = 64. Built once from the tile's
// base, each descriptor of the loop is the base plus a constant number of 16-byte units in
// its address field: one integer add on the low word.

/// `desc` moved `units` x 16 bytes further into shared memory: the start-address field plus
/// units, everything else kept. Exact while the address stays below 256 KB (bits 0-13 hold
/// address / 16; an SM has 228 KB of shared memory), which every tile of a block does.
__device__ __forceinline__ uint64_t desc_advance(uint64_t desc, uint32_t units) {
  return (desc & 0xFFFFFFFF00000000ull) | uint32_t(uint32_t(desc) + units);
}

// ----------------------------------------------------------------------------- row reductions in chains
//
// RowSoftmax::update<kChains> (common/cuda/frag_softmax.cuh, "Row reductions in chains")
// runs the row max and the row sum as kChains independent partial chains a row (v21's
// idea); here with exp2_two_pipes as the exponential, as softmax_update_two_pipes.

/// RowSoftmax::update (with exp2_two_pipes as its exponential) whose row max and row sum
/// run as kChains independent partial chains a row: the same (m, l), alpha and P.
template <int kChains, int kEvery, int kDegree, int NS>
__device__ __forceinline__ void softmax_update_chains(RowSoftmax& sm, float (&s)[NS], float c, float (&alpha)[2]) {
  sm.update<kChains>(s, c, alpha, Exp2TwoPipes<kEvery, kDegree>{});
}

/// The same for FP8 scores with their dequantisation folded into the exponent's FFMA:
/// s holds raw Q8 K8^T, and entries [32h, 32h + 32) (keys 64h .. 64h + 63 of the block)
/// take the scale c[h] > 0 (s_q s_k tau log2 e). The row max is taken per half on the
/// raw scores and scaled once (c > 0 keeps the order), so the only per-score
/// multiplication left is the FFMA that also subtracts the max.
///
/// kLazy > 0 (step 15): a row keeps its old max unless the new one is more than kLazy
/// (in log2 units) above it, so that its alpha is exactly 1 and O need not be rescaled;
/// P is then at most 2^kLazy (E4M3 holds up to 448), and since l and O share the stale
/// max, O / l and the LSE come out the same.
template <int kEvery, int kDegree, int NS, int kLazy = 0>
__device__ __forceinline__ void softmax_update_scaled_two_pipes(RowSoftmax& sm, float (&s)[NS],
                                                                const float (&c)[NS / 32], float (&alpha)[2]) {
  constexpr int kHalves = NS / 32;
  float mx[2] = {sm.m[0], sm.m[1]};
#pragma unroll
  for (int h = 0; h < kHalves; ++h) {
    float mh[2] = {neg_inf<float>(), neg_inf<float>()};
#pragma unroll
    for (int i = 32 * h; i < 32 * (h + 1); ++i) mh[(i >> 1) & 1] = fmaxf(mh[(i >> 1) & 1], s[i]);
#pragma unroll
    for (int r = 0; r < 2; ++r) mx[r] = fmaxf(mx[r], mh[r] * c[h]);  // -inf * c = -inf
  }
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffffu, mx[r], 1));
    mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffffu, mx[r], 2));
  }
  if constexpr (kLazy > 0) {
#pragma unroll
    for (int r = 0; r < 2; ++r)  // the same in the four lanes of a row's quad: mx and m are
      if (sm.m[r] != neg_inf<float>() && mx[r] - sm.m[r] <= float(kLazy)) mx[r] = sm.m[r];
  }
  float shift[2];
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    shift[r] = finite_max(mx[r]);
    alpha[r] = kLazy > 0 && mx[r] == sm.m[r] ? 1.f : exp2_approx(sm.m[r] - finite_max(mx[r]));
    sm.m[r] = mx[r];
    sm.l[r] *= alpha[r];
  }
#pragma unroll
  for (int i = 0; i < NS; ++i) {
    const int r = (i >> 1) & 1;
    s[i] = exp2_two_pipes<kEvery, kDegree>(fmaf(s[i], c[i / 32], -shift[r]), i);
    sm.l[r] += s[i];
  }
}

/// Sets to -inf every score of this thread whose key is at or past its row's limit.
/// `col0`: the block's first key; `limit[r]`: one past the last key row r may see.
template <int NS>
__device__ __forceinline__ void apply_mask(float (&s)[NS], int col0, int lane, const int (&limit)[2]) {
#pragma unroll
  for (int i = 0; i < NS; ++i) {
    const int col = col0 + 8 * (i / 4) + 2 * (lane % 4) + (i & 1);
    if (col >= limit[(i >> 1) & 1]) s[i] = neg_inf<float>();
  }
}

/// P (fp32, accumulator layout) as 16-bit pairs: p[j] = (s[2j], s[2j+1]). The four
/// registers of k-slice kk are then p[4kk .. 4kk+3], the A operand of P V as is.
template <class T, int NS>
__device__ __forceinline__ void convert_p(const float (&s)[NS], uint32_t (&p)[NS / 2]) {
#pragma unroll
  for (int j = 0; j < NS / 2; ++j) p[j] = pack2<T>(s[2 * j], s[2 * j + 1]);
}

/// P (fp32, accumulator layout) as E4M3, four per register, in the order of the fp8
/// A fragment: register 4q + r of slice q holds this thread's P at k-positions
/// {4t..4t+3} (r = 0: row r0, 1: row r1) and {16+4t..} (r = 2, 3), which are the keys
/// {2t, 2t+1, 8+2t, 9+2t} (+16) that the accumulator gives it.
template <int NS>
__device__ __forceinline__ void convert_p_fp8(const float (&s)[NS], uint32_t (&p)[NS / 4]) {
  auto pack4 = [](float a, float b, float c, float d) {
    const uint32_t lo = __nv_cvt_float2_to_fp8x2(make_float2(a, b), __NV_SATFINITE, __NV_E4M3);
    const uint32_t hi = __nv_cvt_float2_to_fp8x2(make_float2(c, d), __NV_SATFINITE, __NV_E4M3);
    return lo | (hi << 16);
  };
#pragma unroll
  for (int q = 0; q < NS / 16; ++q) {
    const float* x = &s[16 * q];
    p[4 * q + 0] = pack4(x[0], x[1], x[4], x[5]);
    p[4 * q + 1] = pack4(x[2], x[3], x[6], x[7]);
    p[4 * q + 2] = pack4(x[8], x[9], x[12], x[13]);
    p[4 * q + 3] = pack4(x[10], x[11], x[14], x[15]);
  }
}

/// Writes this thread's part of O (normalised by inv_l) and, from lane 0 of each quad,
/// the LSE of its two rows; rows at or past nq are not written.
template <class T, int NO>
__device__ __forceinline__ void store_o(const Fa3Params& p, int bh, const int (&row)[2], int lane,
                                        const float (&o)[NO], const float (&inv_l)[2], const float (&lse)[2]) {
  constexpr int D = NO * 2;
  T* out = static_cast<T*>(p.o) + size_t(bh) * p.nq * D;
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    if (row[r] >= p.nq) continue;
    T* dst = out + size_t(row[r]) * D + 2 * (lane % 4);
#pragma unroll
    for (int c = 0; c < D / 8; ++c)
      *reinterpret_cast<uint32_t*>(dst + 8 * c) = pack2<T>(o[4 * c + 2 * r] * inv_l[r], o[4 * c + 2 * r + 1] * inv_l[r]);
    if (lane % 4 == 0) p.lse[size_t(bh) * p.nq + row[r]] = lse[r];
  }
}

}  // namespace attn::ch05
