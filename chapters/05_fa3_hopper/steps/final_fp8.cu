// Chapter 05, the final FP8 forward kernel: v9 with the configuration the lab steps tuned.
//
// What changes from v8, the main path's last step: the element type and the table. Q, K
// and V arrive as E4M3 (fp8_prepare.cu: per-block scales, Q and K rotated by a Hadamard
// matrix so that an outlier channel spreads over all of them, V transposed because the fp8
// wgmma reads its B operand K-major only), the wgmmas are the k32 e4m3 forms, and P is
// rounded to E4M3 in registers. That is the lab's v9, FA3's FP8 (paper section 3.3). The
// producer warpgroup, the two consumers in pingpong, the softmax of S_j run under
// P_{j+1} V_{j+1} and the persistent walk are v8's. What the lab measured after v9, one
// idea at a time, is a column of one table, Config<D, kCausal> (below), and each head dim
// and mask takes the row of the step that was fastest there:
//
//     d = 64, no mask     v12: key blocks of 128, 1 exponential in 4 on the FMA pipe, O *= alpha every block
//     d = 64, causal      v15: v12 with O rescaled only when a row's max grows by more than 2^8
//     d = 128, no mask    v27: v15 with key blocks of 192 (S as two wgmmas, V8^T as two boxes), 3 stages
//     d = 128, causal     v15: v27's wider blocks were slower with the mask, so the causal row stays v15's,
//                         on v6's grid (v32)
//     d = 256, both       v29: v15 with key blocks of 128, every exponential on MUFU; causal on v6's grid (v32)
//
// v32's grid (kGrid) launches one thread block a tile, blockIdx.x a query tile of head
// blockIdx.y, the diagonal's heaviest tile first, as v6 did, instead of one block an SM
// walking the persistent snake over every head's tiles: the blocks running together then
// read one or two heads' K and V, which stay in L2.
//
// One head dim and mask may have two rows by sequence length: d = 128 without the mask takes
// v12's row up to 1K keys and v27's above, the launcher choosing by Nk (kShortKeys).
//
// The kernel reads the table where the code depends on it (`if constexpr` where it differs):
//   * the softmax, softmax_update_scaled_two_pipes<kExpEvery, kExpDegree, Bc / 2, kLazy>
//     (fa3_common.cuh): v9's multiplication by the scales folded into the exponent's FFMA
//     (v12), one 2^x in kExpEvery as exp2_fma's polynomial on the FMA pipe (none if 0), and,
//     if kLazy > 0, a row's max kept unless the block's exceeds it by more than kLazy (v15);
//   * O *= alpha: every block if kLazy = 0 (v12), else only in a warp where some row's
//     alpha != 1 (a vote, __any_sync: v15);
//   * S = Q K^T: one wgmma a K-step up to 128 keys; past that (v27) an n128 wgmma and an
//     n(Bc - 128) one, whose accumulators follow each other in S's registers, so the
//     softmax sees one row of Bc (there is no generated n192 fp8 wrapper);
//   * V8^T: a stage of kVBoxes TMA boxes of 128 keys, a 128-byte swizzled row being the
//     widest box (v27); P V's K-step kk reads box kk / 4 at key 32 (kk % 4):
//
//     V stage (d rows):  [ box 0: keys 0-127 of the block ][ box 1: keys 128-255, 128-191 used ]
//
// Everything else is v9's code as the steps above left it. Shared memory, Q + kStages x (K +
// V8^T) and the barriers: 72 KB at d = 64, 184 KB at d = 128 (144 KB causal), 160 KB at d = 256.
//
// In the recorded H100 run of 2026-12-07 (bench/recorded/h100-80gb-hbm3-2026-12-07-1331.json) it
// reaches 856 TFLOP/s at d = 128, N = 8K (748 causal) and 1,208 at d = 256 (1,072 causal), the
// kernel alone, against the lab's v9 at 746 (672) and 925 (798).
#include <string>

#include "common/cuda/check.cuh"
#include "common/errors.hpp"
#include "common/cuda/hopper/mbarrier.cuh"
#include "common/cuda/hopper/named_barrier.cuh"
#include "common/cuda/hopper/roles.cuh"
#include "common/cuda/hopper/setmaxnreg.cuh"
#include "common/cuda/hopper/tma.cuh"
#include "common/cuda/hopper/wgmma.cuh"
#include "fa3_common.cuh"
#include "step_launch.cuh"

