// Chapter 06, the masked backward on sm_90a: chapter 05's final backward kernel with a mask
// policy (masks/mask_policy.hpp), for d = 64 and 128, bf16 and fp16, dQ's adds in any order or
// (the deterministic mode) in the order of the key blocks.
//
//   ../../05_fa3_hopper/steps/final_backward.cu   chapter 05's final backward (this file's parent)
// > hopper_backward.cu                            + the policy: block map walk, keep, score'
//
// `diff ../../05_fa3_hopper/steps/final_backward.cu hopper_backward.cu` shows the policy going
// in, and nothing else of the kernel changes: its configuration (Config<D>: 128 queries a step
// at d = 64, 80 at d = 128), its roles, ring, barriers and FA4's order of the products are
// chapter 05's. What changes:
//
//   1. The walk. A thread block (key block j, KV head) walks the steps of its entry in the
//      block map's backward lists instead of every query step from the causal diagonal on: the
//      host merges each key block's partial and full query steps into one ascending list
//      (MaskWalks), a step's number times two plus one where it is partial. Ascending, or
//      descending in the deterministic mode, as chapter 05 walks.
//   2. keep(b, h, i, j) masks P on partial steps only (full steps have no mask arithmetic),
//      where chapter 05 tested the causal diagonal.
//   3. With Policy::kScore: P = 2^(score(tau S) log2(e) - LSE log2(e)) and dS = P o (dP - D) o
//      score'(tau S). Where score' is 1 (ALiBi) dS is chapter 05's. Where it is not
//      (Policy::kDscore: softcap), P and dS come from tau S in one pass once S^T and dP^T are
//      done, each group's LSE_i and D_i read from shared memory as it needs them; the forms that
//      kept more alive across the loop made ptxas serialise the wgmma at d = 128.
//   4. The deterministic mode's order. Chapter 05's key block j waits for the j blocks before
//      it; here a query step is visited by the key blocks of its map entry, so block j waits for
//      its rank among them (MaskWalks::rank, from the host). The grid keeps j the slowest index,
//      so every block it waits for started before it.
//   5. With Policy::kSink, dLoss/dsink_h = -sum_i 2^(sink_h log2(e) - LSE_i log2(e)) D_i: one
//      thread block per head, a fixed-order sum over the preprocess's D and LSE (sink_grad).
//   6. No b16 order: chapter 05 launches b16's order for one causal deterministic d = 64 case;
//      here every instance takes FA4's.
//
// The preprocess and postprocess are chapter 05's (backward_prepost.cuh), included by path, as
// are its walk tiles (backward_tiles.hpp) and shared header (fa3_common.cuh). The standard
// layout only ([B][H][N][d]): a document mask's packed rows run on the sm_80 backward
// (backward_mask.cu), the portable path.
//
// Its fp16 instantiations compile apart, in masks/hopper_backward_fp16.cu (CH06_BWD_FP16), as
// the final forward's do.
#include "common/cuda/check.cuh"
#include "common/errors.hpp"
#include "common/cuda/fast_math.cuh"
#include "common/cuda/hopper/bulk_copy.cuh"
#include "common/cuda/hopper/mbarrier.cuh"
#include "common/cuda/hopper/named_barrier.cuh"
#include "common/cuda/hopper/roles.cuh"
#include "common/cuda/hopper/setmaxnreg.cuh"
#include "common/cuda/hopper/shared_access.cuh"
#include "common/cuda/hopper/tma.cuh"
#include "common/cuda/hopper/wgmma.cuh"
#include "chapters/05_fa3_hopper/backward_launch.cuh"  // chapter 05's Fa3BwdParams
#include "chapters/05_fa3_hopper/backward_prepost.cuh"  // chapter 05's preprocess and postprocess
#include "chapters/05_fa3_hopper/backward_tiles.hpp"    // chapter 05's kBwdBc
#include "chapters/05_fa3_hopper/fa3_common.cuh"        // chapter 05's ring, conversions
#include "masks/mask_kernels.cuh"
#include "masks/mask_policy.hpp"

#ifndef CH06_BWD_FP16
#define CH06_BWD_FP16 0  // 1: this file as masks/hopper_backward_fp16.cu includes it (the fp16 kernels)
#endif

