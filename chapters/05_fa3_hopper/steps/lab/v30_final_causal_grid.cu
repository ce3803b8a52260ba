// Chapter 05, lab step 30: the final kernel's d = 128 causal row on v6's grid with v23's key block (from final).
//
// What changes from final: one field of the table, Bc of Config<128, true>, 128 -> 176: the
// key block of v23's row, kept on v6's grid. Every step that kept v7's persistent blocks
// measured below v6 on causal problems at d = 128 (v16 and v19, which launched the
// longest-first tile list as a grid, did not recover it either). v6's grid walks one
// head's query tiles heaviest first (blockIdx.x) with the head as blockIdx.y, so the blocks
// running together share one or two heads' K and V in L2; the price is that each tile starts
// cold. This step measured that grid with the wider block first; v31 then took v6's block of
// 128, which is the final kernel's row.
//
// Prediction: v6's lead over the persistent kernels moves to the grid from N = 1K on.
//
// Built for d = 128 causal only (elsewhere it is the final kernel itself).
//
// In the recorded H100 run it takes 1.02x the final kernel's time (median over the 6 shapes
// at d = 128 causal; 0.97x to 1.11x): behind below 4K, where the diagonal's second block of
// 176 keys is wasted work, ahead at 8K and 16K.
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
#include "fa3_common.cuh"
#include "step_launch.cuh"

