// Chapter 07, decode step v9: S^T = K Q^T, the keys on the MMA's M side and the heads on N;
// 8-bit pages (Hopper; the chapter's README, section 5).
//
// What changes from v7, every change: WarpCodes rewritten for the transposed products (Q^T as
// B fragments, the column softmax ColSoftmax, the four shuffles of P^T, O^T's store with the
// dims back in order; the K and V scales per box, two per warp, so the V scales' maximum needs
// no shuffles); kHeads = 8 heads per block in place of Geo::kRows = 16 (the block's first head
// and row count; the launcher's head chunks); the launcher's name.
//
// Why: with GQA 32/8 a block has G = 4 query heads, and v4-v7 put them on the M side of
// m16n8k16: 12 of every 16 rows the tensor cores multiply are zeros, and every per-row
// register array (S, the softmax, O) is twice what 8 rows would need. v9 turns the products
// round: S^T = K Q^T (16 keys of the warp on M, the heads on N) and O^T = V^T P^T (16 dims on
// M, the keys on K). The codes are loaded and converted as before, only handed to the MMA as
// A fragments; per warp and tile the MMAs fall from 32 to 16, a lane's scores from 8 to 4 and
// its O from 64 floats to 32. The softmax runs over S^T's columns (a head's maximum over the
// 8 lanes of one lane % 4: xor 4, 8, 16), and P^T's C fragment becomes O^T's B fragment by
// four shuffles. A block takes 8 heads (G = 16 and MQA take two or more blocks per KV head).
//
//   per warp, tile it:  S^T (16 keys x 8 heads) = K (16 x 128) Q^T          8 MMAs
//                       column softmax, K and V scales on S^T's rows (the warp's two boxes)
//                       O^T (128 dims x 8 heads) += V^T (128 x 16 keys) P^T   8 MMAs
//
// What it buys: half the MMAs and registers per tile (recorded H200 run, FP8, B = 8, L = 32K,
// GQA 32/8: 3550 GB/s against v7's 3077; B = 1, L = 64K: 2650 against 2082).

#include "common/cuda/check.cuh"
#include "common/cuda/hopper/mbarrier.cuh"
#include "common/cuda/hopper/tma.cuh"
#include "decode_steps.cuh"

namespace attn::ch07::gpu::v9 {

/// Byte offset of 16-byte chunk `ch` of row `row` in a [64][D] tile of 8-bit codes,
/// XOR-swizzled: chunk ch ^ (row & 7), so the rows a load phase reads at one chunk
/// position fall in different bank groups (d = 128: 8 chunks per row).
template <int D>
__device__ __forceinline__ uint32_t code_offset(int row, int ch) {
  static_assert(D == 128, "the 8-bit stage is laid out for d = 128");
  return uint32_t(row) * D + uint32_t((ch ^ (row & 7)) * 16);
}

/// An 8-bit stage as the warp reads it: the K and V codes (code_offset() layout, which
/// is the TMA's 128-byte swizzle) and one K and one V scale per box.
struct CodeRows {
  const unsigned char* k;
  const unsigned char* v;
  const float* scales;
  int box_shift;  ///< log2 of the rows per TMA box: one K and one V scale per box
  /// Row `row`'s (0..63 of the tile) K scale (which = 0) or V scale (which = 1).
  __device__ __forceinline__ float scale(int row, int which) const {
    return scales[which * Geo::kBc + (row >> box_shift)];
  }
};

/// The 16 bytes of chunk `ch` of row `row` of a code tile.
template <int D>
__device__ __forceinline__ uint4 load_chunk(const unsigned char* tile, int row, int ch) {
  return *reinterpret_cast<const uint4*>(tile + code_offset<D>(row, ch));
}

/// Word i (0..3) of a 16-byte chunk.
__device__ __forceinline__ uint32_t word(const uint4& c, int i) { return i == 0 ? c.x : i == 1 ? c.y : i == 2 ? c.z : c.w; }

/// The online softmax of S^T's columns (the heads), in base 2 as cuda::RowSoftmax: a lane
/// holds two heads, 2q and 2q + 1 (element i of its C fragment is head 2q + i % 2, key n
/// for i < 2 and n + 8 for i >= 2), and a head's keys are spread over the 8 lanes of the
/// same q, so its maximum is a reduction over lanes 4 apart (xor 4, 8, 16), not over a quad.
struct ColSoftmax {
  float m[2];  ///< heads 2q, 2q + 1: the maximum so far, in score units
  float l[2];  ///< this lane's part of each head's sum (its two keys of every tile)

