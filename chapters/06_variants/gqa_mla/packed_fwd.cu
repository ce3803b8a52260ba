// Chapter 06, packed GQA: chapter 05's last bf16 step (steps/v8_head_dims.cu) with the
// query heads of one KV head packed on the M dimension of a tile, and d != dv. This is the
// chapter's final GQA forward (the row "final packed (sm_90a)"; "unpacked" is the same
// kernel, one query head a tile). Its configuration: Config<D> below (keys a block, stages, a
// row per head dim), and beside it the constants every row shares (threads, registers):
//
//   | (d, dv)    | query rows a tile | keys a block | K/V stages | warpgroups              | registers a thread         |
//   |------------|-------------------|--------------|------------|-------------------------|----------------------------|
//   | (128, 128) | 128 (2 x 64)      | 128          | 2          | 1 producer, 2 consumers | producer 24, consumers 240 |
//   | (192, 128) | 128 (2 x 64)      | 128          | 2          | 1 producer, 2 consumers | producer 24, consumers 240 |
//
//     diff chapters/05_fa3_hopper/steps/v8_head_dims.cu chapters/06_variants/gqa_mla/packed_fwd.cu
//
// What changes from chapter 05's v8.
//
// 1. Packing (FA3's PackGQA). The G query heads hk G .. hk G + G-1 that read KV head hk
//    are stored one after another, so for one (batch, hk) they form one [G Nq][d]
//    matrix. The kernel is handed that view (prepare(): heads -> Hkv, Nq -> G Nq), so a
//    128-row tile holds up to 128 (head, position) rows of one group and every K/V block
//    it loads serves all of them. Packed row m is position m % Nq (PackedParams::pos_rows):
//    the causal limit and the blocks a tile visits (packed_kv_blocks()) use positions,
//    and a tile that straddles two heads visits the blocks of positions 0..Nq-1. O and
//    the LSE have the same view ([B][Hq][Nq] = [B Hkv][G Nq]), so store_o() is unchanged.
//    With pack = false the view is the problem itself: chapter 05's kernel, one query
//    head per tile.
// 2. d != dv. V and O have their own head dim DV (Plan, WgmmaRS<T, DV>, o[DV / 2]); the
//    kernels are built for (d, dv) = (128, 128) and (192, 128), MLA's decompressed
//    prefill (d_qk = 192 = 128 nope + 64 rope, d_v = 128), bf16 only. d = 192 makes Q
//    and K three 128-byte TMA boxes wide and S = Q K^T twelve k-steps deep; the ring
//    stays 2 stages of Bc = 128 (208 KB of shared memory).
// 3. Split-K for few tiles (decode at small batch): with fewer tiles than SMs, each tile's
//    key blocks are cut into `splits` ranges, one tile of the walk each; a range writes its
//    normalised O and LSE in fp32, and combine_kernel merges a row's ranges with chapter
//    02's ⊕ in LSE form (as ring attention and flash-decoding do). One sequence of a GQA
//    decode otherwise has Hkv tiles walking all Nk keys one block after another.
#include <memory>
#include <string>

#include "common/cuda/buffer.cuh"

#include "common/cuda/check.cuh"
#include "common/errors.hpp"
#include "common/cuda/hopper/mbarrier.cuh"
#include "common/cuda/hopper/named_barrier.cuh"
#include "common/cuda/hopper/roles.cuh"
#include "common/cuda/hopper/setmaxnreg.cuh"
#include "common/cuda/hopper/tma.cuh"
#include "common/cuda/hopper/wgmma.cuh"
// Chapter 05's shared kernel pieces, by path: this kernel is its v8 with the two changes above.
#include "chapters/05_fa3_hopper/fa3_common.cuh"
#include "chapters/05_fa3_hopper/step_launch.cuh"
#include "gqa_mla/packed_fwd.cuh"