namespace attn::ch06::hopper_bwd {
namespace {

using namespace attn::hopper;
using namespace attn::ch05;  // Fa3BwdParams, RingState, convert_p, pack2, the pre- and postprocess
using attn::cuda::exp2_approx;

constexpr int Bc = kBwdBc;     // keys per thread block
constexpr int kStages = 2;     // Q_i, dO_i, LSE_i, D_i ring depth
constexpr int kThreads = 384;  // a producer and two consumer warpgroups

/// The choices that depend on the head dim, one specialisation per d. Only BwdPlan reads them;
/// the kernel tests the Plan's copies where the two configurations differ.
template <int D>
struct Config;

template <>
struct Config<64> {
  static constexpr int kBr = 128;               ///< queries a step: twice the work per chain of latencies (b12)
  static constexpr int kBlockRows = 64;         ///< rows of the walk's LSE, D and dQ blocks: a step is a pair (b12)
  static constexpr bool kDqTransposed = false;  ///< dQ = dS K_j, consumer w the whole tile of block 2i + w (b12)
  static constexpr int kdSSwizzle = 128;        ///< dS^T in 128-byte swizzled slabs of 64 queries (b12)
  static constexpr int kdQBuffers = 2;          ///< dQ tiles a consumer: the writer may fall a step behind (b5)
  static constexpr int kSmemSlack = 896;        ///< bytes to align the tiles to 1024: 128 declared, checked (b12)
};

template <>
struct Config<128> {
  static constexpr int kBr = 80;               ///< queries a step: 25% more work per chain, what registers allow (b13)
  static constexpr int kBlockRows = 80;        ///< rows of the walk's LSE, D and dQ blocks: one a step (b13)
  static constexpr bool kDqTransposed = true;  ///< dQ_i^T = K_j^T dS^T, M = d: 80 rows do not fit M = 64 (b13)
  static constexpr int kdSSwizzle = 32;        ///< dS^T in 32-byte swizzled slabs of 16 queries (b13)
  static constexpr int kdQBuffers = 1;         ///< dQ tiles a consumer: a second does not fit (b13)
  static constexpr int kSmemSlack = 1024;      ///< bytes to align the tiles to 1024: any alignment will do (b11)
};

/// Shared memory, every tile 1024-aligned, tiles as TMA boxes of 128-byte rows.
template <class T, int D>
struct BwdPlan {
  using Cfg = Config<D>;
  static constexpr int Br = Cfg::kBr;                    ///< queries per step
  static constexpr int kBlk = Cfg::kBlockRows;           ///< rows of a block of the walk and of dQ's accumulator
  static constexpr int kBlocksPerStep = Br / kBlk;
  static constexpr bool kDqTransposed = Cfg::kDqTransposed;
  static constexpr int kdSSwizzle = Cfg::kdSSwizzle;
  static constexpr int kdQBuffers = Cfg::kdQBuffers;
  static constexpr int kRowBytes = 128, kBoxCols = 64, kBoxes = D / kBoxCols;
  static constexpr int kKVBytes = Bc * D * 2;  ///< K_j or V_j
  static constexpr int kQBytes = Br * D * 2;   ///< one stage of Q_i or dO_i
  static constexpr int kK = 0;
  static constexpr int kV = kK + kKVBytes;
  static constexpr int kQ = kV + kKVBytes;
  static constexpr int kdO = kQ + kStages * kQBytes;
  static constexpr int kdS = kdO + kStages * kQBytes;  ///< dS^T [buffer 2][slab]: Bc rows of kdSSwizzle bytes
  static constexpr int kdSSlabBytes = Bc * kdSSwizzle; ///< one slab of kdSSwizzle / 2 queries
  static constexpr int kdSBytes = Bc * Br * 2;
  static constexpr int kdQ = kdS + 2 * kdSBytes;       ///< [buffer][consumer 2] of Br x D / 2 fp32
  static constexpr int kdQTileBytes = Br * (D / 2) * 4;
  static constexpr int kdQRegs = kdQTileBytes / 4 / 128;  ///< a consumer thread's dQ accumulators
  static constexpr int kL = kdQ + 2 * kdQBuffers * kdQTileBytes;  ///< LSE_i (base 2) per stage
  static constexpr int kD = kL + kStages * Br * 4;     ///< D_i per stage
  static constexpr int kBars = kD + kStages * Br * 4;  ///< kv, full[kStages], empty[kStages], dq_full[4], dq_empty[4]
  static constexpr int kStepBytes = 2 * kQBytes + 2 * Br * 4;
  static constexpr int kAlign = 128;  ///< the dynamic shared memory's declared alignment
  static constexpr int kSlack = Cfg::kSmemSlack;  ///< 1024, or 1024 - kAlign where the kernel checks kAlign
  static constexpr int kBytes = kBars + 8 * (1 + 2 * kStages + 8) + kSlack;
  static_assert(kDqTransposed ? kBlk == Br && kdSSwizzle == 32 : kBlk == 64 && Br == 2 * kBlk && kdSSwizzle == 128,
                "dQ by blocks reads a 128-byte slab of 64 queries per consumer; transposed, a block is a step");
  static_assert(Br % (kdSSwizzle / 2) == 0, "dS^T rows are whole slabs");
  static_assert(kdQBuffers == 1 || kdQBuffers == 2, "one or two dQ tiles a consumer");
  static_assert(kSlack == 1024 || kSlack == 1024 - kAlign, "slack for any alignment, or for the declared one");
  static_assert(kBytes <= 232448, "more shared memory than a block may have");
};

/// The walk of one thread block, as every role computes it for itself after the split: the
/// query steps of its key block's list (the block map's, merged by the host: MaskWalks), for
/// each query head of the KV group.
template <class Plan>
struct Walk {
  int j, bk, b, hk, group, col0, steps_per_head, n_steps;  // i: a step's Br queries
  const int* list;  // this key block's steps, ascending: step << 1 | partial
  const int* rank;  // the deterministic mode: this key block's place among the step's visitors
  __device__ __forceinline__ Walk(const Fa3BwdParams& p, const MaskWalks& mw) {
    j = fresh_block_index_y();  // the slowest index: a block waits only for blocks started before it
    bk = fresh_block_index_x();
    b = bk / p.kv_heads;
    hk = bk % p.kv_heads;
    group = p.heads / p.kv_heads;
    col0 = j * Bc;
    const std::size_t f = std::size_t(mw.map_batch > 1 ? b : 0) * mw.tk + j;
    list = mw.list + f * mw.tq;
    rank = mw.rank + f * mw.tq;
    steps_per_head = mw.count[f];
    n_steps = steps_per_head * group;
  }
  /// The list's index of step s: ascending, or (deterministic) descending from the last.
  __device__ __forceinline__ int entry(int s, const Fa3BwdParams& p) const {
    const int k = s % steps_per_head;
    return p.deterministic ? steps_per_head - 1 - k : k;
  }
  /// Step s's list entry (step << 1 | partial), or 0 past the last step. The producer and the
  /// dQ writer read it a step ahead (Ahead below): a load from global memory between a stage's
  /// release and its copies would add its latency to every step. The consumers read it in
  /// the step: they first need it once S^T is done, and a value carried across the loop costs
  /// a register that d = 128 does not have.
  __device__ __forceinline__ int at(int s, const Fa3BwdParams& p) const { return s < n_steps ? list[entry(s, p)] : 0; }
  __device__ __forceinline__ int rank_at(int s, const Fa3BwdParams& p) const { return s < n_steps ? rank[entry(s, p)] : 0; }
  __device__ __forceinline__ int head_of(int s, const Fa3BwdParams& p) const {
    return b * p.heads + hk * group + s / steps_per_head;
  }
};

/// A value of step s read while step s - 1 runs: take() gives step s's and loads step s + 1's.
struct Ahead {
  int next;
  template <class F>
  __device__ __forceinline__ int take(int s, F&& load) {
    const int v = next;
    next = load(s + 1);
    return v;
  }
};

/// The dQ tiles' barriers after the ring's: dq_full[2 w + b], dq_empty[2 w + b] for warpgroup w, buffer b.
template <class Plan>
__device__ __forceinline__ uint64_t* dq_bars(unsigned char* smem) {
  return reinterpret_cast<uint64_t*>(smem + Plan::kBars) + 1 + 2 * kStages;
}

// ---------------------------------------------------------------- dQ writer (warp 1, one thread)
// Step s's two tiles, as the consumers hand them over, into dQ's accumulator. With one buffer a
// consumer, consumer 1's first: consumer 0 hands step s over a step later (b10's offset), and
// taking its tile first would hold consumer 1's release back until consumer 0 is done with
// step s + 1; consumer 1 would wait for it at every step.
template <class T, int D>
__device__ __forceinline__ void dq_writer(const Fa3BwdParams& p, const MaskWalks& mw, unsigned char* smem) {
  using Plan = BwdPlan<T, D>;
  constexpr int Br = Plan::Br, kBlk = Plan::kBlk;
  uint64_t* dq_full = dq_bars<Plan>(smem);
  uint64_t* dq_empty = dq_full + 4;
  const Walk<Plan> w(p, mw);
  Ahead entry{w.at(0, p)}, rank{p.deterministic ? w.rank_at(0, p) : 0};
  for (int s = 0; s < w.n_steps; ++s) {
    const int buf = s % Plan::kdQBuffers, bh = w.head_of(s, p);
    const int i = entry.take(s, [&](int x) { return w.at(x, p); }) >> 1;
    const int r = p.deterministic ? rank.take(s, [&](int x) { return w.rank_at(x, p); }) : 0;
    for (int x = 0; x < 2; ++x) {
      const int wg = Plan::kdQBuffers == 1 ? 1 - x : x;
      mbarrier_wait(&dq_full[2 * wg + buf], (s / Plan::kdQBuffers) & 1);
      const float* sdq = reinterpret_cast<const float*>(smem + Plan::kdQ + (2 * buf + wg) * Plan::kdQTileBytes);
      float* dst;
      int* order;
      if constexpr (Plan::kDqTransposed) {  // column half wg of block i
        dst = p.dq_accum + dq_accum_index(bh, i * Br, wg * (D / 2), p.n_qblocks, Br, D);
        order = p.dq_order + (size_t(bh) * p.n_qblocks + i) * 2 + wg;
      } else {  // block 2i + wg of the pair, its whole tile
        const size_t blk = size_t(bh) * p.n_qblocks + 2 * i + wg;
        dst = p.dq_accum + blk * (kBlk * D);
        order = p.dq_order + blk * 2;
      }
      if (p.deterministic) ordered_wait(order, r);
      bulk_reduce_add_f32(dst, sdq, Plan::kdQTileBytes);
      bulk_commit();
      if (p.deterministic) {
        bulk_wait<0>();
        ordered_release(order);
      }
      if constexpr (Plan::kdQBuffers == 1) {
        bulk_wait_read<0>();  // this tile has been read by the engine: consumer wg may write the next
        mbarrier_arrive(&dq_empty[2 * wg]);
      }
    }
    if constexpr (Plan::kdQBuffers == 2) {
      bulk_wait_read<0>();  // both tiles of buffer buf have been read by the engine
      mbarrier_arrive(&dq_empty[buf]);
      mbarrier_arrive(&dq_empty[2 + buf]);
    }
  }
  bulk_wait<0>();
}

// ---------------------------------------------------------------- producer warpgroup (warps 0-3)
// Lane 0 of warp 0 issues every copy: K_j, V_j once; step s's Q_i, dO_i, LSE_i, D_i into stage
// s % 2 once the consumers have released it (the whole warp waits on the named barrier).
// One thread of warp 1 is the dQ writer.
template <class T, int D>
__device__ __forceinline__ void producer(const CUtensorMap& tm_q, const CUtensorMap& tm_k, const CUtensorMap& tm_v,
                                         const CUtensorMap& tm_do, const Fa3BwdParams& p, const MaskWalks& mw,
                                         unsigned char* smem) {
  using Plan = BwdPlan<T, D>;
  constexpr int Br = Plan::Br, kBlk = Plan::kBlk;
  if (fresh_thread_index() == 32) dq_writer<T, D>(p, mw, smem);
  if (fresh_thread_index() >= 32) return;
  const bool leader = fresh_thread_index() == 0;
  uint64_t* bar_kv = reinterpret_cast<uint64_t*>(smem + Plan::kBars);
  uint64_t* full = bar_kv + 1;
  const Walk<Plan> w(p, mw);
  if (w.n_steps == 0) return;
  if (leader) {
    mbarrier_arrive_expect_tx(bar_kv, 2 * Plan::kKVBytes);
    for (int x = 0; x < Plan::kBoxes; ++x) {
      tma_load_3d(smem + Plan::kK + x * Bc * Plan::kRowBytes, &tm_k, bar_kv, x * Plan::kBoxCols, w.col0, w.bk);
      tma_load_3d(smem + Plan::kV + x * Bc * Plan::kRowBytes, &tm_v, bar_kv, x * Plan::kBoxCols, w.col0, w.bk);
    }
  }
  RingState<kStages> ring;
  Ahead entry{w.at(0, p)};
  for (int s = 0; s < w.n_steps; ++s, ring.advance()) {
    const int st = ring.stage, bh = w.head_of(s, p), i = entry.take(s, [&](int x) { return w.at(x, p); }) >> 1;
    if (s >= kStages) named_barrier_sync(5 + st, 288);  // the consumers are done with step s - 2
    if (!leader) continue;
    mbarrier_arrive_expect_tx(&full[st], Plan::kStepBytes);
    for (int x = 0; x < Plan::kBoxes; ++x) {
      tma_load_3d(smem + Plan::kQ + st * Plan::kQBytes + x * Br * Plan::kRowBytes, &tm_q, &full[st],
                  x * Plan::kBoxCols, i * Br, bh);
      tma_load_3d(smem + Plan::kdO + st * Plan::kQBytes + x * Br * Plan::kRowBytes, &tm_do, &full[st],
                  x * Plan::kBoxCols, i * Br, bh);
    }
    const size_t row = size_t(bh) * p.n_qblocks * kBlk + size_t(i) * Br;
    bulk_load(smem + Plan::kL + st * Br * 4, p.lse2 + row, Br * 4, &full[st]);
    bulk_load(smem + Plan::kD + st * Br * 4, p.delta + row, Br * 4, &full[st]);
  }
}

// ---------------------------------------------------------------- consumer warpgroups (warps 4-11)
template <class T, int D, class Policy>
__device__ __forceinline__ void consumer(const Fa3BwdParams& p, const MaskWalks& mw, const Policy& pol, unsigned char* smem) {
  using Plan = BwdPlan<T, D>;
  constexpr int Br = Plan::Br;
  uint64_t* bar_kv = reinterpret_cast<uint64_t*>(smem + Plan::kBars);
  uint64_t* full = bar_kv + 1;
  uint64_t* dq_full = dq_bars<Plan>(smem);
  uint64_t* dq_empty = dq_full + 4;
  // wg: 0 or 1 for warpgroups 1 and 2 (keys 0-63, 64-127).
  const int tid = fresh_thread_index() - 128, wg = tid / 128, wtid = tid % 128, warp = wtid / 32, lane = tid % 32;
  const int t = lane % 4;
  const int lag = wg == 0 ? 1 : 0;  // consumer 0 multiplies step s - 1's dQ in step s
  const Walk<Plan> w(p, mw);
  const int col0 = w.col0, n_steps = w.n_steps;

  // Descriptors. K-major: the k-th K-step (16 elements = 32 bytes of every row) of a tile
  // of `rows` rows, starting at row `row0` of the tile.
  unsigned char* tiles = smem;  // re-read every step (below), so no descriptor is kept across steps
  auto kmajor = [&](int tile, int rows, int row0, int k) {
    const int byte = 32 * k;
    return desc_k_major(tiles + tile + (byte / Plan::kRowBytes) * rows * Plan::kRowBytes + row0 * Plan::kRowBytes +
                            byte % Plan::kRowBytes,
                        Plan::kRowBytes);
  };
  // MN-major: K-step kk is rows 16kk .. 16kk + 15 of the tile; columns from `col` on.
  auto mnmajor = [&](int tile, int rows, int col, int kk) {
    const int byte = 2 * col;
    return desc_mn_major(tiles + tile + (byte / Plan::kRowBytes) * rows * Plan::kRowBytes + byte % Plan::kRowBytes +
                             kk * 16 * Plan::kRowBytes,
                         rows * Plan::kRowBytes);
  };
  // dS^T as dQ^T's B operand (transposed dQ): MN-major (queries contiguous) in the 32-byte
  // swizzle, slabs of 16 queries kdSSlabBytes apart (LBO), 8-key groups 256 bytes apart (SBO);
  // K-step kk is keys 16kk .. 16kk + 15, 512 bytes into every slab. make_desc() writes the
  // 128-byte mode; the descriptor's bits 62-63 are set to 3 (32 bytes) here.
  auto ds_mn32 = [&](int tile, int kk) {
    const uint64_t d = make_desc(tiles + tile + kk * 16 * 32, Plan::kdSSlabBytes, 8 * 32, Plan::kRowBytes);
    return (d & ~(uint64_t(3) << 62)) | (uint64_t(3) << 62);
  };

  // This thread's keys (rows of S^T, dK, dV) within the block, and its queries' columns.
  const int key_local = 64 * wg + 16 * warp + lane / 4;  // and key_local + 8

  float dk[D / 2], dv[D / 2];
#pragma unroll
  for (int x = 0; x < D / 2; ++x) dk[x] = dv[x] = 0.f;

  // Step sd's dQ tile: wait for the other consumer's half of its dS^T, then multiply (issued,
  // not waited for). sd = -1 (consumer 0 in step 0, which has no earlier step) multiplies
  // buffer 1, not yet written, and the handover below drops the result: with the product or
  // its stores under a branch, ptxas spilled and serialised the loop's wgmma (b10).
  auto dq_product = [&](int sd, float (&dq)[Plan::kdQRegs]) {
    const int src_ds = Plan::kdS + ((sd + 2) % 2) * Plan::kdSBytes;
    if (sd >= 0) named_barrier_sync(1 + 2 * (1 - wg) + sd % 2, 256);  // half[other][sd % 2]
    wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < Bc / 16; ++kk) {
      if constexpr (Plan::kDqTransposed)  // dQ_i^T[half wg] = K_j^T[half wg] dS^T
        WgmmaSSMN<T, Br>::mma(dq, mnmajor(Plan::kK, Bc, wg * (D / 2), kk), ds_mn32(src_ds, kk), kk > 0);
      else  // dQ of block 2i + wg = dS[64wg.., :] K_j: slab wg of dS^T
        WgmmaSSMN<T, D>::mma(dq, mnmajor(src_ds, Bc, 64 * wg, kk), mnmajor(Plan::kK, Bc, 0, kk), kk > 0);
    }
    wgmma_commit();
  };
  // Once the product is complete: tell the other consumer (if it writes buffer sd % 2 again),
  // then the tile to shared memory in fragment order, handed to the dQ writer (warp 1).
  // sd = -1: stored into buffer (sd + kdQBuffers) % kdQBuffers, which the writer has not seen
  // yet, and not handed over.
  auto dq_handover = [&](int sd, const float (&dq)[Plan::kdQRegs]) {
    if (sd >= 0 && sd + 2 < n_steps) named_barrier_arrive(7 + 2 * wg + sd % 2, 256);  // done[wg][sd % 2]
    const int buf = (sd + Plan::kdQBuffers) % Plan::kdQBuffers;
    const uint32_t sdq = smem_u32(smem) + Plan::kdQ + (2 * buf + wg) * Plan::kdQTileBytes;  // shared address
    if constexpr (Plan::kdQBuffers == 2)
      mbarrier_wait(&dq_empty[2 * wg + buf], ((sd / 2) & 1) ^ 1);  // the writer is done with this buffer
    else if (sd >= 1)
      mbarrier_wait(&dq_empty[2 * wg], (sd - 1) & 1);  // the writer has read step sd - 1's tile
#pragma unroll
    for (int y = 0; y < Plan::kdQRegs / 2; ++y)
      sts_f32x2(sdq + (y * 128 + wtid) * 8, dq[2 * y], dq[2 * y + 1]);
    fence_proxy_async_shared();  // visible to the copy engine
    __syncwarp();
    if (lane == 0 && sd >= 0) mbarrier_arrive(&dq_full[2 * wg + buf]);
  };

