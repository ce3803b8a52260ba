// Chapter 05, step 22: v21's row reductions in chains on the three consumers of v14 (from v14).
//
// What changes from v14: the two calls of the online softmax, as from v18 to v21:
// softmax_update_chains<kChains = 4> (fa3_common.cuh), RowSoftmax::update with the row max
// and the row sum each split into four independent partial chains a row (v21's header
// says why: the loop waits on latency, and the row max was its longest dependent run).
// Nothing else changes. v14 is the kernel FA3 and FA4 run at d = 64 (Br = 192, Bc = 128,
// P in registers, three consumers); with Bc = 128 a row's chain was 64 FMNMX long, now 16.
// Registers: still no local memory inside the key-block loop at 160 a consumer thread
// (scripts/sass_loops.py: the 16 local accesses of v14's tile set-up, none in the loop).
//
// Prediction: +3% at d = 64.
// In the recorded H100 run it takes 1.03x its parent v14's time (median over the 4 shapes at
// d = 64; 1.02x to 1.05x).
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

namespace attn::ch05::v22 {
namespace {

using namespace attn::hopper;

// Key block and K/V ring depth per head dim and mask.
template <int D, bool kCausal> struct Config;
template <bool kCausal> struct Config<64, kCausal> { static constexpr int Bc = 128, kStages = 4; };
// One exponential in four on the FMA pipe (degree 4) at d = 64; none at d = 128 and 256
// (measured: see the header).
template <int D> constexpr int kExpEvery = D == 64 ? 4 : 0;
constexpr int kExpDegree = 4;
constexpr int kChains = 4;  // partial chains a row of the softmax's max and sum
constexpr int kBr = 192;        // query rows per tile: three consumer warpgroups of 64
constexpr int kConsumers = 3;   // consumer warpgroups
constexpr int kThreads = 128 * (1 + kConsumers); // producer + three consumer warpgroups
constexpr int kConsumerWarps = 4 * kConsumers;
constexpr int kTurnBarrier = 1;  // named barriers 1-3: consumer 0, 1 and 2's turn (0 is __syncthreads)
constexpr int kConsumerThreads = 256;

/// The tile list (the order of v7's) and entry t of it as (m_block, bh); false past its end.
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

/// The two slots through which the producer hands each tile index to the consumers,
/// after the plan's barriers: full_t[2], empty_t[2], then slot[2].
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

// ---------------------------------------------------------------- producer warpgroup (warps 0-3)
// One thread issues every copy: for each tile, Q once the previous tile's Q is released,
// then K_j and V_j into the ring as stages free up.
template <class T, int D, bool kCausal>
__device__ __forceinline__ void producer_tile(const CUtensorMap& tm_q, const CUtensorMap& tm_k,
                                              const CUtensorMap& tm_v, const Fa3Params& p, unsigned char* smem,
                                              int m_block, int bh, RingState<Config<D, kCausal>::kStages>& ring, int& loaded) {
  constexpr int Bc = Config<D, kCausal>::Bc, kStages = Config<D, kCausal>::kStages;
  using Plan = SmemPlan<T, D, Bc, kStages, Bc, kBr>;
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
  constexpr int Bc = Config<D, kCausal>::Bc, kStages = Config<D, kCausal>::kStages;
  if (fresh_thread_index() != 0) return;
  const TileList list = tile_list(p);
  const TileRing tiles(smem + kTileRingAt<SmemPlan<T, D, Bc, kStages, Bc, kBr>>);
  RingState<kStages> ring;  // runs on from tile to tile
  int loaded = 0;           // tiles whose Q this block has loaded: the phase of full_q / empty_q
  int m_block, bh;
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
}

// ---------------------------------------------------------------- consumer warpgroups (warps 4-11)
template <class T, int D, bool kCausal>
__device__ __forceinline__ void consumer_tile(const Fa3Params& p, unsigned char* smem, int m_block, int bh,
                                              RingState<Config<D, kCausal>::kStages>& ring, int& loaded) {
  constexpr int Bc = Config<D, kCausal>::Bc, kStages = Config<D, kCausal>::kStages;
  using Plan = SmemPlan<T, D, Bc, kStages, Bc, kBr>;
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
  // V as the N-major B of P V: K-step kk is keys 16kk..16kk+15, i.e. 16 rows further down.
  auto v_desc = [&](int stage, int kk) {
    return desc_mn_major(smem + Plan::kV + stage * Plan::kVBytes + kk * 16 * Plan::kRowBytes, Bc * Plan::kRowBytes);
  };

  const int row[2] = {m_block * kBr + 16 * warp + lane / 4, m_block * kBr + 16 * warp + lane / 4 + 8};
  const int limit[2] = {key_limit(row[0], p.nq, p.nk, kCausal), key_limit(row[1], p.nq, p.nk, kCausal)};
  // A block needs the mask when j >= n_full: the diagonal, or keys past Nk.
  auto mask = [&](float(&s)[Bc / 2], int j) {
    if (j >= kv_blocks(m_block + fresh_zero(), kBr, Bc, p.nq, p.nk, kCausal).n_full)  // (recomputed: registers)
      apply_mask(s, j * Bc, lane, limit);
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

  // The window bracket: wait for my turn, then (after issuing) hand the turn over.
  // (the barrier ids from a fresh %tid, warpgroup 1 or 2: no register held across the loop)
  auto my_turn = [&] { named_barrier_sync(kTurnBarrier + (fresh_thread_index() >> 7) - 1, kConsumerThreads); };
  auto your_turn = [&] { named_barrier_arrive(kTurnBarrier + (fresh_thread_index() >> 7) % kConsumers, kConsumerThreads); };

  mbarrier_wait(bar.full_q, loaded & 1);
  ++loaded;
  RingState<kStages> ring_v;  // the stage of V_{j+1}, one block behind
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
  softmax_update_chains<kChains, kExpEvery<D>, kExpDegree>(softmax, s, p.scale_log2, alpha);
  convert_p<T>(s, pr);
  ring_v = ring;
  ring.advance();

  for (--j; j >= 0; --j, ring.advance(), ring_v.advance()) {
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
    softmax_update_chains<kChains, kExpEvery<D>, kExpDegree>(softmax, s, p.scale_log2, alpha);  // overlaps P V

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
    WgmmaRS<T, D>::mma(o, a, v_desc(ring_v.stage, kk), 1);
  }
  wgmma_commit();
  your_turn();
  wgmma_wait<0>();
  fence_operand(o);
  if (lane == 0) mbarrier_arrive(&bar.empty_v[ring_v.stage]);

  float inv_l[2], lse[2];
  softmax.finish(p.scale_log2, inv_l, lse);
  const int t2 = fresh_thread_index() - 128, r2 = m_block * kBr + 16 * (t2 / 32) + (t2 % 32) / 4;
  const int row_end[2] = {r2, r2 + 8};  // (afresh: not kept across the loop)
  store_o<T>(p, bh, row_end, t2 % 32, o, inv_l, lse);
}

template <class T, int D, bool kCausal>
__device__ __forceinline__ void consumer(const Fa3Params& p, unsigned char* smem) {
  constexpr int Bc = Config<D, kCausal>::Bc, kStages = Config<D, kCausal>::kStages;
  const int wg = (fresh_thread_index() - 128) / 128;
  auto my_turn = [&] { named_barrier_sync(kTurnBarrier + wg, kConsumerThreads); };
  auto your_turn = [&] { named_barrier_arrive(kTurnBarrier + (wg + 1) % kConsumers, kConsumerThreads); };
  if (wg == kConsumers - 1) your_turn();  // the last warpgroup hands the first turn to warpgroup 1
  RingState<kStages> ring;   // the stage of K_j, running on from tile to tile
  int loaded = 0;            // tiles with work so far: the phase of full_q
  int m_block, bh;
  for (int round = 0;; ++round) {
    // Built afresh each round from the parameters and the shared-memory base, so that
    // nothing of it stays in registers across the tile (d = 256 has none to spare).
    const TileRing tiles(smem + kTileRingAt<SmemPlan<T, D, Bc, kStages, Bc, kBr>>);
    const int slot = round & 1;
    mbarrier_wait(&tiles.full[slot], (round >> 1) & 1);
    const int t = tiles.slot[slot];
    __syncwarp();
    if (fresh_thread_index() % 32 == 0) mbarrier_arrive(&tiles.empty[slot]);  // the warp has read it
    if (!tile_list(p).coords(t, &m_block, &bh)) break;  // (from the parameters: nothing held in registers)
    consumer_tile<T, D, kCausal>(p, smem, m_block, bh, ring, loaded);
  }
  if (wg == 0) my_turn();  // warpgroup 1 takes back the last warpgroup's last hand-over
}

template <class T, int D, bool kCausal>
__global__ void __launch_bounds__(kThreads, 1)
    kernel(const __grid_constant__ CUtensorMap tm_q, const __grid_constant__ CUtensorMap tm_k,
           const __grid_constant__ CUtensorMap tm_v, const Fa3Params p) {
  constexpr int Bc = Config<D, kCausal>::Bc, kStages = Config<D, kCausal>::kStages;
  using Plan = SmemPlan<T, D, Bc, kStages, Bc, kBr>;
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
    const TileRing tiles(align_1024(smem_raw) + kTileRingAt<Plan>);
    for (int s = 0; s < 2; ++s) {
      mbarrier_init(&tiles.full[s], 1);
      mbarrier_init(&tiles.empty[s], kConsumerWarps);
    }
    mbarrier_init_fence();
  }
  __syncthreads();
  // The role split: every value below is computed inside its role (see fa3_common.cuh).
  if (threadIdx.x < 128) {
    setmaxnreg_dec<24>();
    producer<T, D, kCausal>(tm_q, tm_k, tm_v, p, fresh_smem(smem_raw));
  } else {
    setmaxnreg_inc<160>();
    consumer<T, D, kCausal>(p, fresh_smem(smem_raw));
  }
}

template <class T, int D, bool kCausal>
PreparedStep prepare(const StepArgs& a) {
  constexpr int Bc = Config<D, kCausal>::Bc, kStages = Config<D, kCausal>::kStages;
  using Plan = SmemPlan<T, D, Bc, kStages, Bc, kBr>;
  const Problem& pr = a.problem;
  const CUtensorMapDataType ty = tma_type<T>();
  const uint64_t bhq = uint64_t(pr.batch) * pr.heads, bhk = uint64_t(pr.batch) * pr.kv_heads;
  const CUtensorMap tq = make_tensor_map_3d(a.q, ty, 2, D, pr.nq, bhq, Plan::kBoxCols, kBr);
  const CUtensorMap tk = make_tensor_map_3d(a.k, ty, 2, D, pr.nk, bhk, Plan::kBoxCols, Bc);
  const CUtensorMap tv = make_tensor_map_3d(a.v, ty, 2, D, pr.nk, bhk, Plan::kBoxCols, Bc);
  constexpr int kBytes = Plan::kBytes + TileRing::kBytes;
  CUDA_CHECK(cudaFuncSetAttribute(kernel<T, D, kCausal>, cudaFuncAttributeMaxDynamicSharedMemorySize, kBytes));
  const int n_qtiles = ceil_div(pr.nq, kBr);  // tiles of 192 rows (make_step_args counted 128)
  const long tiles = long(n_qtiles) * long(bhq);
  const int grid = int(tiles < a.sms ? tiles : a.sms);  // one block per SM, each taking tiles on demand
  // The tile counter and the count of blocks that found the list empty; zero before the
  // first launch, and every launch leaves them zero (see the producer).
  auto counter = std::make_shared<DeviceBuffer<int>>(2);
  counter->zero();
  Fa3Params params = a.params;
  params.tile_counter = counter->get();
  params.n_qtiles = n_qtiles;
  PreparedStep s;
  s.grid = grid;
  s.smem_bytes = kBytes;
  s.launch = [=] {
    (void)counter;  // owned by the launch: it lives as long as the prepared step
    kernel<T, D, kCausal><<<grid, kThreads, kBytes>>>(tq, tk, tv, params);
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
  }
  throw UsageError("chapter 05 v22: no kernel for head dim " + std::to_string(a.problem.d) + " (64 only)");
}

}  // namespace

PreparedStep prepare(const StepArgs& a) {
  return a.problem.dtype == DType::f16 ? prepare_head_dim<__half>(a) : prepare_head_dim<__nv_bfloat16>(a);
}

}  // namespace attn::ch05::v22