namespace attn::ch05::v30 {
namespace {

using namespace attn::hopper;

enum class Schedule { kPersistent, kDynamic, kGrid };

/// One row of the table: the configuration of one head dim and mask (fields: see the header).
template <int kConsumers_, int kBr_, int Bc_, int kStages_, int kExpEvery_, int kChains_, int kProducerRegs_,
          int kConsumerRegs_, Schedule kSchedule_>
struct Row {
  static constexpr int kConsumers = kConsumers_, kBr = kBr_, Bc = Bc_, kStages = kStages_;
  static constexpr int kExpEvery = kExpEvery_, kChains = kChains_;
  static constexpr int kProducerRegs = kProducerRegs_, kConsumerRegs = kConsumerRegs_;
  static constexpr Schedule kSchedule = kSchedule_;
  static constexpr int kThreads = 128 * (1 + kConsumers);  // producer + consumer warpgroups
  static constexpr int kConsumerWarps = 4 * kConsumers;
  static_assert(kBr == 64 * kConsumers, "a consumer warpgroup owns 64 query rows (one m64 wgmma)");
  static_assert(128 * kProducerRegs + 128 * kConsumers * kConsumerRegs <= 65536, "the register file");
};

// The table: one row per head dim and mask, the one place where they differ (the columns:
// see the header; regs: setmaxnreg's registers a thread, producer and consumers).
template <int D, bool kCausal> struct Config;
//                                          consumers   Br   Bc  stages  exp  chains     regs    schedule
template <> struct Config<64, false>  : Row<        3, 192, 128,      4,   0,      1,   24, 160, Schedule::kDynamic> {};
template <> struct Config<64, true>   : Row<        3, 192, 128,      4,   0,      1,   24, 160, Schedule::kDynamic> {};
template <> struct Config<128, false> : Row<        2, 128, 176,      2,   0,      4,   24, 240, Schedule::kPersistent> {};
template <> struct Config<128, true>  : Row<        2, 128, 176,      2,   0,      4,   24, 240, Schedule::kGrid> {};
template <> struct Config<256, false> : Row<        2, 128,  80,      2,   0,      4,   24, 240, Schedule::kPersistent> {};
template <> struct Config<256, true>  : Row<        2, 128,  80,      2,   0,      4,   24, 240, Schedule::kPersistent> {};
constexpr int kExpDegree = 4;    // exp2_fma's polynomial, where kExpEvery > 0
constexpr int kTurnBarrier = 1;  // named barriers 1, 2 (and 3): consumer 0's, 1's (and 2's) turn (0 is __syncthreads)
constexpr int kConsumerThreads = 256;  // a turn barrier: the warpgroup that waits and the one that hands over

/// The consumer warpgroup after warpgroup wg in the ring of turns (1 - wg of two).
template <int kConsumers>
__device__ __forceinline__ int next_consumer(int wg) {
  return kConsumers == 2 ? 1 - wg : (wg + 1) % kConsumers;
}

/// The shared memory of a configuration: v8's plan with the tile height kBr.
template <class T, int D, bool kCausal>
using PlanOf = SmemPlan<T, D, Config<D, kCausal>::Bc, Config<D, kCausal>::kStages, Config<D, kCausal>::Bc,
                        Config<D, kCausal>::kBr>;

/// kPersistent: the list of tiles of this thread block: entry `round` of the snake, as (m_block, bh).
struct TileWalk {
  int cta, ctas, n_tiles, n_qtiles, bh_count;
  bool causal;
  __device__ __forceinline__ bool next(int round, int* m_block, int* bh) const {
    const int t = snake_tile(cta, round, ctas);
    if (t >= n_tiles) return false;
    tile_coords(t, n_qtiles, bh_count, causal, m_block, bh);
    return true;
  }
};

__device__ __forceinline__ TileWalk tile_walk(const Fa3Params& p) {
  return {fresh_block_index_x(), fresh_grid_size_x(), p.n_qtiles * p.batch * p.heads, p.n_qtiles, p.batch * p.heads, p.causal};
}

/// kDynamic: the tile list (the order of the walk's) and entry t of it as (m_block, bh);
/// false past its end.
struct TileList {
  int n_tiles, n_qtiles, bh_count;
  bool causal;
  __device__ __forceinline__ bool coords(int t, int* m_block, int* bh) const {
    if (t >= n_tiles) return false;
    tile_coords(t, n_qtiles, bh_count, causal, m_block, bh);
    return true;
  }
};

__device__ __forceinline__ TileList tile_list(const Fa3Params& p) {
  return {p.n_qtiles * p.batch * p.heads, p.n_qtiles, p.batch * p.heads, p.causal};
}

/// kDynamic: the two slots through which the producer hands each tile index to the
/// consumers, after the plan's barriers: full_t[2], empty_t[2], then slot[2].
struct TileRing {
  uint64_t* full;
  uint64_t* empty;
  volatile int* slot;
  static constexpr int kBytes = 4 * 8 + 2 * 4;
  __device__ __forceinline__ explicit TileRing(unsigned char* at) {
    full = reinterpret_cast<uint64_t*>(at);
    empty = full + 2;
    slot = reinterpret_cast<volatile int*>(empty + 2);
  }
};
template <class Plan> constexpr int kTileRingAt = Plan::kBars + 8 * Plan::kNumBars;

/// kGrid: this block's one tile, as v6 launched them: blockIdx.x a query tile of head
/// blockIdx.y, the causal diagonal's heaviest tile (the last) first.
template <bool kCausal>
__device__ __forceinline__ void grid_tile(int* m_block, int* bh) {
  *m_block = kCausal ? fresh_grid_size_x() - 1 - fresh_block_index_x() : fresh_block_index_x();
  *bh = fresh_block_index_y();
}

// ---------------------------------------------------------------- producer warpgroup (warps 0-3)
// One thread issues every copy: for each tile, Q once the previous tile's Q is released,
// then K_j and V_j into the ring as stages free up.
template <class T, int D, bool kCausal>
__device__ __forceinline__ void producer_tile(const CUtensorMap& tm_q, const CUtensorMap& tm_k,
                                              const CUtensorMap& tm_v, const Fa3Params& p, unsigned char* smem,
                                              int m_block, int bh, RingState<Config<D, kCausal>::kStages>& ring, int& loaded) {
  constexpr int kBr = Config<D, kCausal>::kBr, Bc = Config<D, kCausal>::Bc, kStages = Config<D, kCausal>::kStages;
  using Plan = PlanOf<T, D, kCausal>;
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
    for (int b = 0; b < Plan::kBoxes; ++b)
      tma_load_3d(smem + Plan::kV + ring.stage * Plan::kVBytes + b * Bc * Plan::kRowBytes, &tm_v,
                  &bar.full_v[ring.stage], b * Plan::kBoxCols, j * Bc, bhk);
  }
}

template <class T, int D, bool kCausal>
__device__ __forceinline__ void producer(const CUtensorMap& tm_q, const CUtensorMap& tm_k, const CUtensorMap& tm_v,
                                         const Fa3Params& p, unsigned char* smem) {
  using C = Config<D, kCausal>;
  constexpr int kStages = C::kStages;
  if (fresh_thread_index() != 0) return;
  RingState<kStages> ring;  // runs on from tile to tile
  int loaded = 0;           // tiles whose Q this block has loaded: the phase of full_q / empty_q
  int m_block, bh;
  if constexpr (C::kSchedule == Schedule::kPersistent) {
    const TileWalk walk = tile_walk(p);
    for (int round = 0; walk.next(round, &m_block, &bh); ++round)
      producer_tile<T, D, kCausal>(tm_q, tm_k, tm_v, p, smem, m_block, bh, ring, loaded);
  } else if constexpr (C::kSchedule == Schedule::kDynamic) {
    // Tile of round 0: blockIdx.x; of round r: gridDim.x + the counter's next value. Each
    // goes to the consumers through a slot of the tile ring, the walk ending past the list.
    const TileList list = tile_list(p);
    const TileRing tiles(smem + kTileRingAt<PlanOf<T, D, kCausal>>);
    for (int round = 0;; ++round) {
      const int t = round == 0 ? fresh_block_index_x() : fresh_grid_size_x() + atomicAdd(p.tile_counter, 1);
      const int slot = round & 1;
      mbarrier_wait(&tiles.empty[slot], ((round >> 1) & 1) ^ 1);
      tiles.slot[slot] = t;
      mbarrier_arrive(&tiles.full[slot]);  // release: the consumers' wait sees the slot
      if (!list.coords(t, &m_block, &bh)) break;
      producer_tile<T, D, kCausal>(tm_q, tm_k, tm_v, p, smem, m_block, bh, ring, loaded);
    }
    // Every block asks until it finds the list empty; the last one to do so resets the counters.
    __threadfence();
    if (atomicAdd(p.tile_counter + 1, 1) == fresh_grid_size_x() - 1) {
      p.tile_counter[0] = 0;
      p.tile_counter[1] = 0;
    }
  } else {  // kGrid
    grid_tile<kCausal>(&m_block, &bh);
    producer_tile<T, D, kCausal>(tm_q, tm_k, tm_v, p, smem, m_block, bh, ring, loaded);
  }
}

// ---------------------------------------------------------------- consumer warpgroups (warps 4-11, or 4-15)
template <class T, int D, bool kCausal>
__device__ __forceinline__ void consumer_tile(const Fa3Params& p, unsigned char* smem, int m_block, int bh,
                                              RingState<Config<D, kCausal>::kStages>& ring, int& loaded) {
  using C = Config<D, kCausal>;
  constexpr int kBr = C::kBr, Bc = C::Bc, kStages = C::kStages;
  constexpr bool kThree = C::kConsumers == 3;  // 160 registers a thread: v14's forms below, else v18's
  using Plan = PlanOf<T, D, kCausal>;
  const Barriers<kStages> bar(smem + Plan::kBars);
  // wg: 0, 1 (or 2) for warpgroups 1, 2 (and 3), rows 64 wg .. 64 wg + 63; warp: counted from warpgroup 1.
  const int tid = fresh_thread_index() - 128, wg = tid / 128, warp = tid / 32, lane = tid % 32;
  const KvRange kv = kv_blocks(m_block, kBr, Bc, p.nq, p.nk, kCausal);

  // Descriptors, built once from their tiles' bases and moved by addition (fa3_common.cuh:
  // desc_advance, in 16-byte units). Q: this warpgroup's 64 rows; the k-th K-step is 32
  // bytes into the rows.
  const uint64_t q0 = desc_k_major(smem + Plan::kQ + wg * 64 * Plan::kRowBytes, Plan::kRowBytes);
  const uint64_t k0 = desc_k_major(smem + Plan::kK, Plan::kRowBytes);
  const uint64_t v0 = desc_mn_major(smem + Plan::kV, Bc * Plan::kRowBytes);
  auto q_desc = [&](int k) {
    const int byte = 32 * k;
    return desc_advance(q0, ((byte / Plan::kRowBytes) * kBr * Plan::kRowBytes + byte % Plan::kRowBytes) / 16);
  };
  auto k_desc = [&](int stage, int k) {
    const int byte = 32 * k;
    return desc_advance(k0, stage * (Plan::kKBytes / 16) +
                                ((byte / Plan::kRowBytes) * Bc * Plan::kRowBytes + byte % Plan::kRowBytes) / 16);
  };
  // V as the N-major B of P V: K-step kk is keys 16kk..16kk+15, i.e. 16 rows further down.
  auto v_desc = [&](int stage, int kk) {
    return desc_advance(v0, stage * (Plan::kVBytes / 16) + kk * Plan::kRowBytes);  // 16 rows = kRowBytes units
  };

  const int row[2] = {m_block * kBr + 16 * warp + lane / 4, m_block * kBr + 16 * warp + lane / 4 + 8};
  const int limit[2] = {key_limit(row[0], p.nq, p.nk, kCausal), key_limit(row[1], p.nq, p.nk, kCausal)};
  // A block needs the mask when j >= n_full: the diagonal, or keys past Nk.
  auto mask = [&](float(&s)[Bc / 2], int j) {
    if constexpr (kThree) {  // n_full computed again for each block, from a fresh zero: no register held
      if (j >= kv_blocks(m_block + fresh_zero(), kBr, Bc, p.nq, p.nk, kCausal).n_full)
        apply_mask(s, j * Bc, lane, limit);
    } else {
      if (j >= kv.n_full) apply_mask(s, j * Bc, lane, limit);
    }
  };

  float o[D / 2];  // O_i: 64 x d per warpgroup, fp32
#pragma unroll
  for (int i = 0; i < D / 2; ++i) o[i] = 0.f;
  RowSoftmax softmax;
  softmax.init();
  if (kv.n_max == 0) {  // every row of the tile is empty: O = 0, LSE = -inf
    float inv_l[2], lse[2];
    softmax.finish(p.scale_log2, inv_l, lse);
    store_o<T>(p, bh, row, lane, o, inv_l, lse);
    return;
  }

  // The window bracket: wait for my turn, then (after issuing) hand the turn over to the
  // next consumer (kThree: the barrier ids from a fresh %tid, warpgroup 1, 2 or 3).
  auto my_turn = [&] {
    if constexpr (kThree) named_barrier_sync(kTurnBarrier + (fresh_thread_index() >> 7) - 1, kConsumerThreads);
    else named_barrier_sync(kTurnBarrier + wg, kConsumerThreads);
  };
  auto your_turn = [&] {
    if constexpr (kThree)
      named_barrier_arrive(kTurnBarrier + (fresh_thread_index() >> 7) % C::kConsumers, kConsumerThreads);
    else named_barrier_arrive(kTurnBarrier + next_consumer<C::kConsumers>(wg), kConsumerThreads);
  };

  mbarrier_wait(bar.full_q, loaded & 1);
  ++loaded;
  // The stage of V_{j+1}, one block behind the K ring: ring_v, carried through the loop
  // (v14's form, three consumers); with two consumers computed from the K ring where it is
  // used instead (behind(), v18's form: nothing more held across the loop), which leaves the
  // carried copy unused.
  auto behind = [](RingState<kStages> r) {
    RingState<kStages> b;
    b.stage = r.stage == 0 ? kStages - 1 : r.stage - 1;
    b.phase = r.stage == 0 ? r.phase ^ 1u : r.phase;
    return b;
  };
  RingState<kStages> ring_v;  // the stage of V_{j+1}
  float s[Bc / 2];            // S_j, then P_j in fp32
  uint32_t pr[Bc / 4];        // P_{j+1} as the 16-bit A operand of P V
  float alpha[2];             // the rescale that O still owes for block j+1

  // Prologue: the last block, S = Q_i K_j^T and its P.
  int j = kv.n_max - 1;
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
  softmax_update_chains<C::kChains, C::kExpEvery, kExpDegree>(softmax, s, p.scale_log2, alpha);
  convert_p<T>(s, pr);
  ring_v = ring;
  ring.advance();

  for (--j; j >= 0; --j, ring.advance(), ring_v.advance()) {
    if constexpr (!kThree) ring_v = behind(ring);
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
      WgmmaRS<T, D>::mma(o, a, v_desc(ring_v.stage, kk), 1);
    }
    wgmma_commit();
    your_turn();

    wgmma_wait<1>();  // S_ij is ready; P V is still running
    fence_operand(s);
    if (lane == 0) mbarrier_arrive(&bar.empty_k[ring.stage]);
    mask(s, j);
    softmax_update_chains<C::kChains, C::kExpEvery, kExpDegree>(softmax, s, p.scale_log2, alpha);  // overlaps P V

    wgmma_wait<0>();  // P_i,j+1 V_j+1 is done: O and pr may be touched again
    fence_operand(o);
    if (lane == 0) mbarrier_arrive(&bar.empty_v[ring_v.stage]);
    convert_p<T>(s, pr);
  }
  if (lane == 0) mbarrier_arrive(bar.empty_q);  // every Q K^T of this tile is done