  if (n_steps > 0) mbarrier_wait(bar_kv, 0);
  RingState<kStages> ring;
  for (int s = 0; s < n_steps; ++s, ring.advance()) {
    const int e = w.at(s, p);  // first used once S^T is done: its latency hides behind the product
    const int st = ring.stage, bh = w.head_of(s, p), i = e >> 1, row0 = i * Br;
    const int qt = Plan::kQ + st * Plan::kQBytes, dot = Plan::kdO + st * Plan::kQBytes;
    mbarrier_wait(&full[st], ring.phase);
    tiles = smem + fresh_zero();
    const uint32_t s32 = smem_u32(tiles);  // the 32-bit shared address of the tiles: ld.shared, st.shared, stmatrix

    // S^T = K_w Q_i^T and dP^T = V_w dO_i^T (64 keys x Br queries per warpgroup).
    float sT[Br / 2], dpT[Br / 2];
    wgmma_fence();
#pragma unroll
    for (int k = 0; k < D / 16; ++k) WgmmaSS<T, Br>::mma(sT, kmajor(Plan::kK, Bc, 64 * wg, k), kmajor(qt, Br, 0, k), k > 0);
    wgmma_commit();
    // LSE_i of this thread's queries 8c + 2t, 8c + 2t + 1 (one ld.shared.v2 each), read while S^T runs.
    float2 lse2[Br / 8];
    if constexpr (!Policy::kDscore) {
#pragma unroll
      for (int c = 0; c < Br / 8; ++c) lse2[c] = lds_f32x2(s32 + Plan::kL + (st * Br + 8 * c + 2 * t) * 4);
    }
#pragma unroll
    for (int k = 0; k < D / 16; ++k)
      WgmmaSS<T, Br>::mma(dpT, kmajor(Plan::kV, Bc, 64 * wg, k), kmajor(dot, Br, 0, k), k > 0);
    wgmma_commit();

    // P^T = 2^(S^T tau log2 e - LSE_i log2 e). Element 4c + e: key key_local + 8 (e / 2),
    // query 8c + 2t + e % 2 of Q_i. A partial step asks keep() of each element (a key past Nk
    // is masked too); a full step has no mask arithmetic.
    const bool masked = e & 1;
    const int h = bh - w.b * p.heads;  // the query head, for the policy
    auto query = [&](int x) { return row0 + 8 * (x / 4) + 2 * t + (x & 1); };
    auto key = [&](int x) { return col0 + key_local + 8 * ((x >> 1) & 1); };
    if constexpr (Policy::kDscore) {
      // P = 2^(score(tau S) log2 e - LSE log2 e) and dS = P o (dP - D) o score'(tau S) in one pass
      // once both products are done, LSE_i and D_i read from shared memory as each group needs
      // them: tau S lives only inside the pass (LAB.md: kept beside P, or with both rows' LSE and
      // D held in registers, ptxas serialised the wgmma at d = 128).
      wgmma_wait<0>();
      fence_operand(sT);
      fence_operand(dpT);
#pragma unroll
      for (int c = 0; c < Br / 8; ++c) {
        const float2 l2 = lds_f32x2(s32 + Plan::kL + (st * Br + 8 * c + 2 * t) * 4);
        const float2 dd = lds_f32x2(s32 + Plan::kD + (st * Br + 8 * c + 2 * t) * 4);
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int x = 4 * c + e;
          const float ts = sT[x] * p.scale;
          float pv = exp2_approx(fmaf(pol.score(ts, w.b, h, query(x), key(x)), float(kLog2e), (e & 1) ? -l2.y : -l2.x));
          if (masked && !(key(x) < p.nk && pol.keep(w.b, h, query(x), key(x)))) pv = 0.f;
          dpT[x] = pv * (dpT[x] - ((e & 1) ? dd.y : dd.x)) * pol.dscore(ts, w.b, h, query(x), key(x));
          sT[x] = pv;
        }
      }
    } else {
      wgmma_wait<1>();
      fence_operand(sT);
#pragma unroll
      for (int x = 0; x < Br / 2; ++x) {
        const float lse = (x & 1) ? lse2[x / 4].y : lse2[x / 4].x;
        float pv;
        if constexpr (Policy::kScore)  // ALiBi: score' = 1, so dS is the plain one below
          pv = exp2_approx(fmaf(pol.score(sT[x] * p.scale, w.b, h, query(x), key(x)), float(kLog2e), -lse));
        else
          pv = exp2_approx(fmaf(sT[x], p.scale_log2, -lse));
        if (masked && !(key(x) < p.nk && pol.keep(w.b, h, query(x), key(x)))) pv = 0.f;
        sT[x] = pv;
      }
      // dS^T = P^T o (dP^T - D_i). D_i of queries 8c + 2t, 8c + 2t + 1 read while dP^T runs.
      float2 dlt[Br / 8];
#pragma unroll
      for (int c = 0; c < Br / 8; ++c) dlt[c] = lds_f32x2(s32 + Plan::kD + (st * Br + 8 * c + 2 * t) * 4);
      wgmma_wait<0>();
      fence_operand(dpT);
#pragma unroll
      for (int c = 0; c < Br / 8; ++c) {
        const float2 dd = dlt[c];
        dpT[4 * c] = sT[4 * c] * (dpT[4 * c] - dd.x);
        dpT[4 * c + 1] = sT[4 * c + 1] * (dpT[4 * c + 1] - dd.y);
        dpT[4 * c + 2] = sT[4 * c + 2] * (dpT[4 * c + 2] - dd.x);
        dpT[4 * c + 3] = sT[4 * c + 3] * (dpT[4 * c + 3] - dd.y);
      }
    }
    uint32_t pT[Br / 4], dsT[Br / 4];
    convert_p<T>(sT, pT);
    convert_p<T>(dpT, dsT);