  __device__ __forceinline__ void init() {
    m[0] = m[1] = neg_inf<float>();
    l[0] = l[1] = 0.f;
  }
  /// s: the lane's four scores, replaced by P; alpha: each head's factor for O.
  __device__ __forceinline__ void update(float (&s)[4], float c, float (&alpha)[2]) {
    float mx[2] = {fmaxf(m[0], fmaxf(s[0], s[2])), fmaxf(m[1], fmaxf(s[1], s[3]))};
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      mx[h] = fmaxf(mx[h], __shfl_xor_sync(0xffffffffu, mx[h], 4));
      mx[h] = fmaxf(mx[h], __shfl_xor_sync(0xffffffffu, mx[h], 8));
      mx[h] = fmaxf(mx[h], __shfl_xor_sync(0xffffffffu, mx[h], 16));
    }
    float shift[2];
#pragma unroll
    for (int h = 0; h < 2; ++h) {  // as RowSoftmax::update: exactly 1 when the max stayed
      shift[h] = finite_max(mx[h]) * c;
      alpha[h] = cuda::exp2_approx((m[h] - finite_max(mx[h])) * c);
      m[h] = mx[h];
      l[h] *= alpha[h];
    }
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      s[i] = cuda::exp2_approx(fmaf(s[i], c, -shift[i & 1]));  // a masked score is -inf: P = 0
      l[i & 1] += s[i];
    }
  }
};

/// One warp's 16 keys of every tile against the block's (up to) 8 heads, with the keys on
/// the MMA's M side: S^T = K Q^T (16 keys x 8 heads) and O^T += V^T P^T (128 dims x 8
/// heads). In v8 the heads were M, 16 rows of which G = 4 are real; here they are N, 8
/// columns: half the MMAs per tile (8 for S^T, 8 for O^T, not 16 and 16), half the
/// accumulators (4 scores and 32 O values a lane, not 8 and 64), half the softmax and
/// rescale arithmetic. The codes are loaded and converted exactly as in v8, now as A
/// fragments; Q^T is the B operand of S^T and P^T that of O^T.
///
///   lane l = 4n + q:
///     S^T, P^T (C):    s[0], s[1] = key n, heads 2q, 2q + 1;  s[2], s[3] = key n + 8
///     K (A), k-step ks: keys n, n + 8, dims 32q + 4ks + {0, 1} and {2, 3} (v8's dim order)
///     Q^T (B):          head n, the same dims
///     V^T (A), m-tile t: rows n, n + 8 = dims 16n + 2t, 16n + 2t + 1; keys 2q, 2q + 1, 2q + 8, 2q + 9
///     O^T (C), m-tile t: o[4t + 0, 1] = dim 16n + 2t, heads 2q, 2q + 1;  o[4t + 2, 3] = dim 16n + 2t + 1
///     P^T (B):          keys 2q, 2q + 1 and 2q + 8, 2q + 9, head n: P's C fragment
///                       transposed by four shuffles
///
/// A warp's 16 keys lie in two TMA boxes of at least 8 rows (v7: P >= 8), keys 0-7 in one
/// and 8-15 in the other, so a lane's two keys have the warp's two K scales and two V
/// scales, and the warp's largest V scale is the larger of two: no shuffles.
template <int D, KvDtype F>
struct WarpCodes {
  static constexpr int KS = D / 16;  ///< k-steps of S^T
  static constexpr int MT = D / 16;  ///< 16-dim m-tiles of O^T
  static_assert(D == 128, "lane q's K bytes [32q, 32q + 32) are 4 KS bytes, lane n's V bytes [16n, 16n + 16): d = 128");
  uint32_t qb[KS][2];  ///< Q^T as B fragments: head n, dims 32q + 4ks + {0, 1} and {2, 3}
  float o[4 * MT];     ///< O^T, in units of vsig
  float vsig;          ///< O's unit, the largest V scale so far (0: none yet)
  ColSoftmax softmax;