  // Epilogue: O_i = alpha O_i + P_i,0 V_0.
  if constexpr (!kThree) ring_v = behind(ring);
  mbarrier_wait(&bar.full_v[ring_v.stage], ring_v.phase);
  rescale(o, alpha);
  fence_operand(o);
  my_turn();
  wgmma_fence();
#pragma unroll
  for (int kk = 0; kk < Bc / 16; ++kk) {
    const uint32_t a[4] = {pr[4 * kk], pr[4 * kk + 1], pr[4 * kk + 2], pr[4 * kk + 3]};
    WgmmaRS<T, D>::mma(o, a, v_desc(ring_v.stage, kk), 1);
  }
  wgmma_commit();
  your_turn();
  wgmma_wait<0>();
  fence_operand(o);
  if (lane == 0) mbarrier_arrive(&bar.empty_v[ring_v.stage]);

  float inv_l[2], lse[2];
  softmax.finish(p.scale_log2, inv_l, lse);
  // The rows again, after the loop, from a fresh %tid: not kept across it.
  if constexpr (kThree) {
    const int t2 = fresh_thread_index() - 128, r2 = m_block * kBr + 16 * (t2 / 32) + (t2 % 32) / 4;
    const int row_end[2] = {r2, r2 + 8};
    store_o<T>(p, bh, row_end, t2 % 32, o, inv_l, lse);
  } else {
    const int tid_out = fresh_thread_index() - 128, lane_out = tid_out % 32;
    const int row_out[2] = {m_block * kBr + 16 * (tid_out / 32) + lane_out / 4,
                            m_block * kBr + 16 * (tid_out / 32) + lane_out / 4 + 8};
    store_o<T>(p, bh, row_out, lane_out, o, inv_l, lse);
  }
}