    // dS^T to shared memory for dQ, in slabs of kdSSwizzle / 2 queries, with stmatrix: register
    // y = 2c + h (key key_local + 8h, queries 8c + 2t, 8c + 2t + 1) is row lane / 4 of the 8x8
    // matrix (keys 8h.., queries 8c..) in stmatrix's layout, and each row of that matrix (8 queries
    // of a key) is a 16-byte chunk of the tile. Instruction it stores registers 4it .. 4it + 3:
    // matrix m = chunk 2it + m / 2, keys 8 (m % 2)..; lane l gives row l % 8 of matrix l / 8.
    const int dst_ds = Plan::kdS + (s % 2) * Plan::kdSBytes;  // this step's buffer
    if (s >= 2) named_barrier_sync(7 + 2 * (1 - wg) + s % 2, 256);  // done[other][s % 2]: its dQ of step s - 2 read it
    {
      const int key_row = 64 * wg + 16 * warp + (lane & 7) + 8 * ((lane >> 3) & 1), hi = lane >> 4;
      if constexpr (Plan::kdSSwizzle == 128) {  // chunk 2it + hi: 16-byte chunk (2it + hi) % 8 of the row in slab it / 4
        const uint32_t rowa = s32 + dst_ds + key_row * Plan::kRowBytes;
        const int m = hi ^ (lane & 7);  // the chunk's swizzle (key_row % 8 = lane % 8), hi folded in
#pragma unroll
        for (int it = 0; it < Br / 16; ++it)
          stmatrix_x4(rowa + (it / 4) * Bc * Plan::kRowBytes + ((((2 * it) & 7) ^ m) * 16), dsT[4 * it],
                      dsT[4 * it + 1], dsT[4 * it + 2], dsT[4 * it + 3]);
      } else {  // the 32-byte swizzle: chunk 2it + hi is 16-byte chunk hi of the row in slab it
        const uint32_t rowa = s32 + dst_ds + key_row * 32 + ((hi ^ ((lane >> 2) & 1)) * 16);
#pragma unroll
        for (int it = 0; it < Br / 16; ++it)
          stmatrix_x4(rowa + it * Plan::kdSSlabBytes, dsT[4 * it], dsT[4 * it + 1], dsT[4 * it + 2], dsT[4 * it + 3]);
      }
    }
    fence_proxy_async_shared();  // visible to wgmma (the async proxy)
    named_barrier_arrive(1 + 2 * wg + s % 2, 256);  // half[wg][s % 2]: this consumer's half is written