  /// Heads h0 .. h0 + rows - 1 (rows <= 8); the others are zero.
  __device__ __forceinline__ void init(const bf16* q, int rows) {
    const int lane = threadIdx.x % 32, n = lane / 4, qq = lane % 4;
#pragma unroll
    for (int ks = 0; ks < KS; ++ks)
#pragma unroll
      for (int i = 0; i < 2; ++i) {
        const int col = (D / 4) * qq + 4 * ks + 2 * i;
        const uint32_t x = n < rows ? *reinterpret_cast<const uint32_t*>(q + std::size_t(n) * D + col) : 0u;
        const float2 f = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&x));
        qb[ks][i] = cuda::pack2<__half>(f.x, f.y);
      }
#pragma unroll
    for (int i = 0; i < 4 * MT; ++i) o[i] = 0.f;
    vsig = 0.f;
    softmax.init();
  }

  /// Keys k0 .. k0 + 15 of the stage; only the first `valid` exist.
  __device__ __forceinline__ void tile(const CodeRows& rows, int k0, int valid, float c) {
    const int lane = threadIdx.x % 32, n = lane / 4, q = lane % 4;
    // K: keys k0 + n (t = 0) and k0 + 8 + n (t = 1), chunks 2q and 2q + 1 of each: v8's loads.
    uint4 kc[2][2];
#pragma unroll
    for (int t = 0; t < 2; ++t)
#pragma unroll
      for (int j = 0; j < 2; ++j) kc[t][j] = load_chunk<D>(rows.k, k0 + 8 * t + n, 2 * q + j);
    // S^T = K Q^T: one MMA per k-step, the even and odd k-steps in two accumulators (two
    // chains of four dependent MMAs, not one of eight), added at the end.
    float s[4] = {}, s2[4] = {};
#pragma unroll
    for (int ks = 0; ks < KS; ++ks) {
      uint32_t a[4];
      codes_to_f16<F>(word(kc[0][ks / 4], ks % 4), a[0], a[2]);
      codes_to_f16<F>(word(kc[1][ks / 4], ks % 4), a[1], a[3]);
      cuda::mma_m16n8k16<__half>(ks % 2 ? s2 : s, a, qb[ks][0], qb[ks][1]);
    }
    // Row j (key j) times its K scale: keys n and n + 8 are in the warp's two boxes.
    const float k_lo = rows.scale(k0, 0), k_hi = rows.scale(k0 + 8, 0);
#pragma unroll
    for (int i = 0; i < 4; ++i) s[i] = (s[i] + s2[i]) * (i < 2 ? k_lo : k_hi);
    // Mask the keys past the end: -inf, which the softmax turns into P = 0.
    if (n >= valid) s[0] = s[1] = neg_inf<float>();
    if (n + 8 >= valid) s[2] = s[3] = neg_inf<float>();
    float alpha[2];
    softmax.update(s, c, alpha);
    // O rescaled only if some head's maximum grew (alpha is exactly 1 otherwise); O^T's
    // column is the head: elements 0, 2 of each m-tile are head 2q, elements 1, 3 head 2q + 1.
    if (__any_sync(0xffffffffu, alpha[0] != 1.f || alpha[1] != 1.f)) {
#pragma unroll
      for (int i = 0; i < 4 * MT; ++i) o[i] *= alpha[i & 1];
    }
    // P's row j times s_j / vsig, vsig the largest V scale so far (as p_times_v_scales()
    // of decode_tile.cuh, with the warp's two V scales).
    const float v_lo = rows.scale(k0, 1), v_hi = rows.scale(k0 + 8, 1);
    const float mx = fmaxf(vsig, fmaxf(v_lo, v_hi));
    if (mx > vsig) {  // warp-uniform
      const float r = vsig / mx;  // 0 while O is still 0
#pragma unroll
      for (int i = 0; i < 4 * MT; ++i) o[i] *= r;
      vsig = mx;
    }
    const float inv = mx > 0.f ? 1.f / mx : 0.f;
    // P^T as f16 pairs: w[0] = key n, heads 2q, 2q + 1; w[1] = key n + 8.
    const uint32_t w[2] = {cuda::pack2<__half>(s[0] * (v_lo * inv), s[1] * (v_lo * inv)),
                           cuda::pack2<__half>(s[2] * (v_hi * inv), s[3] * (v_hi * inv))};
    // The B fragment of P^T wants keys 2q, 2q + 1 (+ 8) of head n: key k's pair of heads
    // 2(n/2), 2(n/2) + 1 is in lane 4k + n/2; the half n % 2 is head n.
    uint32_t pb[2];
#pragma unroll
    for (int t = 0; t < 2; ++t) {
      const uint32_t x = __shfl_sync(0xffffffffu, w[t], 4 * (2 * q) + n / 2);
      const uint32_t y = __shfl_sync(0xffffffffu, w[t], 4 * (2 * q + 1) + n / 2);
      pb[t] = __byte_perm(x, y, n % 2 ? 0x7632u : 0x5410u);
    }
    // V: keys 2q, 2q + 1 (vc[0], vc[1]) and 2q + 8, 2q + 9 (vc[2], vc[3]), dims 16n .. 16n + 15:
    // chunk n, v8's loads and conversions. Word w holds dims 16n + 4w .. + 3; interleaved key
    // by key, then converted, its pairs are the A registers of m-tiles 2w and 2w + 1 (row n
    // of m-tile t is dim 16n + 2t, row n + 8 dim 16n + 2t + 1).
    uint4 vc[4];
#pragma unroll
    for (int i = 0; i < 4; ++i) vc[i] = load_chunk<D>(rows.v, k0 + 2 * q + (i & 1) + 8 * (i >> 1), n);
#pragma unroll
    for (int ww = 0; ww < 4; ++ww) {
      uint32_t lo[4], hi[4];
      codes_to_f16<F>(__byte_perm(word(vc[0], ww), word(vc[1], ww), 0x5140u), lo[0], lo[1]);
      codes_to_f16<F>(__byte_perm(word(vc[0], ww), word(vc[1], ww), 0x7362u), lo[2], lo[3]);
      codes_to_f16<F>(__byte_perm(word(vc[2], ww), word(vc[3], ww), 0x5140u), hi[0], hi[1]);
      codes_to_f16<F>(__byte_perm(word(vc[2], ww), word(vc[3], ww), 0x7362u), hi[2], hi[3]);
      const uint32_t a0[4] = {lo[0], lo[1], hi[0], hi[1]}, a1[4] = {lo[2], lo[3], hi[2], hi[3]};
      cuda::mma_m16n8k16<__half>(acc4(o, 2 * ww), a0, pb[0], pb[1]);
      cuda::mma_m16n8k16<__half>(acc4(o, 2 * ww + 1), a1, pb[0], pb[1]);
    }
  }

  /// Each head's sum over the 8 lanes that share it, and the warp's (m, l, O) to shared
  /// memory as v8 leaves them (ms, ls [4 warps][16], os [4 warps][16][D]; heads 0-7 of the
  /// warp's 16 rows), O^T's dims put back in order.
  __device__ __forceinline__ void store(float* ms, float* ls, float* os, float c) {
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, n = lane / 4, q = lane % 4;
    float l[2];
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      l[h] = softmax.l[h];
      l[h] += __shfl_xor_sync(0xffffffffu, l[h], 4);
      l[h] += __shfl_xor_sync(0xffffffffu, l[h], 8);
      l[h] += __shfl_xor_sync(0xffffffffu, l[h], 16);
    }
    if (n == 0) {
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        ms[warp * 16 + 2 * q + h] = softmax.m[h] * c;  // -inf stays -inf (c > 0)
        ls[warp * 16 + 2 * q + h] = l[h];
      }
    }
    const float u = vsig;  // O back to value units