namespace attn::ch05::final_fp8 {
namespace {

using namespace attn::hopper;

using E4M3 = __nv_fp8_e4m3;

/// One row of the table: the configuration of one head dim and mask.
template <int Bc_, int kStages_, int kExpEvery_, int kLazy_, int kVBoxes_>
struct Row {
  static constexpr int Bc = Bc_, kStages = kStages_, kExpEvery = kExpEvery_, kLazy = kLazy_, kVBoxes = kVBoxes_;
};

// The configuration table: one row per head dim and mask, the one place where they differ.
//   Bc         keys a block: 128 from v9 on; 192 at d = 128 (v27); 128 at d = 256 (v26, where v9 had 64)
//   kStages    depth of the K/V ring, as deep as shared memory allows: 4 and 2 (v9); 3 with v27's blocks
//   kExpEvery  one exponential in kExpEvery on the FMA pipe as a polynomial (v12: 4); 0: all on MUFU (v29)
//   kLazy      O rescaled only when a row's max grows by more than 2^kLazy (v15: 8); 0: every block (v12)
//   kVBoxes    TMA boxes of kVBoxKeys keys a V8^T stage: 2 for 192 keys (v27), else 1
template <int D, bool kCausal, bool kShort = false> struct Config;
// A head dim and mask may have a second row for short sequences: a problem of at most
// kShortKeys<D, kCausal> keys takes Config<D, kCausal, true> (0: one row at every length).
template <int D, bool kCausal> constexpr int kShortKeys = 0;
template <> constexpr int kShortKeys<128, false> = 1024;  // up to 1K keys v12's blocks of 128 win
template <int D, bool kCausal> struct Config<D, kCausal, true> : Config<D, kCausal, false> {};
//                                      Row<Bc, kStages, kExpEvery, kLazy, kVBoxes>
template <> struct Config<64, false>  : Row<128, 4, 4, 0, 1> {};  // v12
template <> struct Config<64, true>   : Row<128, 4, 4, 8, 1> {};  // v15
template <> struct Config<128, false> : Row<192, 3, 4, 8, 2> {};  // v27
template <> struct Config<128, false, true> : Row<128, 4, 4, 0, 1> {};  // v12: up to kShortKeys<128, false> keys
template <> struct Config<128, true>  : Row<128, 4, 4, 8, 1> {};  // v15 (v27's wider blocks lost with the mask)
template <> struct Config<256, false> : Row<128, 2, 0, 8, 1> {};  // v29
template <> struct Config<256, true>  : Row<128, 2, 0, 8, 1> {};  // v29
// kGrid: one thread block a tile on v6's grid (v32) instead of the persistent walk.
template <int D, bool kCausal> constexpr bool kGrid = false;
template <> constexpr bool kGrid<128, true> = true;
template <> constexpr bool kGrid<256, true> = true;
constexpr int kVBoxKeys = 128;  // keys a V8^T box: a 128-byte swizzled row
constexpr int kScaleRows = 64;  // rows of Q or K per quantisation scale
constexpr int kExpDegree = 3;   // exp2_fma's polynomial: degree 3 (v11, v12)
constexpr int kThreads = 384; // producer + two consumer warpgroups
constexpr int kConsumerWarps = 8;
constexpr int kTurnBarrier = 1;  // named barriers 1 and 2: consumer 0's and 1's turn (0 is __syncthreads)
constexpr int kConsumerThreads = 256;

/// The list of tiles of this thread block: entry `round` of the snake, as (m_block, bh); on the
/// grid (kGrid), one tile: blockIdx.x a query tile of head blockIdx.y, the heaviest first.
template <bool kOnGrid>
struct TileWalk {
  int cta, ctas, n_tiles, n_qtiles, bh_count;
  bool causal;
  __device__ __forceinline__ bool next(int round, int* m_block, int* bh) const {
    if constexpr (kOnGrid) {
      if (round > 0) return false;
      *m_block = causal ? ctas - 1 - cta : cta;
      *bh = fresh_block_index_y();
      return true;
    }
    const int t = snake_tile(cta, round, ctas);
    if (t >= n_tiles) return false;
    tile_coords(t, n_qtiles, bh_count, causal, m_block, bh);
    return true;
  }
};

template <int D, bool kCausal>
__device__ __forceinline__ TileWalk<kGrid<D, kCausal>> tile_walk(const Fa3Params& p) {
  return {fresh_block_index_x(), fresh_grid_size_x(), p.n_qtiles * p.batch * p.heads, p.n_qtiles, p.batch * p.heads, p.causal};
}

/// O *= alpha: in every block if kLazy = 0 (v12); with lazy rescaling (v15) only in a warp
/// where some row's max moved, that is some alpha != 1 (a vote).
template <int kLazy, int NO>
__device__ __forceinline__ void rescale_o(float (&o)[NO], const float (&alpha)[2]) {
  if constexpr (kLazy > 0) {
    if (__any_sync(0xffffffffu, alpha[0] != 1.f || alpha[1] != 1.f)) rescale(o, alpha);
  } else {
    rescale(o, alpha);
  }
}

// ---------------------------------------------------------------- producer warpgroup (warps 0-3)
// One thread issues every copy: for each tile, Q once the previous tile's Q is released,
// then K_j and V_j into the ring as stages free up.
template <class TO, int D, bool kCausal, bool kShort>
__device__ __forceinline__ void producer_tile(const CUtensorMap& tm_q, const CUtensorMap& tm_k,
                                              const CUtensorMap& tm_v, const Fa3Params& p, unsigned char* smem,
                                              int m_block, int bh, RingState<Config<D, kCausal, kShort>::kStages>& ring, int& loaded) {
  using Cfg = Config<D, kCausal, kShort>;
  constexpr int Bc = Cfg::Bc, kStages = Cfg::kStages;
  using Plan = SmemPlan<E4M3, D, Bc, kStages, Cfg::kVBoxes * kVBoxKeys>;  // V stage: V8^T, boxes of d rows of 128 keys
  const Barriers<kStages> bar(smem + Plan::kBars);
  const int bhk = (bh / p.heads) * p.kv_heads + kv_head_of(bh % p.heads, p.heads, p.kv_heads);
  const KvRange kv = kv_blocks(m_block, kBr, Bc, p.nq, p.nk, kCausal);
  if (kv.n_max == 0) return;  // every row of the tile is empty: nothing to load

  mbarrier_wait(bar.empty_q, (loaded & 1) ^ 1);  // the previous tile's Q is no longer read
  mbarrier_arrive_expect_tx(bar.full_q, Plan::kQBytes);
  for (int b = 0; b < Plan::kBoxes; ++b)
    tma_load_3d(smem + Plan::kQ + b * kBr * Plan::kRowBytes, &tm_q, bar.full_q, b * Plan::kBoxCols, m_block * kBr, bh);
  ++loaded;
  for (int j = kv.n_max - 1; j >= 0; --j, ring.advance()) {
    // K_j and V_j into stage ring.stage once the consumers have released it.
    mbarrier_wait(&bar.empty_k[ring.stage], ring.phase ^ 1);
    mbarrier_arrive_expect_tx(&bar.full_k[ring.stage], Plan::kKBytes);
    for (int b = 0; b < Plan::kBoxes; ++b)
      tma_load_3d(smem + Plan::kK + ring.stage * Plan::kKBytes + b * Bc * Plan::kRowBytes, &tm_k,
                  &bar.full_k[ring.stage], b * Plan::kBoxCols, j * Bc, bhk);
    mbarrier_wait(&bar.empty_v[ring.stage], ring.phase ^ 1);
    mbarrier_arrive_expect_tx(&bar.full_v[ring.stage], Plan::kVBytes);
    for (int b = 0; b < Cfg::kVBoxes; ++b)
      tma_load_3d(smem + Plan::kV + ring.stage * Plan::kVBytes + b * D * kVBoxKeys, &tm_v, &bar.full_v[ring.stage],
                  j * Bc + b * kVBoxKeys, 0, bhk);
  }
}

template <class TO, int D, bool kCausal, bool kShort>
__device__ __forceinline__ void producer(const CUtensorMap& tm_q, const CUtensorMap& tm_k, const CUtensorMap& tm_v,
                                         const Fa3Params& p, unsigned char* smem) {
  constexpr int kStages = Config<D, kCausal, kShort>::kStages;
  if (fresh_thread_index() != 0) return;
  const auto walk = tile_walk<D, kCausal>(p);
  RingState<kStages> ring;  // runs on from tile to tile
  int loaded = 0;           // tiles whose Q this block has loaded: the phase of full_q / empty_q
  int m_block, bh;
  for (int round = 0; walk.next(round, &m_block, &bh); ++round)
    producer_tile<TO, D, kCausal, kShort>(tm_q, tm_k, tm_v, p, smem, m_block, bh, ring, loaded);
}

// ---------------------------------------------------------------- consumer warpgroups (warps 4-11)
template <class TO, int D, bool kCausal, bool kShort>
__device__ __forceinline__ void consumer_tile(const Fa3Params& p, unsigned char* smem, int m_block, int bh,
                                              RingState<Config<D, kCausal, kShort>::kStages>& ring, int& loaded) {
  using Cfg = Config<D, kCausal, kShort>;
  constexpr int Bc = Cfg::Bc, kStages = Cfg::kStages;
  using Plan = SmemPlan<E4M3, D, Bc, kStages, Cfg::kVBoxes * kVBoxKeys>;
  const Barriers<kStages> bar(smem + Plan::kBars);
  // wg: 0 or 1 for warpgroups 1 and 2 (rows 0-63, 64-127); warp: 0-7 counted from warpgroup 1.
  const int tid = fresh_thread_index() - 128, wg = tid / 128, warp = tid / 32, lane = tid % 32;
  const KvRange kv = kv_blocks(m_block, kBr, Bc, p.nq, p.nk, kCausal);

  // Descriptors. Q: this warpgroup's 64 rows; the k-th K-step is 32 bytes into the rows.
  auto q_desc = [&](int k) {
    const int byte = 32 * k;
    return desc_k_major(smem + Plan::kQ + (byte / Plan::kRowBytes) * kBr * Plan::kRowBytes +
                            wg * 64 * Plan::kRowBytes + byte % Plan::kRowBytes,
                        Plan::kRowBytes);
  };
  auto k_desc = [&](int stage, int k) {
    const int byte = 32 * k;
    return desc_k_major(smem + Plan::kK + stage * Plan::kKBytes + (byte / Plan::kRowBytes) * Bc * Plan::kRowBytes +
                            byte % Plan::kRowBytes,
                        Plan::kRowBytes);
  };
  // K's rows 128 and on of the stage: the B of S's second wgmma when Bc > 128 (the box's rows are 128 bytes apart).
  auto k_desc_hi = [&](int stage, int k) {
    return desc_k_major(smem + Plan::kK + stage * Plan::kKBytes + 128 * Plan::kRowBytes + 32 * k, Plan::kRowBytes);
  };
  // V8^T as the K-major B of P V: boxes of d rows of 128 bytes; K-step kk is 32 keys
  // (bytes) along the rows of box kk / 4.
  auto v_desc = [&](int stage, int kk) {
    return desc_k_major(smem + Plan::kV + stage * Plan::kVBytes + (kk / 4) * D * kVBoxKeys + 32 * (kk % 4), kVBoxKeys);
  };
  // S_j = Q K_j^T: one wgmma a K-step up to 128 keys, else keys 0-127 and 128 to Bc - 1.
  auto s_mma = [&](float(&s)[Bc / 2], int stage) {
    if constexpr (Bc <= 128) {
#pragma unroll
      for (int k = 0; k < D / 32; ++k) WgmmaSS<E4M3, Bc>::mma(s, q_desc(k), k_desc(stage, k), k > 0);
    } else {
      float(&lo)[64] = *reinterpret_cast<float(*)[64]>(&s[0]);
      float(&hi)[Bc / 2 - 64] = *reinterpret_cast<float(*)[Bc / 2 - 64]>(&s[64]);
#pragma unroll
      for (int k = 0; k < D / 32; ++k) {
        WgmmaSS<E4M3, 128>::mma(lo, q_desc(k), k_desc(stage, k), k > 0);
        WgmmaSS<E4M3, Bc - 128>::mma(hi, q_desc(k), k_desc_hi(stage, k), k > 0);
      }
    }
  };

  const int row[2] = {m_block * kBr + 16 * warp + lane / 4, m_block * kBr + 16 * warp + lane / 4 + 8};
  const int limit[2] = {key_limit(row[0], p.nq, p.nk, kCausal), key_limit(row[1], p.nq, p.nk, kCausal)};
  // A block needs the mask when j >= n_full: the diagonal, or keys past Nk.
  auto mask = [&](float(&s)[Bc / 2], int j) {
    if (j >= kv.n_full) apply_mask(s, j * Bc, lane, limit);
  };
  // This warpgroup's Q scale and c = tau log2(e): S_ij c = (Q8 K8^T) s_q s_k c.
  const int q_block = (m_block * kBr + 64 * wg) / kScaleRows;
  const int bhk = (bh / p.heads) * p.kv_heads + kv_head_of(bh % p.heads, p.heads, p.kv_heads);
  const int n_qscales = ceil_div(p.nq, kScaleRows), n_kscales = ceil_div(p.nk, kScaleRows);
  const float qc = (q_block < n_qscales ? p.q_scale[size_t(bh) * n_qscales + q_block] : 1.f) * p.scale_log2;
  // The scale of each 64-key half of block j, folded into the softmax's FFMA: S c = (Q8 K8^T) s_q s_k c.
  float c[Bc / kScaleRows];
  auto scales = [&](int j) {
#pragma unroll
    for (int h = 0; h < Bc / kScaleRows; ++h) {
      const int kb = (j * Bc) / kScaleRows + h;
      c[h] = kb < n_kscales ? qc * p.k_scale[size_t(bhk) * n_kscales + kb] : qc;
    }
  };

  float o[D / 2];  // O_i: 64 x d per warpgroup, fp32
#pragma unroll
  for (int i = 0; i < D / 2; ++i) o[i] = 0.f;
  RowSoftmax softmax;
  softmax.init();
  if (kv.n_max == 0) {  // every row of the tile is empty: O = 0, LSE = -inf
    float inv_l[2], lse[2];
    softmax.finish(1.f, inv_l, lse);
    store_o<TO>(p, bh, row, lane, o, inv_l, lse);
    return;
  }

  // The window bracket: wait for my turn, then (after issuing) hand the turn over.
  auto my_turn = [&] { named_barrier_sync(kTurnBarrier + wg, kConsumerThreads); };
  auto your_turn = [&] { named_barrier_arrive(kTurnBarrier + 1 - wg, kConsumerThreads); };

  mbarrier_wait(bar.full_q, loaded & 1);
  ++loaded;
  RingState<kStages> ring_v;  // the stage of V_{j+1}, one block behind
  float s[Bc / 2];            // S_j, then P_j in fp32
  uint32_t pr[Bc / 8];        // P_{j+1} as the E4M3 A operand of P V
  float alpha[2];             // the rescale that O still owes for block j+1

  // Prologue: the last block, S = Q_i K_j^T and its P.
  int j = kv.n_max - 1;
  mbarrier_wait(&bar.full_k[ring.stage], ring.phase);
  my_turn();
  wgmma_fence();
  s_mma(s, ring.stage);
  wgmma_commit();
  your_turn();
  wgmma_wait<0>();
  fence_operand(s);
  if (lane == 0) mbarrier_arrive(&bar.empty_k[ring.stage]);
  mask(s, j);
  scales(j);
  softmax_update_scaled_two_pipes<Cfg::kExpEvery, kExpDegree, Bc / 2, Cfg::kLazy>(softmax, s, c, alpha);
  convert_p_fp8(s, pr);
  ring_v = ring;
  ring.advance();

  for (--j; j >= 0; --j, ring.advance(), ring_v.advance()) {
    mbarrier_wait(&bar.full_k[ring.stage], ring.phase);
    mbarrier_wait(&bar.full_v[ring_v.stage], ring_v.phase);
    my_turn();
    // S_ij = Q_i K_j^T
    wgmma_fence();
    s_mma(s, ring.stage);
    wgmma_commit();
    // O_i = alpha O_i + P_i,j+1 V_j+1
    rescale_o<Cfg::kLazy>(o, alpha);
    fence_operand(o);
    wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < Bc / 32; ++kk) {
      const uint32_t a[4] = {pr[4 * kk], pr[4 * kk + 1], pr[4 * kk + 2], pr[4 * kk + 3]};
      WgmmaRS<E4M3, D>::mma(o, a, v_desc(ring_v.stage, kk), 1);
    }
    wgmma_commit();
    your_turn();

    wgmma_wait<1>();  // S_ij is ready; P V is still running
    fence_operand(s);
    if (lane == 0) mbarrier_arrive(&bar.empty_k[ring.stage]);
    mask(s, j);
    scales(j);
    softmax_update_scaled_two_pipes<Cfg::kExpEvery, kExpDegree, Bc / 2, Cfg::kLazy>(softmax, s, c, alpha);  // overlaps P V

    wgmma_wait<0>();  // P_i,j+1 V_j+1 is done: O and pr may be touched again
    fence_operand(o);
    if (lane == 0) mbarrier_arrive(&bar.empty_v[ring_v.stage]);
    convert_p_fp8(s, pr);
  }
  if (lane == 0) mbarrier_arrive(bar.empty_q);  // every Q K^T of this tile is done