    // dV_w += P^T dO_i: K = the Br queries, issued before the meeting (it needs nothing of the other consumer's).
    fence_operand(dv);
    wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < Br / 16; ++kk) {
      const uint32_t a[4] = {pT[4 * kk], pT[4 * kk + 1], pT[4 * kk + 2], pT[4 * kk + 3]};
      WgmmaRS<T, D>::mma(dv, a, mnmajor(dot, Br, 0, kk), 1);
    }
    wgmma_commit();

    // This consumer's dQ tile of step sd = s - lag (K = the 128 keys), after meeting the other's half.
    const int sd = s - lag;
    float dq[Plan::kdQRegs];
    dq_product(sd, dq);
    wgmma_wait<1>();  // dV is done, dQ runs
    fence_operand(dv);
    fence_operand(pT);

    // dK_w += dS^T Q_i: K = the Br queries.
    fence_operand(dk);
    wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < Br / 16; ++kk) {
      const uint32_t a[4] = {dsT[4 * kk], dsT[4 * kk + 1], dsT[4 * kk + 2], dsT[4 * kk + 3]};
      WgmmaRS<T, D>::mma(dk, a, mnmajor(qt, Br, 0, kk), 1);
    }
    wgmma_commit();
    wgmma_wait<1>();  // dQ is done, dK runs: its tile goes to the writer under dK
    fence_operand(dq);
    dq_handover(sd, dq);
    wgmma_wait<0>();
    fence_operand(dk);
    fence_operand(dsT);
    named_barrier_arrive(5 + st, 288);  // Q_i, dO_i, LSE_i, D_i no longer read by this thread
  }
  if (lag && n_steps > 0) {  // consumer 0: the last step's dQ
    float dq[Plan::kdQRegs];
    dq_product(n_steps - 1, dq);
    wgmma_wait<0>();
    fence_operand(dq);
    dq_handover(n_steps - 1, dq);
  }

  // dK_j = tau sum dS^T Q and dV_j = sum P^T dO over every query head of the group.
  T* dK = static_cast<T*>(p.dk) + size_t(w.bk) * p.nk * D;
  T* dV = static_cast<T*>(p.dv) + size_t(w.bk) * p.nk * D;
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int key = col0 + key_local + 8 * h;
    if (key >= p.nk) continue;