template <class T, int D, bool kCausal>
__device__ __forceinline__ void consumer(const Fa3Params& p, unsigned char* smem) {
  using C = Config<D, kCausal>;
  constexpr int kStages = C::kStages;
  const int wg = (fresh_thread_index() - 128) / 128;
  const TileWalk walk = C::kSchedule == Schedule::kPersistent ? tile_walk(p) : TileWalk{};  // kPersistent: the tiles
  auto my_turn = [&] { named_barrier_sync(kTurnBarrier + wg, kConsumerThreads); };
  auto your_turn = [&] { named_barrier_arrive(kTurnBarrier + next_consumer<C::kConsumers>(wg), kConsumerThreads); };
  if (wg == C::kConsumers - 1) your_turn();  // the last warpgroup hands the first turn to warpgroup 1
  RingState<kStages> ring;   // the stage of K_j, running on from tile to tile
  int loaded = 0;            // tiles with work so far: the phase of full_q
  int m_block, bh;
  if constexpr (C::kSchedule == Schedule::kPersistent) {
    for (int round = 0; walk.next(round, &m_block, &bh); ++round)
      consumer_tile<T, D, kCausal>(p, smem, m_block, bh, ring, loaded);
  } else if constexpr (C::kSchedule == Schedule::kDynamic) {
    for (int round = 0;; ++round) {
      // Built afresh each round from the parameters and the shared-memory base, so that
      // nothing of it stays in registers across the tile.
      const TileRing tiles(smem + kTileRingAt<PlanOf<T, D, kCausal>>);
      const int slot = round & 1;
      mbarrier_wait(&tiles.full[slot], (round >> 1) & 1);
      const int t = tiles.slot[slot];
      __syncwarp();
      if (fresh_thread_index() % 32 == 0) mbarrier_arrive(&tiles.empty[slot]);  // the warp has read it
      if (!tile_list(p).coords(t, &m_block, &bh)) break;
      consumer_tile<T, D, kCausal>(p, smem, m_block, bh, ring, loaded);
    }
  } else {  // kGrid
    grid_tile<kCausal>(&m_block, &bh);
    consumer_tile<T, D, kCausal>(p, smem, m_block, bh, ring, loaded);
  }
  if (wg == 0) my_turn();  // warpgroup 1 takes back the last warpgroup's last hand-over
}