#pragma unroll
    for (int t = 0; t < MT; ++t)
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        const int head = 2 * q + (i & 1), dim = 16 * n + 2 * t + (i >> 1);
        os[std::size_t(warp * 16 + head) * D + dim] = o[4 * t + i] * u;
      }
  }
};

/// The warp's state for a K/V type: v3's for bf16, WarpCodes for an 8-bit cache.
template <int D, class Kv, bool = kv_quantised(Kv::kDtype)>
struct WarpDecodeV4Of {
  using type = WarpDecodeFor<D, Kv>;
};
template <int D, class Kv>
struct WarpDecodeV4Of<D, Kv, true> {
  using type = WarpCodes<D, Kv::kDtype>;
};
template <int D, class Kv>
using WarpDecodeV4 = typename WarpDecodeV4Of<D, Kv>::type;

/// The boxes of one tile that a lane of warp 0 owns (box j = lane + 32 r: up to 64 boxes,
/// at P = 1), read one tile ahead: each box's pool coordinates and its K and V scale.
struct BoxPages {
  int slot[2], outer[2];  ///< the box's first slot in its page, and page * kv_heads + hk
  float ks[2], vs[2];     ///< its scales; 0 for a box wholly past the sequence's end
};

/// Reads the lane's boxes of the tile at t0 (rows [t0, t0 + 64), boxes of 1 << box_shift
/// rows). A box wholly past t_end reads the last valid row's page again, with scale 0.
template <KvDtype F>
__device__ __forceinline__ BoxPages read_boxes(const PagedKv8<F>& kv, int b, int hk, int t0, int t_end,
                                               int box_shift) {
  const int lane = threadIdx.x % 32;
  BoxPages bp;
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int j = lane + 32 * r, t = t0 + (j << box_shift);
    const bool in = t < t_end && j < (Geo::kBc >> box_shift);
    const int tl = in ? t : max(t_end - 1, 0);
    const int page = __ldg(kv.block_table + std::size_t(b) * kv.max_pages + (tl >> kv.page_shift));
    bp.slot[r] = (tl & ((1 << kv.page_shift) - 1)) & ~((1 << box_shift) - 1);
    bp.outer[r] = page * kv.kv_heads + hk;
    bp.ks[r] = in ? __ldg(kv.k_scale + bp.outer[r]) : 0.f;
    bp.vs[r] = in ? __ldg(kv.v_scale + bp.outer[r]) : 0.f;
  }
  return bp;
}