#pragma unroll
    for (int c = 0; c < D / 8; ++c) {
      *reinterpret_cast<uint32_t*>(dK + size_t(key) * D + 8 * c + 2 * t) =
          pack2<T>(p.scale * dk[4 * c + 2 * h], p.scale * dk[4 * c + 2 * h + 1]);
      *reinterpret_cast<uint32_t*>(dV + size_t(key) * D + 8 * c + 2 * t) = pack2<T>(dv[4 * c + 2 * h], dv[4 * c + 2 * h + 1]);
    }
  }
}

template <class T, int D, class Policy>
__global__ void __launch_bounds__(kThreads, 1)
    kernel(const __grid_constant__ CUtensorMap tm_q, const __grid_constant__ CUtensorMap tm_k,
           const __grid_constant__ CUtensorMap tm_v, const __grid_constant__ CUtensorMap tm_do,
           const Fa3BwdParams p, const MaskWalks mw, const Policy pol) {
  using Plan = BwdPlan<T, D>;
  extern __shared__ __align__(Plan::kAlign) unsigned char smem_raw[];
  if (threadIdx.x == 0) {
    if constexpr (Plan::kSlack < 1024)
      if (smem_u32(smem_raw) % Plan::kAlign != 0) __trap();  // kBytes leaves 1024 - kAlign for the alignment
    uint64_t* bar_kv = reinterpret_cast<uint64_t*>(align_1024(smem_raw) + Plan::kBars);
    mbarrier_init(bar_kv, 1);
    for (int s = 0; s < kStages; ++s) mbarrier_init(&bar_kv[1 + s], 1);  // full[s] (the empty[s] slots: unused)
    for (int x = 0; x < 4; ++x) {
      mbarrier_init(&bar_kv[1 + 2 * kStages + x], 4);      // dq_full: the 4 warps of a consumer
      mbarrier_init(&bar_kv[1 + 2 * kStages + 4 + x], 1);  // dq_empty: the writer
    }
    mbarrier_init_fence();
  }
  __syncthreads();
  // The role split: every value below is computed inside its role.
  if (threadIdx.x < 128) {
    setmaxnreg_dec<24>();
    producer<T, D>(tm_q, tm_k, tm_v, tm_do, p, mw, fresh_smem(smem_raw));
  } else {
    setmaxnreg_inc<240>();
    consumer<T, D, Policy>(p, mw, pol, fresh_smem(smem_raw));
  }
}