  // Epilogue: O_i = alpha O_i + P_i,0 V_0.
  mbarrier_wait(&bar.full_v[ring_v.stage], ring_v.phase);
  rescale_o<Cfg::kLazy>(o, alpha);
  fence_operand(o);
  my_turn();
  wgmma_fence();
#pragma unroll
  for (int kk = 0; kk < Bc / 32; ++kk) {
    const uint32_t a[4] = {pr[4 * kk], pr[4 * kk + 1], pr[4 * kk + 2], pr[4 * kk + 3]};
    WgmmaRS<E4M3, D>::mma(o, a, v_desc(ring_v.stage, kk), 1);
  }
  wgmma_commit();
  your_turn();
  wgmma_wait<0>();
  fence_operand(o);
  if (lane == 0) mbarrier_arrive(&bar.empty_v[ring_v.stage]);

  // O *= s_v (per channel: column 8c + 2t + {0, 1} of chunk c)
  const float* vs = p.v_scale + size_t(bhk) * D;
#pragma unroll
  for (int i = 0; i < D / 2; ++i) o[i] *= __ldg(vs + 8 * (i / 4) + 2 * (lane % 4) + (i & 1));
  float inv_l[2], lse[2];
  softmax.finish(1.f, inv_l, lse);
  store_o<TO>(p, bh, row, lane, o, inv_l, lse);
}

template <class TO, int D, bool kCausal, bool kShort>
__device__ __forceinline__ void consumer(const Fa3Params& p, unsigned char* smem) {
  constexpr int kStages = Config<D, kCausal, kShort>::kStages;
  const int wg = (fresh_thread_index() - 128) / 128;
  const auto walk = tile_walk<D, kCausal>(p);
  auto my_turn = [&] { named_barrier_sync(kTurnBarrier + wg, kConsumerThreads); };
  auto your_turn = [&] { named_barrier_arrive(kTurnBarrier + 1 - wg, kConsumerThreads); };
  if (wg == 1) your_turn();  // warpgroup 2 hands the first turn to warpgroup 1
  RingState<kStages> ring;   // the stage of K_j, running on from tile to tile
  int loaded = 0;            // tiles with work so far: the phase of full_q
  int m_block, bh;
  for (int round = 0; walk.next(round, &m_block, &bh); ++round)
    consumer_tile<TO, D, kCausal, kShort>(p, smem, m_block, bh, ring, loaded);
  if (wg == 0) my_turn();  // warpgroup 1 takes back warpgroup 2's last hand-over
}

template <class TO, int D, bool kCausal, bool kShort>
__global__ void __launch_bounds__(kThreads, 1)
    kernel(const __grid_constant__ CUtensorMap tm_q, const __grid_constant__ CUtensorMap tm_k,
           const __grid_constant__ CUtensorMap tm_v, const Fa3Params p) {
  using Cfg = Config<D, kCausal, kShort>;
  constexpr int Bc = Cfg::Bc, kStages = Cfg::kStages;
  using Plan = SmemPlan<E4M3, D, Bc, kStages, Cfg::kVBoxes * kVBoxKeys>;
  static_assert(Bc % 64 == 0 && (Cfg::kVBoxes - 1) * kVBoxKeys < Bc && Bc <= Cfg::kVBoxes * kVBoxKeys,
                "a V8^T stage is the fewest boxes of 128 keys that hold a key block");
  extern __shared__ unsigned char smem_raw[];
  if (threadIdx.x == 0) {
    const Barriers<kStages> bar(align_1024(smem_raw) + Plan::kBars);
    mbarrier_init(bar.full_q, 1);
    mbarrier_init(bar.empty_q, kConsumerWarps);
    for (int s = 0; s < kStages; ++s) {
      mbarrier_init(&bar.full_k[s], 1);
      mbarrier_init(&bar.full_v[s], 1);
      mbarrier_init(&bar.empty_k[s], kConsumerWarps);
      mbarrier_init(&bar.empty_v[s], kConsumerWarps);
    }
    mbarrier_init_fence();
  }
  __syncthreads();
  // The role split: every value below is computed inside its role (see fa3_common.cuh).
  if (threadIdx.x < 128) {
    setmaxnreg_dec<24>();
    producer<TO, D, kCausal, kShort>(tm_q, tm_k, tm_v, p, fresh_smem(smem_raw));
  } else {
    setmaxnreg_inc<240>();
    consumer<TO, D, kCausal, kShort>(p, fresh_smem(smem_raw));
  }
}

template <class TO, int D, bool kCausal, bool kShort>
PreparedStep prepare(const StepArgs& a) {
  using Cfg = Config<D, kCausal, kShort>;
  constexpr int Bc = Cfg::Bc, kStages = Cfg::kStages;
  using Plan = SmemPlan<E4M3, D, Bc, kStages, Cfg::kVBoxes * kVBoxKeys>;
  const Problem& pr = a.problem;
  const CUtensorMapDataType ty = tma_type<E4M3>();
  const uint64_t bhq = uint64_t(pr.batch) * pr.heads, bhk = uint64_t(pr.batch) * pr.kv_heads;
  const CUtensorMap tq = make_tensor_map_3d(a.q, ty, 1, D, pr.nq, bhq, Plan::kBoxCols, kBr);
  const CUtensorMap tk = make_tensor_map_3d(a.k, ty, 1, D, pr.nk, bhk, Plan::kBoxCols, Bc);
  const CUtensorMap tv = make_tensor_map_3d(a.v, ty, 1, a.nk_pad, D, bhk, kVBoxKeys, D);  // V8^T: [d][Nk_pad]
  CUDA_CHECK(cudaFuncSetAttribute(kernel<TO, D, kCausal, kShort>, cudaFuncAttributeMaxDynamicSharedMemorySize, Plan::kBytes));
  const long tiles = long(a.params.n_qtiles) * long(bhq);
  // one block per SM, each walking its tiles; kGrid: one block a tile, (query tile, head)
  const dim3 grid = kGrid<D, kCausal> ? dim3(unsigned(a.params.n_qtiles), unsigned(bhq))
                                      : dim3(unsigned(tiles < a.sms ? tiles : a.sms));
  const Fa3Params params = a.params;
  PreparedStep s;
  s.grid = int(grid.x * grid.y);
  s.smem_bytes = Plan::kBytes;
  s.launch = [=] {
    kernel<TO, D, kCausal, kShort><<<grid, kThreads, Plan::kBytes>>>(tq, tk, tv, params);
    CUDA_CHECK_LAUNCH("kernel");
  };
  return s;
}

template <class T, int D, bool kCausal>
PreparedStep prepare_length(const StepArgs& a) {
  if constexpr (kShortKeys<D, kCausal> > 0)
    if (a.problem.nk <= kShortKeys<D, kCausal>) return prepare<T, D, kCausal, true>(a);
  return prepare<T, D, kCausal, false>(a);
}

template <class T, int D>
PreparedStep prepare_mask(const StepArgs& a) {
  return a.problem.causal ? prepare_length<T, D, true>(a) : prepare_length<T, D, false>(a);
}

template <class T>
PreparedStep prepare_head_dim(const StepArgs& a) {
  switch (a.problem.d) {
    case 64: return prepare_mask<T, 64>(a);
    case 128: return prepare_mask<T, 128>(a);
    case 256: return prepare_mask<T, 256>(a);
  }
  throw UsageError("chapter 05 final_fp8: no kernel for head dim " + std::to_string(a.problem.d) + " (64, 128, 256)");
}

}  // namespace

PreparedStep prepare(const StepArgs& a) {
  return a.problem.dtype == DType::f16 ? prepare_head_dim<__half>(a) : prepare_head_dim<__nv_bfloat16>(a);
}

}  // namespace attn::ch05::final_fp8
