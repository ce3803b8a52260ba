// Chapter 05, step 21: the softmax's row reductions in four chains a row (from v18).
//
// What changes from v18: the two calls of the online softmax. They were RowSoftmax::update
// (through softmax_update_two_pipes), whose row max over a block is one chain of Bc / 2
// dependent FMNMX a row and whose row sum one chain of Bc / 2 dependent FADD; they are now
// softmax_update_chains<kChains = 4> (fa3_common.cuh), the same update with each of the
// two reductions split into four independent partial chains a row, joined by a tree of
// two levels (FA4's row max is four partial maxima too). Nothing else changes.
//
// Why: v17's loop waits on latency, not on issue (LAB.md, v20). Two consumer warps share
// a scheduler, and while one waits for its S = Q K^T the other is alone: each of its
// dependent instructions then costs the scheduler the instruction's latency. The longest
// such run in the loop is the row max, which nothing can start before (the exponentials
// need it): in v17's SASS 96 FMNMX in two chains of 48 (Bc = 192), 88 at Bc = 176, so
// about 48 x 4 = 190 clocks for 96 instructions, 50% of the issue rate. Four chains a row
// make it 12 deep (+3 to join, +2 shuffles as before): about 60 clocks. The row sum
// follows the exponentials (MUFU, 8 clocks a warp instruction), so its chain is mostly
// hidden, but it is the same loop and it costs nothing to split it (6 FADD more a block).
// Registers: 6 more values live while the max runs (none while S is produced).
//
// Prediction: +3% at d = 64, +2% at d = 128, +1% at d = 256.
// In the recorded H100 run it takes 1.01x its parent v18's time (median over 20 shapes; 0.99x
// to 1.02x).
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