/// The learnable sink's gradient: the sink is one more score with no value row, so
/// dLoss/dsink_h = sum_i P_sink,i (0 - D_i) = -sum_i 2^(sink_h log2 e - LSE_i log2 e) D_i over
/// every batch and query row of head h. One thread block per head, a fixed-order sum.
constexpr int kSinkThreads = 256;
template <class Policy>
__global__ void __launch_bounds__(kSinkThreads) sink_grad(const Fa3BwdParams p, const Policy pol, float* dsink) {
  const int h = blockIdx.x, rows_pad = p.n_qblocks * p.block_rows;
  const float s2 = pol.sink(h) * float(kLog2e);
  float acc = 0.f;
  for (int b = 0; b < p.batch; ++b)
    for (int r = threadIdx.x; r < p.nq; r += kSinkThreads) {
      const long long row = (long long)(b * p.heads + h) * rows_pad + r;
      acc += exp2f(s2 - p.lse2[row]) * p.delta[row];  // LSE >= sink: never above 1
    }
  __shared__ float part[kSinkThreads];
  part[threadIdx.x] = acc;
  __syncthreads();
  for (int k = kSinkThreads / 2; k > 0; k /= 2) {
    if (threadIdx.x < k) part[threadIdx.x] += part[threadIdx.x + k];
    __syncthreads();
  }
  if (threadIdx.x == 0) dsink[h] = -part[0];
}