namespace attn::ch06::packed {
namespace {

using namespace attn::hopper;
using namespace attn::ch05;

// Key block and K/V ring depth per head dim (change 2 above).
template <int D> struct Config;
template <> struct Config<128> { static constexpr int Bc = 128, kStages = 2; };
template <> struct Config<192> { static constexpr int Bc = 128, kStages = 2; };

// Chapter 05's SmemPlan with V's own head dim DV: | Q: Br x D | K ring: Bc x D | V ring: Bc x DV | barriers |
template <class T, int D, int DV, int Bc, int kStages>
struct PackedPlan {
  static constexpr int kElem = int(sizeof(T));
  static constexpr int kRowBytes = 128;                 ///< bytes per box row (the 128-byte swizzle)
  static constexpr int kBoxCols = kRowBytes / kElem;    ///< elements per box row
  static constexpr int kBoxes = D / kBoxCols;           ///< boxes across d
  static constexpr int kVBoxes = DV / kBoxCols;         ///< boxes across dv
  static constexpr int kQBytes = kBr * D * kElem;
  static constexpr int kKBytes = Bc * D * kElem;        ///< one K stage
  static constexpr int kVBytes = Bc * DV * kElem;       ///< one V stage
  static constexpr int kQ = 0;
  static constexpr int kK = kQ + kQBytes;
  static constexpr int kV = kK + kStages * kKBytes;
  static constexpr int kBars = kV + kStages * kVBytes;
  static constexpr int kNumBars = 2 + 4 * kStages;
  static constexpr int kBytes = kBars + 8 * kNumBars + 1024;
  static_assert(kQBytes % 1024 == 0 && kKBytes % 1024 == 0 && kVBytes % 1024 == 0,
                "every tile must keep the next one 1024-aligned");
};

/// Chapter 05's kv_blocks() for a packed tile: the key blocks of the query positions its
/// rows hold. A tile inside one query head holds positions lo..hi; one that straddles
/// two heads holds the end of one and the start of the next, so it is treated as
/// holding positions 0..Nq-1 (its rows still take their own causal limit).
__device__ __forceinline__ KvRange packed_kv_blocks(int m_block, int Bc, const PackedParams& p, bool causal) {
  const int tc = ceil_div(p.nk, Bc);
  if (!causal) return {tc, p.nk / Bc};
  const int lo = m_block * kBr, hi = min_of(p.nq, lo + kBr) - 1;
  const bool straddles = lo / p.pos_rows != hi / p.pos_rows;
  const int pos_lo = straddles ? 0 : lo % p.pos_rows, pos_hi = straddles ? p.pos_rows - 1 : hi % p.pos_rows;
  const int last_key = pos_hi + p.nk - p.pos_rows;  // the last key any row of the tile sees
  const int n_max = last_key < 0 ? 0 : min_of(tc, last_key / Bc + 1);
  const int keys_all_rows_see = pos_lo + p.nk - p.pos_rows + 1;
  const int n_full = keys_all_rows_see <= 0 ? 0 : min_of(keys_all_rows_see, p.nk) / Bc;
  return {n_max, min_of(n_full, n_max)};
}
constexpr int kThreads = 384; // producer + two consumer warpgroups
constexpr int kConsumerWarps = 8;
constexpr int kTurnBarrier = 1;  // named barriers 1 and 2: consumer 0's and 1's turn (0 is __syncthreads)
constexpr int kConsumerThreads = 256;

/// The list of tiles of this thread block: entry `round` of the snake, as (m_block, bh,
/// split); the splits of one tile are neighbours in the list.
///
/// Causal tiles go longest first, as chapter 05's tile_coords() orders them, by query
/// *position*: packed tile m holds positions of head m / pos_tiles, so ordering by m would
/// run one head's tiles longest to shortest, then the next head's, and the last round
/// would mix long and short tiles (a packed causal forward at G = 4 ran at 0.79x the same
/// kernel unpacked). With Nq a multiple of the tile (pos_tiles > 0), entry r of a KV head
/// is position block pos_tiles - 1 - r / G of query head r % G, so the G tiles that share
/// a K/V range also run side by side. Otherwise tiles straddle heads, and the order is m's.
struct TileWalk {
  int cta, ctas, n_tiles, n_qtiles, bh_count, splits, pos_tiles;
  bool causal;
  __device__ __forceinline__ bool next(int round, int* m_block, int* bh, int* split) const {
    const int t = snake_tile(cta, round, ctas);
    if (t >= n_tiles) return false;
    *split = t % splits;
    tile_coords(t / splits, n_qtiles, bh_count, causal, m_block, bh);
    if (causal && pos_tiles > 0) {  // by position, longest first (above)
      const int r = n_qtiles - 1 - *m_block, group = n_qtiles / pos_tiles;
      *m_block = (r % group) * pos_tiles + pos_tiles - 1 - r / group;
    }
    return true;
  }
};

__device__ __forceinline__ TileWalk tile_walk(const PackedParams& p) {
  const int pos_tiles = p.pos_rows % kBr == 0 ? p.pos_rows / kBr : 0;
  return {fresh_block_index_x(), fresh_grid_size_x(), p.n_qtiles * p.batch * p.heads * p.splits, p.n_qtiles,
          p.batch * p.heads, p.splits, pos_tiles, p.causal};
}

/// The key blocks [lo, hi) of split s of a tile whose blocks are [0, n_max).
__device__ __forceinline__ void split_range(const PackedParams& p, int n_max, int s, int* lo, int* hi) {
  *lo = min_of(n_max, s * p.blocks_per_split);
  *hi = min_of(n_max, *lo + p.blocks_per_split);
}

/// A split's normalised O and LSE in fp32 (the combine's input), rows as store_o's.
template <int NO>
__device__ __forceinline__ void store_o_part(const PackedParams& p, int bh, int split, const int (&row)[2], int lane,
                                             const float (&o)[NO], const float (&inv_l)[2], const float (&lse)[2]) {
  constexpr int D = NO * 2;
  const std::size_t rows = std::size_t(p.batch) * p.heads * p.nq;
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    if (row[r] >= p.nq) continue;
    const std::size_t at = split * rows + std::size_t(bh) * p.nq + row[r];
    float* dst = p.o_part + at * D + 2 * (lane % 4);
#pragma unroll
    for (int c = 0; c < D / 8; ++c)
      *reinterpret_cast<float2*>(dst + 8 * c) = make_float2(o[4 * c + 2 * r] * inv_l[r], o[4 * c + 2 * r + 1] * inv_l[r]);
    if (lane % 4 == 0) p.lse_part[at] = lse[r];
  }
}

/// One warp per row: O = sum_s e^(LSE_s - LSE) O_s with LSE = log sum_s e^(LSE_s) (an
/// empty split has LSE_s = -inf and weighs 0; a row empty in every split gets O = 0).
template <class T, int DV>
__global__ void combine_kernel(const PackedParams p) {
  const std::size_t rows = std::size_t(p.batch) * p.heads * p.nq;
  const std::size_t row = (std::size_t(blockIdx.x) * blockDim.x + threadIdx.x) / 32;
  const int lane = threadIdx.x % 32;
  if (row >= rows) return;
  float m = -INFINITY;
  for (int s = 0; s < p.splits; ++s) m = fmaxf(m, p.lse_part[s * rows + row]);
  constexpr int kPer = DV / 32;
  float acc[kPer] = {}, sum = 0.f;
  if (m != -INFINITY) {
    for (int s = 0; s < p.splits; ++s) {
      const float w = __expf(p.lse_part[s * rows + row] - m);
      sum += w;
#pragma unroll
      for (int k = 0; k < kPer; ++k) acc[k] += w * p.o_part[(s * rows + row) * DV + lane + 32 * k];
    }
  }
  const float inv = sum > 0.f ? 1.f / sum : 0.f;
  T* out = static_cast<T*>(p.o) + row * DV;
#pragma unroll
  for (int k = 0; k < kPer; ++k) out[lane + 32 * k] = T(acc[k] * inv);
  if (lane == 0) p.lse[row] = sum > 0.f ? m + __logf(sum) : -INFINITY;
}

// ---------------------------------------------------------------- producer warpgroup (warps 0-3)
// One thread issues every copy: for each tile, Q once the previous tile's Q is released,
// then K_j and V_j into the ring as stages free up.
template <class T, int D, int DV, bool kCausal>
__device__ __forceinline__ void producer_tile(const CUtensorMap& tm_q, const CUtensorMap& tm_k,
                                              const CUtensorMap& tm_v, const PackedParams& p, unsigned char* smem,
                                              int m_block, int bh, int split, RingState<Config<D>::kStages>& ring,
                                              int& loaded) {
  constexpr int Bc = Config<D>::Bc, kStages = Config<D>::kStages;
  using Plan = PackedPlan<T, D, DV, Bc, kStages>;
  const Barriers<kStages> bar(smem + Plan::kBars);
  const int bhk = (bh / p.heads) * p.kv_heads + kv_head_of(bh % p.heads, p.heads, p.kv_heads);
  const KvRange kv = packed_kv_blocks(m_block, Bc, p, kCausal);
  int lo, hi;
  split_range(p, kv.n_max, split, &lo, &hi);
  if (lo == hi) return;  // every row of the tile is empty in this split: nothing to load

  mbarrier_wait(bar.empty_q, (loaded & 1) ^ 1);  // the previous tile's Q is no longer read
  mbarrier_arrive_expect_tx(bar.full_q, Plan::kQBytes);
  for (int b = 0; b < Plan::kBoxes; ++b)
    tma_load_3d(smem + Plan::kQ + b * kBr * Plan::kRowBytes, &tm_q, bar.full_q, b * Plan::kBoxCols, m_block * kBr, bh);
  ++loaded;
  for (int j = hi - 1; j >= lo; --j, ring.advance()) {
    // K_j and V_j into stage ring.stage once the consumers have released it.
    mbarrier_wait(&bar.empty_k[ring.stage], ring.phase ^ 1);
    mbarrier_arrive_expect_tx(&bar.full_k[ring.stage], Plan::kKBytes);
    for (int b = 0; b < Plan::kBoxes; ++b)
      tma_load_3d(smem + Plan::kK + ring.stage * Plan::kKBytes + b * Bc * Plan::kRowBytes, &tm_k,
                  &bar.full_k[ring.stage], b * Plan::kBoxCols, j * Bc, bhk);
    mbarrier_wait(&bar.empty_v[ring.stage], ring.phase ^ 1);
    mbarrier_arrive_expect_tx(&bar.full_v[ring.stage], Plan::kVBytes);
    for (int b = 0; b < Plan::kVBoxes; ++b)
      tma_load_3d(smem + Plan::kV + ring.stage * Plan::kVBytes + b * Bc * Plan::kRowBytes, &tm_v,
                  &bar.full_v[ring.stage], b * Plan::kBoxCols, j * Bc, bhk);
  }
}

template <class T, int D, int DV, bool kCausal>
__device__ __forceinline__ void producer(const CUtensorMap& tm_q, const CUtensorMap& tm_k, const CUtensorMap& tm_v,
                                         const PackedParams& p, unsigned char* smem) {
  constexpr int kStages = Config<D>::kStages;
  if (fresh_thread_index() != 0) return;
  const TileWalk walk = tile_walk(p);
  RingState<kStages> ring;  // runs on from tile to tile
  int loaded = 0;           // tiles whose Q this block has loaded: the phase of full_q / empty_q
  int m_block, bh, split;
  for (int round = 0; walk.next(round, &m_block, &bh, &split); ++round)
    producer_tile<T, D, DV, kCausal>(tm_q, tm_k, tm_v, p, smem, m_block, bh, split, ring, loaded);
}

// ---------------------------------------------------------------- consumer warpgroups (warps 4-11)
template <class T, int D, int DV, bool kCausal>
__device__ __forceinline__ void consumer_tile(const PackedParams& p, unsigned char* smem, int m_block, int bh,
                                              int split, RingState<Config<D>::kStages>& ring, int& loaded) {
  constexpr int Bc = Config<D>::Bc, kStages = Config<D>::kStages;
  using Plan = PackedPlan<T, D, DV, Bc, kStages>;
  const Barriers<kStages> bar(smem + Plan::kBars);
  // wg: 0 or 1 for warpgroups 1 and 2 (rows 0-63, 64-127); warp: 0-7 counted from warpgroup 1.
  const int tid = fresh_thread_index() - 128, wg = tid / 128, warp = tid / 32, lane = tid % 32;
  const KvRange kv = packed_kv_blocks(m_block, Bc, p, kCausal);
  int lo, hi;
  split_range(p, kv.n_max, split, &lo, &hi);
  // The tile's O and LSE: straight out (one split), or this split's part for the combine.
  auto store = [&](const float(&o_)[DV / 2], const float(&inv_l)[2], const float(&lse)[2], const int(&row_)[2]) {
    if (p.splits == 1) {
      store_o<T>(p, bh, row_, lane, o_, inv_l, lse);
    } else {
      store_o_part(p, bh, split, row_, lane, o_, inv_l, lse);
    }
  };

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
  // V as the N-major B of P V: K-step kk is keys 16kk..16kk+15, i.e. 16 rows further down.
  auto v_desc = [&](int stage, int kk) {
    return desc_mn_major(smem + Plan::kV + stage * Plan::kVBytes + kk * 16 * Plan::kRowBytes, Bc * Plan::kRowBytes);
  };

  const int row[2] = {m_block * kBr + 16 * warp + lane / 4, m_block * kBr + 16 * warp + lane / 4 + 8};
  const int pos[2] = {row[0] % p.pos_rows, row[1] % p.pos_rows};  // packed row -> query position
  const int limit[2] = {key_limit(pos[0], p.pos_rows, p.nk, kCausal), key_limit(pos[1], p.pos_rows, p.nk, kCausal)};
  // A block needs the mask when j >= n_full: the diagonal, or keys past Nk.
  auto mask = [&](float(&s)[Bc / 2], int j) {
    if (j >= kv.n_full) apply_mask(s, j * Bc, lane, limit);
  };

  float o[DV / 2];  // O_i: 64 x dv per warpgroup, fp32
#pragma unroll
  for (int i = 0; i < DV / 2; ++i) o[i] = 0.f;
  RowSoftmax softmax;
  softmax.init();
  if (lo == hi) {  // every row of the tile is empty (in this split): O = 0, LSE = -inf
    float inv_l[2], lse[2];
    softmax.finish(p.scale_log2, inv_l, lse);
    store(o, inv_l, lse, row);
    return;
  }

  // The window bracket: wait for my turn, then (after issuing) hand the turn over.
  auto my_turn = [&] { named_barrier_sync(kTurnBarrier + wg, kConsumerThreads); };
  auto your_turn = [&] { named_barrier_arrive(kTurnBarrier + 1 - wg, kConsumerThreads); };

  mbarrier_wait(bar.full_q, loaded & 1);
  ++loaded;
  RingState<kStages> ring_v;  // the stage of V_{j+1}, one block behind
  float s[Bc / 2];            // S_j, then P_j in fp32
  uint32_t pr[Bc / 4];        // P_{j+1} as the 16-bit A operand of P V
  float alpha[2];             // the rescale that O still owes for block j+1

  // Prologue: the last block of the range, S = Q_i K_j^T and its P.
  int j = hi - 1;
  mbarrier_wait(&bar.full_k[ring.stage], ring.phase);
  my_turn();
  wgmma_fence();
#pragma unroll
  for (int k = 0; k < D / 16; ++k) WgmmaSS<T, Bc>::mma(s, q_desc(k), k_desc(ring.stage, k), k > 0);
  wgmma_commit();
  your_turn();
  wgmma_wait<0>();
  fence_operand(s);
  if (lane == 0) mbarrier_arrive(&bar.empty_k[ring.stage]);
  mask(s, j);
  softmax.update(s, p.scale_log2, alpha);
  convert_p<T>(s, pr);
  ring_v = ring;
  ring.advance();

  for (--j; j >= lo; --j, ring.advance(), ring_v.advance()) {
    mbarrier_wait(&bar.full_k[ring.stage], ring.phase);
    mbarrier_wait(&bar.full_v[ring_v.stage], ring_v.phase);
    my_turn();
    // S_ij = Q_i K_j^T
    wgmma_fence();
#pragma unroll
    for (int k = 0; k < D / 16; ++k) WgmmaSS<T, Bc>::mma(s, q_desc(k), k_desc(ring.stage, k), k > 0);
    wgmma_commit();
    // O_i = alpha O_i + P_i,j+1 V_j+1
    rescale(o, alpha);
    fence_operand(o);
    wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < Bc / 16; ++kk) {
      const uint32_t a[4] = {pr[4 * kk], pr[4 * kk + 1], pr[4 * kk + 2], pr[4 * kk + 3]};
      WgmmaRS<T, DV>::mma(o, a, v_desc(ring_v.stage, kk), 1);
    }
    wgmma_commit();
    your_turn();

    wgmma_wait<1>();  // S_ij is ready; P V is still running
    fence_operand(s);
    if (lane == 0) mbarrier_arrive(&bar.empty_k[ring.stage]);
    mask(s, j);
    softmax.update(s, p.scale_log2, alpha);  // overlaps P V on the tensor cores

    wgmma_wait<0>();  // P_i,j+1 V_j+1 is done: O and pr may be touched again
    fence_operand(o);
    if (lane == 0) mbarrier_arrive(&bar.empty_v[ring_v.stage]);
    convert_p<T>(s, pr);
  }
  if (lane == 0) mbarrier_arrive(bar.empty_q);  // every Q K^T of this tile is done