template <class T, int D, bool kCausal>
__global__ void __launch_bounds__(Config<D, kCausal>::kThreads, 1)
    kernel(const __grid_constant__ CUtensorMap tm_q, const __grid_constant__ CUtensorMap tm_k,
           const __grid_constant__ CUtensorMap tm_v, const Fa3Params p) {
  using C = Config<D, kCausal>;
  constexpr int kStages = C::kStages;
  using Plan = PlanOf<T, D, kCausal>;
  extern __shared__ unsigned char smem_raw[];
  if (threadIdx.x == 0) {
    const Barriers<kStages> bar(align_1024(smem_raw) + Plan::kBars);
    mbarrier_init(bar.full_q, 1);
    mbarrier_init(bar.empty_q, C::kConsumerWarps);
    for (int s = 0; s < kStages; ++s) {
      mbarrier_init(&bar.full_k[s], 1);
      mbarrier_init(&bar.full_v[s], 1);
      mbarrier_init(&bar.empty_k[s], C::kConsumerWarps);
      mbarrier_init(&bar.empty_v[s], C::kConsumerWarps);
    }
    if constexpr (C::kSchedule == Schedule::kDynamic) {
      const TileRing tiles(align_1024(smem_raw) + kTileRingAt<Plan>);
      for (int s = 0; s < 2; ++s) {
        mbarrier_init(&tiles.full[s], 1);
        mbarrier_init(&tiles.empty[s], C::kConsumerWarps);
      }
    }
    mbarrier_init_fence();
  }
  __syncthreads();
  // The role split: every value below is computed inside its role (see fa3_common.cuh).
  if (threadIdx.x < 128) {
    setmaxnreg_dec<C::kProducerRegs>();
    producer<T, D, kCausal>(tm_q, tm_k, tm_v, p, fresh_smem(smem_raw));
  } else {
    setmaxnreg_inc<C::kConsumerRegs>();
    consumer<T, D, kCausal>(p, fresh_smem(smem_raw));
  }
}