/// The four launches of one backward: chapter 05's preprocess, this kernel, chapter 05's
/// postprocess, and the sink's gradient where the policy has one.
template <class T, int D, class Policy>
std::function<void()> prepare_policy(const HopperBwdArgs& a, const Policy& pol, cudaStream_t st) {
  using Plan = BwdPlan<T, D>;
  constexpr int Br = Plan::Br;
  const Problem& pr = a.problem;
  const Fa3BwdParams& hp = a.params;
  // The walk's blocks and the accumulator's layout are the host's to set (mask_gpu.cu), as
  // chapter 05's for its final backward; the block map must have this kernel's tiles.
  const int steps = ceil_div(pr.nq, Br);
  const bool layout = Plan::kDqTransposed ? hp.dq_transposed : !hp.dq_transposed && hp.dq_whole_tiles;
  if (hp.block_rows != Plan::kBlk || hp.n_qblocks != steps * Plan::kBlocksPerStep || !layout ||
      a.walks.tq != steps || a.walks.tk != ceil_div(pr.nk, Bc))
    throw UsageError("sm90a masked backward: at d = " + std::to_string(D) + " the host must set block_rows = " +
                     std::to_string(Plan::kBlk) + ", n_qblocks = " + std::to_string(steps * Plan::kBlocksPerStep) +
                     " and a walk of " + std::to_string(Br) + " x " + std::to_string(Bc) + " tiles");
  const CUtensorMapDataType ty = tma_type<T>();
  const uint64_t bhq = uint64_t(pr.batch) * pr.heads, bhk = uint64_t(pr.batch) * pr.kv_heads;
  const CUtensorMap tq = make_tensor_map_3d(a.q, ty, 2, D, pr.nq, bhq, Plan::kBoxCols, Br);
  const CUtensorMap tdo = make_tensor_map_3d(a.dout, ty, 2, D, pr.nq, bhq, Plan::kBoxCols, Br);
  const CUtensorMap tk = make_tensor_map_3d(a.k, ty, 2, D, pr.nk, bhk, Plan::kBoxCols, Bc);
  const CUtensorMap tv = make_tensor_map_3d(a.v, ty, 2, D, pr.nk, bhk, Plan::kBoxCols, Bc);
  static const bool configured = [] {
    CUDA_CHECK(cudaFuncSetAttribute(kernel<T, D, Policy>, cudaFuncAttributeMaxDynamicSharedMemorySize, Plan::kBytes));
    return true;
  }();
  (void)configured;
  const dim3 grid(unsigned(bhk), unsigned(ceil_div(pr.nk, Bc)));  // x fastest: the key block j the slowest
  const long long rows = (long long)pr.batch * pr.heads * hp.n_qblocks * hp.block_rows;
  const unsigned prep_blocks = unsigned((rows + kPrepThreads / (D / 8) - 1) / (kPrepThreads / (D / 8)));
  const unsigned post_blocks = unsigned(rows / hp.block_rows);
  const MaskWalks mw = a.walks;
  float* dsink = a.dsink;
  return [=] {
    preprocess<T, D><<<prep_blocks, kPrepThreads, 0, st>>>(hp);
    CUDA_CHECK_LAUNCH("sm90a masked backward: preprocess");
    kernel<T, D, Policy><<<grid, kThreads, Plan::kBytes, st>>>(tq, tk, tv, tdo, hp, mw, pol);
    CUDA_CHECK_LAUNCH("sm90a masked backward");
    postprocess<T, D><<<post_blocks, kPostThreads, 0, st>>>(hp);
    CUDA_CHECK_LAUNCH("sm90a masked backward: postprocess");
    if constexpr (Policy::kSink) {
      if (dsink) {
        sink_grad<Policy><<<hp.heads, kSinkThreads, 0, st>>>(hp, pol, dsink);
        CUDA_CHECK_LAUNCH("sm90a masked backward: sink gradient");
      }
    }
  };
}

/// Every policy but the document mask (packed rows: the sm_80 backward) at d = 64 and 128, in
/// element type T.
template <class T>
std::function<void()> prepare_element(const HopperBwdArgs& a, const MaskSpec& spec, const PolicyData& d,
                                      cudaStream_t st) {
  return visit_policy(spec, a.problem, d, [&](const auto& pol) -> std::function<void()> {
    using Policy = std::decay_t<decltype(pol)>;
    if constexpr (std::is_same_v<Policy, Document>) {
      return {};
    } else {
      return a.problem.d == 64 ? prepare_policy<T, 64>(a, pol, st) : prepare_policy<T, 128>(a, pol, st);
    }
  });
}

}  // namespace

#if !CH06_BWD_FP16
bool available() { return true; }

std::function<void()> prepare(const HopperBwdArgs& a, const MaskSpec& spec, const PolicyData& d, cudaStream_t st) {
  const Problem& prob = a.problem;
  if ((prob.d != 64 && prob.d != 128) || prob.dv != prob.d) return {};
  static_assert(BwdPlan<__nv_bfloat16, 64>::Br == step_rows(64) && BwdPlan<__nv_bfloat16, 128>::Br == step_rows(128) &&
                    Bc == kBc,
                "the walk is built for these tiles (mask_kernels.cuh: hopper_bwd::step_rows, kBc)");
  if (prob.dtype == DType::f16) return prepare_fp16(a, spec, d, st);  // masks/hopper_backward_fp16.cu
  if (prob.dtype != DType::bf16) return {};
  return prepare_element<__nv_bfloat16>(a, spec, d, st);
}
#else
// The fp16 instantiations (masks/hopper_backward_fp16.cu includes this file with CH06_BWD_FP16 set).
std::function<void()> prepare_fp16(const HopperBwdArgs& a, const MaskSpec& spec, const PolicyData& d, cudaStream_t st) {
  return prepare_element<__half>(a, spec, d, st);
}
#endif

}  // namespace attn::ch06::hopper_bwd