/// Warp 0: one tile's copies into a stage. Lane 0 announces the stage's 16 KB to its
/// mbarrier; then each lane asks the TMA for its boxes of K and of V and stores their
/// scales.
template <int D>
__device__ __forceinline__ void issue_boxes(const CodeMaps& maps, unsigned char* sk, unsigned char* sv, float* scales,
                                            uint64_t* bar, const BoxPages& bp, int box_shift) {
  const int lane = threadIdx.x % 32;
  if (lane == 0) hopper::mbarrier_arrive_expect_tx(bar, 2u * Geo::kBc * D);
  __syncwarp();
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int j = lane + 32 * r;
    if (j < (Geo::kBc >> box_shift)) {
      hopper::tma_load_3d(sk + (j << box_shift) * D, &maps.k, bar, 0, bp.slot[r], bp.outer[r]);
      hopper::tma_load_3d(sv + (j << box_shift) * D, &maps.v, bar, 0, bp.slot[r], bp.outer[r]);
      scales[j] = bp.ks[r];
      scales[Geo::kBc + j] = bp.vs[r];
    }
  }
}

/// Shared memory of a v7 block: the stages' codes (16 KB each, 1024-byte aligned: one
/// KB of slack for the alignment), then the scales, 2 x 64 floats per stage.
template <int D, class Kv>
constexpr std::size_t smem_bytes() {
  return std::size_t(kStagesFor<Kv>) * (2 * kCodeTileBytes<D, Kv> + 2 * Geo::kBc * 4) + 1024;
}

/// The last block of a (b, KV head group) merges the S split states of its `rows`
/// heads. The states were written by other blocks: read through L2 (__ldcg), not L1.
/// First every (row, split) m and l goes to shared memory, all loads in flight at once;
/// then thread task (row i, dims c4 .. c4 + 3) folds the splits with merge(), sixteen
/// O slices loaded before they are folded: two round trips to L2 for 32 splits, where
/// v2's merge kernel waits for one per split.
template <int D>
__device__ __forceinline__ void merge_states(const DecodeParams& p, int b, int h0, int rows, float* sm,
                                             int sm_floats) {
  constexpr int kBatch = 16;
  const std::size_t row0 = std::size_t(b) * p.heads + h0;
  const bool staged = 2 * rows * p.splits <= sm_floats;  // always, but for thousands of splits
  if (staged) {
    for (int t = threadIdx.x; t < rows * p.splits; t += Geo::kThreads) {
      sm[2 * t] = __ldcg(p.part_m + row0 * p.splits + t);  // rows are consecutive: (row0 + i) * S + s
      sm[2 * t + 1] = __ldcg(p.part_l + row0 * p.splits + t);
    }
    __syncthreads();
  }
  for (int task = threadIdx.x; task < rows * (D / 4); task += Geo::kThreads) {
    const int i = task / (D / 4), c4 = task % (D / 4) * 4;
    const std::size_t row = row0 + i;
    auto acc = AttnState<4, float, Base2>::identity();
    for (int s0 = 0; s0 < p.splits; s0 += kBatch) {
      AttnState<4, float, Base2> part[kBatch];
#pragma unroll
      for (int j = 0; j < kBatch; ++j) {
        part[j] = AttnState<4, float, Base2>::identity();
        if (s0 + j < p.splits) {
          const std::size_t at = row * p.splits + s0 + j;
          const int t = i * p.splits + s0 + j;
          part[j].s = staged ? SoftmaxState<float, Base2>{sm[2 * t], sm[2 * t + 1]}
                             : SoftmaxState<float, Base2>{__ldcg(p.part_m + at), __ldcg(p.part_l + at)};
          const float4 v = __ldcg(reinterpret_cast<const float4*>(p.part_o + at * D + c4));
          part[j].o[0] = v.x, part[j].o[1] = v.y, part[j].o[2] = v.z, part[j].o[3] = v.w;
        }
      }
#pragma unroll
      for (int j = 0; j < kBatch; ++j) acc = merge(acc, part[j]);
    }
    uint2 out;
    out.x = cuda::pack2<bf16>(acc.out(0), acc.out(1));
    out.y = cuda::pack2<bf16>(acc.out(2), acc.out(3));
    *reinterpret_cast<uint2*>(p.o + row * D + c4) = out;
    if (c4 == 0) p.lse[row] = acc.s.lse();
  }
}