template <class T, int D, bool kCausal>
PreparedStep prepare(const StepArgs& a) {
  using C = Config<D, kCausal>;
  constexpr int Bc = C::Bc;
  using Plan = PlanOf<T, D, kCausal>;
  const Problem& pr = a.problem;
  const CUtensorMapDataType ty = tma_type<T>();
  const uint64_t bhq = uint64_t(pr.batch) * pr.heads, bhk = uint64_t(pr.batch) * pr.kv_heads;
  const CUtensorMap tq = make_tensor_map_3d(a.q, ty, 2, D, pr.nq, bhq, Plan::kBoxCols, C::kBr);
  const CUtensorMap tk = make_tensor_map_3d(a.k, ty, 2, D, pr.nk, bhk, Plan::kBoxCols, Bc);
  const CUtensorMap tv = make_tensor_map_3d(a.v, ty, 2, D, pr.nk, bhk, Plan::kBoxCols, Bc);
  constexpr int kBytes = Plan::kBytes + (C::kSchedule == Schedule::kDynamic ? TileRing::kBytes : 0);
  CUDA_CHECK(cudaFuncSetAttribute(kernel<T, D, kCausal>, cudaFuncAttributeMaxDynamicSharedMemorySize, kBytes));
  Fa3Params params = a.params;
  params.n_qtiles = ceil_div(pr.nq, C::kBr);  // tiles of kBr rows (make_step_args counted 128)
  const long tiles = long(params.n_qtiles) * long(bhq);
  // kGrid: one block per tile, (query tile, head); otherwise one block per SM (or per tile, if
  // fewer), each walking its tiles or taking them on demand.
  const dim3 grid = C::kSchedule == Schedule::kGrid ? dim3(params.n_qtiles, unsigned(bhq))
                                                    : dim3(unsigned(tiles < a.sms ? tiles : a.sms));
  // kDynamic: the tile counter and the count of blocks that found the list empty; zero before
  // the first launch, and every launch leaves them zero (see the producer).
  std::shared_ptr<DeviceBuffer<int>> counter;
  if constexpr (C::kSchedule == Schedule::kDynamic) {
    counter = std::make_shared<DeviceBuffer<int>>(2);
    counter->zero();
    params.tile_counter = counter->get();
  }
  PreparedStep s;
  s.grid = int(grid.x * grid.y);
  s.smem_bytes = kBytes;
  s.launch = [=] {
    (void)counter;  // owned by the launch: it lives as long as the prepared step
    kernel<T, D, kCausal><<<grid, C::kThreads, kBytes>>>(tq, tk, tv, params);
    CUDA_CHECK_LAUNCH("kernel");
  };
  return s;
}

template <class T, int D>
PreparedStep prepare_mask(const StepArgs& a) {
  return a.problem.causal ? prepare<T, D, true>(a) : prepare<T, D, false>(a);
}

template <class T>
PreparedStep prepare_head_dim(const StepArgs& a) {
  switch (a.problem.d) {
    case 64: return prepare_mask<T, 64>(a);
    case 128: return prepare_mask<T, 128>(a);
    case 256: return prepare_mask<T, 256>(a);
  }
  throw UsageError("chapter 05 v30: no kernel for head dim " + std::to_string(a.problem.d) + " (64, 128, 256)");
}

}  // namespace

PreparedStep prepare(const StepArgs& a) {
  return a.problem.dtype == DType::f16 ? prepare_head_dim<__half>(a) : prepare_head_dim<__nv_bfloat16>(a);
}

}  // namespace attn::ch05::v30