  // Epilogue: O_i = alpha O_i + P_i,0 V_0.
  mbarrier_wait(&bar.full_v[ring_v.stage], ring_v.phase);
  rescale(o, alpha);
  fence_operand(o);
  my_turn();
  wgmma_fence();
#pragma unroll
  for (int kk = 0; kk < Bc / 16; ++kk) {
    const uint32_t a[4] = {pr[4 * kk], pr[4 * kk + 1], pr[4 * kk + 2], pr[4 * kk + 3]};
    WgmmaRS<T, DV>::mma(o, a, v_desc(ring_v.stage, kk), 1);
  }
  wgmma_commit();
  your_turn();
  wgmma_wait<0>();
  fence_operand(o);
  if (lane == 0) mbarrier_arrive(&bar.empty_v[ring_v.stage]);

  float inv_l[2], lse[2];
  softmax.finish(p.scale_log2, inv_l, lse);
  store(o, inv_l, lse, row);
}

template <class T, int D, int DV, bool kCausal>
__device__ __forceinline__ void consumer(const PackedParams& p, unsigned char* smem) {
  constexpr int kStages = Config<D>::kStages;
  const int wg = (fresh_thread_index() - 128) / 128;
  const TileWalk walk = tile_walk(p);
  auto my_turn = [&] { named_barrier_sync(kTurnBarrier + wg, kConsumerThreads); };
  auto your_turn = [&] { named_barrier_arrive(kTurnBarrier + 1 - wg, kConsumerThreads); };
  if (wg == 1) your_turn();  // warpgroup 2 hands the first turn to warpgroup 1
  RingState<kStages> ring;   // the stage of K_j, running on from tile to tile
  int loaded = 0;            // tiles with work so far: the phase of full_q
  int m_block, bh, split;
  for (int round = 0; walk.next(round, &m_block, &bh, &split); ++round)
    consumer_tile<T, D, DV, kCausal>(p, smem, m_block, bh, split, ring, loaded);
  if (wg == 0) my_turn();  // warpgroup 1 takes back warpgroup 2's last hand-over
}