namespace attn::ch05::v21 {
namespace {

using namespace attn::hopper;

// Key block and K/V ring depth per head dim and mask.
template <int D, bool kCausal> struct Config;
template <> struct Config<64, false> { static constexpr int Bc = 192, kStages = 4; };
template <> struct Config<64, true> { static constexpr int Bc = 192, kStages = 4; };
template <> struct Config<128, false> { static constexpr int Bc = 176, kStages = 2; };
template <> struct Config<128, true> { static constexpr int Bc = 176, kStages = 2; };
template <> struct Config<256, false> { static constexpr int Bc = 80, kStages = 2; };
template <> struct Config<256, true> { static constexpr int Bc = 80, kStages = 2; };
// One exponential in four on the FMA pipe (degree 4) at d = 64; none at d = 128 and 256
// (measured: see the header).
template <int D> constexpr int kExpEvery = D == 64 ? 4 : 0;
constexpr int kExpDegree = 4;
constexpr int kChains = 4;  // partial chains a row of the softmax's max and sum
constexpr int kThreads = 384; // producer + two consumer warpgroups
constexpr int kConsumerWarps = 8;
constexpr int kTurnBarrier = 1;  // named barriers 1 and 2: consumer 0's and 1's turn (0 is __syncthreads)
constexpr int kConsumerThreads = 256;

/// The list of tiles of this thread block: entry `round` of the snake, as (m_block, bh).
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

// ---------------------------------------------------------------- producer warpgroup (warps 0-3)
// One thread issues every copy: for each tile, Q once the previous tile's Q is released,
// then K_j and V_j into the ring as stages free up.
template <class T, int D, bool kCausal>
__device__ __forceinline__ void producer_tile(const CUtensorMap& tm_q, const CUtensorMap& tm_k,
                                              const CUtensorMap& tm_v, const Fa3Params& p, unsigned char* smem,
                                              int m_block, int bh, RingState<Config<D, kCausal>::kStages>& ring, int& loaded) {
  constexpr int Bc = Config<D, kCausal>::Bc, kStages = Config<D, kCausal>::kStages;
  using Plan = SmemPlan<T, D, Bc, kStages>;
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
  constexpr int kStages = Config<D, kCausal>::kStages;
  if (fresh_thread_index() != 0) return;
  const TileWalk walk = tile_walk(p);
  RingState<kStages> ring;  // runs on from tile to tile
  int loaded = 0;           // tiles whose Q this block has loaded: the phase of full_q / empty_q
  int m_block, bh;
  for (int round = 0; walk.next(round, &m_block, &bh); ++round)
    producer_tile<T, D, kCausal>(tm_q, tm_k, tm_v, p, smem, m_block, bh, ring, loaded);
}

// ---------------------------------------------------------------- consumer warpgroups (warps 4-11)
template <class T, int D, bool kCausal>
__device__ __forceinline__ void consumer_tile(const Fa3Params& p, unsigned char* smem, int m_block, int bh,
                                              RingState<Config<D, kCausal>::kStages>& ring, int& loaded) {
  constexpr int Bc = Config<D, kCausal>::Bc, kStages = Config<D, kCausal>::kStages;
  using Plan = SmemPlan<T, D, Bc, kStages>;
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
    if (j >= kv.n_full) apply_mask(s, j * Bc, lane, limit);
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
  auto my_turn = [&] { named_barrier_sync(kTurnBarrier + wg, kConsumerThreads); };
  auto your_turn = [&] { named_barrier_arrive(kTurnBarrier + 1 - wg, kConsumerThreads); };

  mbarrier_wait(bar.full_q, loaded & 1);
  ++loaded;
  // The stage of V_{j+1}: one block behind the K ring, computed from it where it is used.
  auto behind = [](RingState<kStages> r) {
    RingState<kStages> b;
    b.stage = r.stage == 0 ? kStages - 1 : r.stage - 1;
    b.phase = r.stage == 0 ? r.phase ^ 1u : r.phase;
    return b;
  };
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
  ring.advance();

  for (--j; j >= 0; --j, ring.advance()) {
    const RingState<kStages> ring_v = behind(ring);
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
  const RingState<kStages> ring_v = behind(ring);
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
  const int tid_out = fresh_thread_index() - 128, lane_out = tid_out % 32;  // the rows again, after the loop
  const int row_out[2] = {m_block * kBr + 16 * (tid_out / 32) + lane_out / 4,
                          m_block * kBr + 16 * (tid_out / 32) + lane_out / 4 + 8};
  store_o<T>(p, bh, row_out, lane_out, o, inv_l, lse);
}

template <class T, int D, bool kCausal>
__device__ __forceinline__ void consumer(const Fa3Params& p, unsigned char* smem) {
  constexpr int kStages = Config<D, kCausal>::kStages;
  const int wg = (fresh_thread_index() - 128) / 128;
  const TileWalk walk = tile_walk(p);
  auto my_turn = [&] { named_barrier_sync(kTurnBarrier + wg, kConsumerThreads); };
  auto your_turn = [&] { named_barrier_arrive(kTurnBarrier + 1 - wg, kConsumerThreads); };
  if (wg == 1) your_turn();  // warpgroup 2 hands the first turn to warpgroup 1
  RingState<kStages> ring;   // the stage of K_j, running on from tile to tile
  int loaded = 0;            // tiles with work so far: the phase of full_q
  int m_block, bh;
  for (int round = 0; walk.next(round, &m_block, &bh); ++round)
    consumer_tile<T, D, kCausal>(p, smem, m_block, bh, ring, loaded);
  if (wg == 0) my_turn();  // warpgroup 1 takes back warpgroup 2's last hand-over
}

template <class T, int D, bool kCausal>
__global__ void __launch_bounds__(kThreads, 1)
    kernel(const __grid_constant__ CUtensorMap tm_q, const __grid_constant__ CUtensorMap tm_k,
           const __grid_constant__ CUtensorMap tm_v, const Fa3Params p) {
  constexpr int Bc = Config<D, kCausal>::Bc, kStages = Config<D, kCausal>::kStages;
  using Plan = SmemPlan<T, D, Bc, kStages>;
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
    producer<T, D, kCausal>(tm_q, tm_k, tm_v, p, fresh_smem(smem_raw));
  } else {
    setmaxnreg_inc<240>();
    consumer<T, D, kCausal>(p, fresh_smem(smem_raw));
  }
}

template <class T, int D, bool kCausal>
PreparedStep prepare(const StepArgs& a) {
  constexpr int Bc = Config<D, kCausal>::Bc, kStages = Config<D, kCausal>::kStages;
  using Plan = SmemPlan<T, D, Bc, kStages>;
  const Problem& pr = a.problem;
  const CUtensorMapDataType ty = tma_type<T>();
  const uint64_t bhq = uint64_t(pr.batch) * pr.heads, bhk = uint64_t(pr.batch) * pr.kv_heads;
  const CUtensorMap tq = make_tensor_map_3d(a.q, ty, 2, D, pr.nq, bhq, Plan::kBoxCols, kBr);
  const CUtensorMap tk = make_tensor_map_3d(a.k, ty, 2, D, pr.nk, bhk, Plan::kBoxCols, Bc);
  const CUtensorMap tv = make_tensor_map_3d(a.v, ty, 2, D, pr.nk, bhk, Plan::kBoxCols, Bc);
  CUDA_CHECK(cudaFuncSetAttribute(kernel<T, D, kCausal>, cudaFuncAttributeMaxDynamicSharedMemorySize, Plan::kBytes));
  const long tiles = long(a.params.n_qtiles) * long(bhq);
  const int grid = int(tiles < a.sms ? tiles : a.sms);  // one block per SM, each walking its tiles
  const Fa3Params params = a.params;
  PreparedStep s;
  s.grid = grid;
  s.smem_bytes = Plan::kBytes;
  s.launch = [=] {
    kernel<T, D, kCausal><<<grid, kThreads, Plan::kBytes>>>(tq, tk, tv, params);
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
  throw UsageError("chapter 05 v21: no kernel for head dim " + std::to_string(a.problem.d) + " (64, 128, 256)");
}

}  // namespace

PreparedStep prepare(const StepArgs& a) {
  return a.problem.dtype == DType::f16 ? prepare_head_dim<__half>(a) : prepare_head_dim<__nv_bfloat16>(a);
}

}  // namespace attn::ch05::v21