/// Blocks per SM the launch bounds ask for: an 8-bit block keeps v4's three (without
/// the bound ptxas gives v5's 8-bit kernel 224 registers, and two blocks run per SM).
template <class Kv>
constexpr int kMinBlocks = kv_quantised(Kv::kDtype) ? 3 : 1;

/// Query heads per block: the N of S^T = K Q^T.
constexpr int kHeads = 8;

template <int D, class Kv>
__global__ void __launch_bounds__(Geo::kThreads, kMinBlocks<Kv>)
    decode(DecodeParams p, Kv kv, const __grid_constant__ CodeMaps maps) {
  extern __shared__ __align__(128) unsigned char smem_raw[];
  // The codes on a 1024-byte boundary, as the TMA's 128-byte swizzle needs.
  unsigned char* smem = smem_raw + ((1024u - (cuda::smem_u32(smem_raw) & 1023u)) & 1023u);
  __shared__ __align__(8) uint64_t full[kStagesFor<Kv>];  // one mbarrier per stage: its tile has arrived
  const int b = blockIdx.z, hk = blockIdx.y / p.chunks, chunk = blockIdx.y % p.chunks, split = blockIdx.x;
  const int h0 = hk * p.group + chunk * kHeads;  // the block's first query head
  const int rows = min(kHeads, p.group - chunk * kHeads);
  const int warp = threadIdx.x / 32;
  if (threadIdx.x == 0) {
    for (int st = 0; st < kStagesFor<Kv>; ++st) hopper::mbarrier_init(&full[st], 1);
    hopper::mbarrier_init_fence();
  }
  // The block's keys: split `split`, split_keys keys from split * split_keys, whatever
  // the length.
  const int t_first = split * p.split_keys;
  const int len = p.lens[b];
  const int t_begin = min(len, t_first), t_end = min(len, t_first + p.split_keys);
  const int box_shift = min(kv.page_shift, 6);  // boxes of min(P, 64) rows

  const float c = p.scale * float(kLog2e);  // the softmax scale in base 2
  WarpDecodeV4<D, Kv> wd;  // f16 MMAs over fragments converted from the codes
  wd.init(p.q + (std::size_t(b) * p.heads + h0) * D, rows);
  constexpr int S = kStagesFor<Kv>;
  auto stage_k = [&](int st) { return smem + std::size_t(st) * 2 * kCodeTileBytes<D, Kv>; };
  auto stage_v = [&](int st) { return stage_k(st) + kCodeTileBytes<D, Kv>; };
  auto stage_scales = [&](int st) {
    return reinterpret_cast<float*>(smem + std::size_t(S) * 2 * kCodeTileBytes<D, Kv>) + st * 2 * Geo::kBc;
  };
  const int n_tiles = cuda::ceil_div(t_end - t_begin, Geo::kBc);
  __syncthreads();  // the barriers are initialised

  // Fill the pipeline: warp 0 issues kStages - 1 tiles, then reads the first refill's boxes.
  BoxPages ahead{};
  if (warp == 0) {
#pragma unroll
    for (int st = 0; st < S - 1; ++st)
      if (st < n_tiles)
        issue_boxes<D>(maps, stage_k(st), stage_v(st), stage_scales(st), &full[st],
                       read_boxes(kv, b, hk, t_begin + st * Geo::kBc, t_end, box_shift), box_shift);
    if (S - 1 < n_tiles) ahead = read_boxes(kv, b, hk, t_begin + (S - 1) * Geo::kBc, t_end, box_shift);
  }
  for (int it = 0; it < n_tiles; ++it) {
    hopper::mbarrier_wait(&full[it % S], uint32_t(it / S) & 1u);  // tile `it` has arrived...
    __syncthreads();                    // ...and every warp is done with tile it - 1
    const int next = it + S - 1;        // refill the stage that tile it - 1 used
    if (warp == 0 && next < n_tiles) {
      issue_boxes<D>(maps, stage_k(next % S), stage_v(next % S), stage_scales(next % S), &full[next % S], ahead,
                     box_shift);
      if (next + 1 < n_tiles) ahead = read_boxes(kv, b, hk, t_begin + (next + 1) * Geo::kBc, t_end, box_shift);
    }
    const int t0 = t_begin + it * Geo::kBc;
    const int valid = min(Geo::kWarpKeys, t_end - t0 - warp * Geo::kWarpKeys);  // this warp's keys in the tile
    // The warp's rows of the stage: the codes, converted in the warp's registers.
    const CodeRows rows_it{stage_k(it % S), stage_v(it % S), stage_scales(it % S), box_shift};
    if (valid > 0) wd.tile(rows_it, warp * Geo::kWarpKeys, valid, c);
  }
  __syncthreads();  // every tile issued was waited for: reuse the memory for the merge

  const MergeSmem sm(smem);
  wd.store(sm.ms, sm.ls, sm.os, c);
  __syncthreads();
  for (int task = threadIdx.x; task < rows * (D / 4); task += Geo::kThreads) {
    const int i = task / (D / 4), c4 = task % (D / 4) * 4;
    const AttnState<4, float, Base2> acc = merge_warps<D>(sm.ms, sm.ls, sm.os, i, c4);
    // The block saw one split: store its unnormalised (m, l, O) for the merge kernel.
    const std::size_t at = (std::size_t(b) * p.heads + h0 + i) * p.splits + split;
    *reinterpret_cast<float4*>(p.part_o + at * D + c4) = make_float4(acc.o[0], acc.o[1], acc.o[2], acc.o[3]);
    if (c4 == 0) {
      p.part_m[at] = acc.s.m;
      p.part_l[at] = acc.s.l;
    }
  }
  // Arrive: the stores above are made visible to every block first, then one ticket.
  __threadfence();
  __syncthreads();
  __shared__ int ticket;
  int* counter = p.arrivals + std::size_t(b) * gridDim.y + blockIdx.y;
  if (threadIdx.x == 0) ticket = atomicAdd(counter, 1);
  __syncthreads();
  if (ticket != p.splits - 1) return;  // another split will merge
  __threadfence();                     // the last: every other split's state is visible
  merge_states<D>(p, b, h0, rows, reinterpret_cast<float*>(smem), int((smem_bytes<D, Kv>() - 1024) / 4));
  if (threadIdx.x == 0) *counter = 0;  // ready for the next step
}

template <int D, class Kv>
void launch(const DecodeParams& p0, const Kv& kv, const CodeMaps& maps, int batch, int kv_heads) {
  DecodeParams p = p0;
  p.chunks = (p.group + kHeads - 1) / kHeads;  // blocks per KV head: 8 heads each
  const int smem = int(smem_bytes<D, Kv>());
  static const bool configured = [&] {  // more than 48 KB of shared memory needs an opt-in
    CUDA_CHECK(cudaFuncSetAttribute(decode<D, Kv>, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
    return true;
  }();
  (void)configured;
  decode<D, Kv><<<dim3(p.splits, kv_heads * p.chunks, batch), Geo::kThreads, smem>>>(p, kv, maps);
  CUDA_CHECK_LAUNCH("v9::decode");
}

template void launch<128, PagedKv8<KvDtype::fp8>>(const DecodeParams&, const PagedKv8<KvDtype::fp8>&, const CodeMaps&,
                                                  int, int);
template void launch<128, PagedKv8<KvDtype::int8>>(const DecodeParams&, const PagedKv8<KvDtype::int8>&,
                                                   const CodeMaps&, int, int);

}  // namespace attn::ch07::gpu::v9