template <class T, int D, int DV, bool kCausal>
__global__ void __launch_bounds__(kThreads, 1)
    kernel(const __grid_constant__ CUtensorMap tm_q, const __grid_constant__ CUtensorMap tm_k,
           const __grid_constant__ CUtensorMap tm_v, const PackedParams p) {
  constexpr int Bc = Config<D>::Bc, kStages = Config<D>::kStages;
  using Plan = PackedPlan<T, D, DV, Bc, kStages>;
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
    producer<T, D, DV, kCausal>(tm_q, tm_k, tm_v, p, fresh_smem(smem_raw));
  } else {
    setmaxnreg_inc<240>();
    consumer<T, D, DV, kCausal>(p, fresh_smem(smem_raw));
  }
}

template <class T, int D, int DV, bool kCausal>
PreparedStep prepare(const StepArgs& a, bool pack, int splits) {
  constexpr int Bc = Config<D>::Bc, kStages = Config<D>::kStages;
  using Plan = PackedPlan<T, D, DV, Bc, kStages>;
  const Problem& pr = a.problem;
  const CUtensorMapDataType ty = tma_type<T>();
  // The packed view: G query heads x Nq rows of one KV head are one [G Nq][d] "head".
  const int g = pack ? pr.heads / pr.kv_heads : 1;
  PackedParams params;
  static_cast<Fa3Params&>(params) = a.params;
  params.heads = pr.heads / g;
  params.nq = pr.nq * g;
  params.n_qtiles = ceil_div(params.nq, kBr);
  params.pos_rows = pr.nq;
  const uint64_t bhq = uint64_t(pr.batch) * params.heads, bhk = uint64_t(pr.batch) * pr.kv_heads;
  const CUtensorMap tq = make_tensor_map_3d(a.q, ty, 2, D, params.nq, bhq, Plan::kBoxCols, kBr);
  const CUtensorMap tk = make_tensor_map_3d(a.k, ty, 2, D, pr.nk, bhk, Plan::kBoxCols, Bc);
  const CUtensorMap tv = make_tensor_map_3d(a.v, ty, 2, DV, pr.nk, bhk, Plan::kBoxCols, Bc);
  CUDA_CHECK(cudaFuncSetAttribute(kernel<T, D, DV, kCausal>, cudaFuncAttributeMaxDynamicSharedMemorySize, Plan::kBytes));
  long tiles = long(params.n_qtiles) * long(bhq);
  // Split-K: with fewer tiles than SMs, enough splits to fill them, each of >= 2 key blocks.
  const int key_blocks = ceil_div(pr.nk, Bc);
  if (splits <= 0) splits = tiles < a.sms ? int(std::max(1L, std::min<long>(a.sms / tiles, key_blocks / 2))) : 1;
  splits = std::max(1, std::min(splits, key_blocks));
  params.blocks_per_split = ceil_div(key_blocks, splits);
  params.splits = splits = ceil_div(key_blocks, params.blocks_per_split);  // no split without blocks
  std::shared_ptr<DeviceBuffer<float>> o_part, lse_part;
  if (splits > 1) {
    const std::size_t rows = std::size_t(bhq) * params.nq;
    o_part = std::make_shared<DeviceBuffer<float>>(splits * rows * DV);
    lse_part = std::make_shared<DeviceBuffer<float>>(splits * rows);
    params.o_part = o_part->get();
    params.lse_part = lse_part->get();
  }
  tiles *= splits;
  const int grid = int(tiles < a.sms ? tiles : a.sms);  // one block per SM, each walking its tiles
  PreparedStep s;
  s.grid = grid;
  s.smem_bytes = Plan::kBytes;
  s.launch = [=] {
    kernel<T, D, DV, kCausal><<<grid, kThreads, Plan::kBytes>>>(tq, tk, tv, params);
    CUDA_CHECK_LAUNCH("kernel");
    if (params.splits > 1) {
      const std::size_t rows = std::size_t(bhq) * params.nq;
      combine_kernel<T, DV><<<unsigned((rows + 7) / 8), 256>>>(params);
      CUDA_CHECK_LAUNCH("combine_kernel");
    }
    (void)o_part, (void)lse_part;  // owned by the launch
  };
  return s;
}

template <class T, int D, int DV>
PreparedStep prepare_mask(const StepArgs& a, bool pack, int splits) {
  return a.problem.causal ? prepare<T, D, DV, true>(a, pack, splits) : prepare<T, D, DV, false>(a, pack, splits);
}

template <class T>
PreparedStep prepare_head_dim(const StepArgs& a, bool pack, int splits) {
  if (a.problem.d == 128 && a.problem.dv == 128) return prepare_mask<T, 128, 128>(a, pack, splits);
  if (a.problem.d == 192 && a.problem.dv == 128) return prepare_mask<T, 192, 128>(a, pack, splits);
  throw UsageError("chapter 06 packed forward: no kernel for d = " + std::to_string(a.problem.d) + ", dv = " +
                   std::to_string(a.problem.dv) + " ((128, 128) and (192, 128))");
}

}  // namespace

PreparedStep prepare(const StepArgs& a, bool pack, int splits) {
  if (a.problem.dtype != DType::bf16) throw UsageError("chapter 06 packed forward: bf16 only");
  return prepare_head_dim<__nv_bfloat16>(a, pack, splits);
}

}  // namespace attn::ch06::packed
