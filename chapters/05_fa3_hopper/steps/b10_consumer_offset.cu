// Chapter 05, backward step 10: consumer 0 multiplies each dQ a step late, the consumers run apart.
//
// The backward's main path: b1, b2, b5, b6, b10, b11, then final_backward.cu (the lab, steps/lab/,
// holds b3, b4, b7-b9 and b12-b17). b10 changes the lab's b9, which changes b8, which changes b6:
// against b6 it makes three changes, b8's and b9's (summarised after b10's own) first.
//
// What changes from b9. In b9 both consumers meet on named barrier 1 every step (dQ reads
// both halves of dS^T) and then run the same phases at the same time: both wait for their
// S^T and dP^T, both exponentiate and write dS^T while the tensor cores have little to do,
// both issue dV, dK and dQ at once, both store their dQ half. b10 lets consumer 0 run ahead:
// in step s it multiplies step s - 1's dQ (its dS^T is complete by then: consumer 1 wrote
// its half a while ago), and the last dQ after the loop. The two buffers of b9 are what
// make this possible: step s - 1's dS^T stays in buffer (s - 1) % 2 while step s writes the
// other. Consumer 0 then issues step s + 1's S^T and dP^T while consumer 1 still multiplies
// and stores step s's dQ, and exponentiates while consumer 1 multiplies: their phases
// interleave as in the forward's pingpong (v4), with no turn-taking barrier. Nothing
// else moves: the registers are b9's (the late dQ is computed and stored in the same
// step), the dQ writer, the stage ring and the walk are unchanged.
//
// The meeting becomes four one-way signals on named barriers of 256 threads, one side
// arriving (bar.arrive, no wait) and the other waiting (bar.sync), each with one barrier
// per dS^T buffer so that a signal of step s + 2 can never complete step s's:
//
//     half[w][b]  (ids 1-4)   consumer w has written its half of dS^T into buffer b;
//                             the other consumer waits before its dQ product of that step
//     done[w][b]  (ids 7-10)  consumer w's dQ product has finished reading buffer b;
//                             the other consumer waits before it writes buffer b again
//                             (two steps later), only where such a step exists
//
// (ids 5 and 6 still release the stages, as in b8.) A consumer's own half needs no signal:
// its 128 threads are among the barrier's 256, so every one of them has written its part
// (and fenced it for the async proxy) before the barrier completes.
//
// Consumer 0 has no earlier step in step 0: it multiplies anyway (dS^T buffer 1, not yet
// written), stores the result into its dQ buffer 1 (which the writer has not seen) and hands
// nothing over. With the product or its stores under an `if`, ptxas kept the accumulators
// of both paths: 584 bytes of spills and the loop's wgmma serialised. Unconditional, the
// kernel has b9's registers and no local memory; the extra product is one of the ~65 a
// block computes at N = 8K.
//
// What b9 changed from b8. The consumers meet twice a step: on named barrier 1 once both
// halves of dS^T are written (dQ reads all 128 keys), and on named barrier 2 once both dQ
// products are done with them (the next step overwrites dS^T). With two buffers (16 KB more:
// 226 KB of 227 at d = 128) step s writes buffer s % 2, and the second meeting is not
// needed: a consumer rewrites buffer b at step s + 2 only after passing barrier 1 of step
// s + 1, which the other consumer reaches only after its dQ product of step s (the one
// reading buffer b) has completed. One meeting a step is left.
//
// What b8 changed from b6 (b8 is a branch: b7 split dQ by keys, b8 keeps b6's dQ). Since b2 a
// stage of the ring is released through an "empty" mbarrier: each consumer warp arrives,
// the producer waits, then its copy engine overwrites the stage. The consumers' last
// reads of a stage are ordinary loads of LSE_i and D_i (the products read it through
// wgmma), and racecheck, which follows __syncthreads() and named barriers, does not take
// the mbarrier's arrive and wait as an order between those loads and the bulk copy that
// follows, so it flags the LSE/D stage from b2 to b6 (not b1, which releases with
// __syncthreads()). b8 releases a stage with a named barrier per stage (ids 5, 6) of 288
// threads: the 256 consumer threads arrive (bar.arrive, no wait) once they are done with it,
// and the producer's warp, all 32 lanes now, waits on it (bar.sync) before lane 0 refills
// the stage, from the third step on. The full side stays
// an mbarrier (the copy engine must complete it), and so do the dQ tiles'.
//
// In the recorded H100 run it reaches 461 TFLOP/s at d = 128, N = 8K (432 causal), against
// b9's 461 (428) and b6's 451 (415).
#include "common/cuda/check.cuh"
#include "common/errors.hpp"
#include "common/cuda/fast_math.cuh"
#include "common/cuda/hopper/bulk_copy.cuh"
#include "common/cuda/hopper/mbarrier.cuh"
#include "common/cuda/hopper/named_barrier.cuh"
#include "common/cuda/hopper/roles.cuh"
#include "common/cuda/hopper/setmaxnreg.cuh"
#include "common/cuda/hopper/tma.cuh"
#include "common/cuda/hopper/wgmma.cuh"
#include "backward_launch.cuh"
#include "backward_tiles.hpp"
#include "fa3_common.cuh"

namespace attn::ch05::b10 {
namespace {

using namespace attn::hopper;
using attn::cuda::exp2_approx;

constexpr int Br = kBwdBr;     // queries per step
constexpr int Bc = kBwdBc;     // keys per thread block
constexpr int kStages = 2;     // Q_i, dO_i, LSE_i, D_i ring depth
constexpr int kThreads = 384;  // a producer and two consumer warpgroups

/// Shared memory, every tile 1024-aligned, tiles as TMA boxes of 128-byte rows.
template <class T, int D>
struct BwdPlan {
  static constexpr int kRowBytes = 128, kBoxCols = 64, kBoxes = D / kBoxCols;
  static constexpr int kKVBytes = Bc * D * 2;  ///< K_j or V_j
  static constexpr int kQBytes = Br * D * 2;   ///< one stage of Q_i or dO_i
  static constexpr int kK = 0;
  static constexpr int kV = kK + kKVBytes;
  static constexpr int kQ = kV + kKVBytes;
  static constexpr int kdO = kQ + kStages * kQBytes;
  static constexpr int kdS = kdO + kStages * kQBytes;  ///< dS^T [buffer 2]: Bc rows of Br = 64 bf16 (128 B)
  static constexpr int kdSBytes = Bc * Br * 2;
  static constexpr int kdQ = kdS + 2 * kdSBytes;       ///< [buffer 2][half 2] of Br x D/2 fp32
  static constexpr int kdQHalfBytes = Br * (D / 2) * 4;
  static constexpr int kL = kdQ + 4 * kdQHalfBytes;    ///< LSE_i (base 2) per stage
  static constexpr int kD = kL + kStages * Br * 4;     ///< D_i per stage
  static constexpr int kBars = kD + kStages * Br * 4;  ///< kv, full[kStages], empty[kStages], dq_full[4], dq_empty[4]
  static constexpr int kStepBytes = 2 * kQBytes + 2 * Br * 4;
  static constexpr int kBytes = kBars + 8 * (1 + 2 * kStages + 8) + 1024;
  static_assert(kBwdBr * 2 == kRowBytes, "dS^T rows are one 128-byte swizzled row");
};

/// The walk of one thread block, as every role computes it for itself after the split.
struct Walk {
  int j, bk, b, hk, group, col0, i_first, steps_per_head, n_steps;
  __device__ __forceinline__ explicit Walk(const Fa3BwdParams& p) {
    j = fresh_block_index_x();
    bk = fresh_block_index_y();
    b = bk / p.kv_heads;
    hk = bk % p.kv_heads;
    group = p.heads / p.kv_heads;
    col0 = j * Bc;
    i_first = first_query_block(col0, Br, p.nq, p.nk, p.causal);
    steps_per_head = p.n_qblocks - i_first;
    n_steps = steps_per_head * group;
  }
  /// The query block of step s: ascending from i_first, or (deterministic) descending from the last.
  __device__ __forceinline__ int block_of(int s, const Fa3BwdParams& p) const {
    const int k = s % steps_per_head;
    return p.deterministic ? p.n_qblocks - 1 - k : i_first + k;
  }
  __device__ __forceinline__ int head_of(int s, const Fa3BwdParams& p) const {
    return b * p.heads + hk * group + s / steps_per_head;
  }
};

/// The dQ tiles' barriers after the ring's: dq_full[2 w + b], dq_empty[2 w + b] for warpgroup w, buffer b.
template <class Plan>
__device__ __forceinline__ uint64_t* dq_bars(unsigned char* smem) {
  return reinterpret_cast<uint64_t*>(smem + Plan::kBars) + 1 + 2 * kStages;
}

// ---------------------------------------------------------------- dQ writer (warp 1, one thread)
// Step s's two tile halves, as the consumers hand them over, into dQ's accumulator.
template <class T, int D>
__device__ __forceinline__ void dq_writer(const Fa3BwdParams& p, unsigned char* smem) {
  using Plan = BwdPlan<T, D>;
  uint64_t* dq_full = dq_bars<Plan>(smem);
  uint64_t* dq_empty = dq_full + 4;
  const Walk w(p);
  for (int s = 0; s < w.n_steps; ++s) {
    const int buf = s % 2, bh = w.head_of(s, p), i = w.block_of(s, p);
    for (int wg = 0; wg < 2; ++wg) {
      mbarrier_wait(&dq_full[2 * wg + buf], (s / 2) & 1);
      const float* sdq = reinterpret_cast<const float*>(smem + Plan::kdQ + (2 * buf + wg) * Plan::kdQHalfBytes);
      float* dst = p.dq_accum + dq_accum_index(bh, i * Br, wg * (D / 2), p.n_qblocks, Br, D);
      int* order = p.dq_order + (size_t(bh) * p.n_qblocks + i) * 2 + wg;
      if (p.deterministic) ordered_wait(order, w.j);
      bulk_reduce_add_f32(dst, sdq, Plan::kdQHalfBytes);
      bulk_commit();
      if (p.deterministic) {
        bulk_wait<0>();
        ordered_release(order);
      }
    }
    bulk_wait_read<0>();  // both halves of buffer buf have been read by the engine
    mbarrier_arrive(&dq_empty[buf]);
    mbarrier_arrive(&dq_empty[2 + buf]);
  }
  bulk_wait<0>();
}

// ---------------------------------------------------------------- producer warpgroup (warps 0-3)
// Lane 0 of warp 0 issues every copy: K_j, V_j once; step s's Q_i, dO_i, LSE_i, D_i into stage
// s % 2 once the consumers have released it (the whole warp waits on the named barrier).
// One thread of warp 1 is the dQ writer.
template <class T, int D>
__device__ __forceinline__ void producer(const CUtensorMap& tm_q, const CUtensorMap& tm_k, const CUtensorMap& tm_v,
                                         const CUtensorMap& tm_do, const Fa3BwdParams& p, unsigned char* smem) {
  using Plan = BwdPlan<T, D>;
  if (fresh_thread_index() == 32) dq_writer<T, D>(p, smem);
  if (fresh_thread_index() >= 32) return;
  const bool leader = fresh_thread_index() == 0;
  uint64_t* bar_kv = reinterpret_cast<uint64_t*>(smem + Plan::kBars);
  uint64_t* full = bar_kv + 1;
  const Walk w(p);
  if (w.n_steps == 0) return;
  if (leader) {
    mbarrier_arrive_expect_tx(bar_kv, 2 * Plan::kKVBytes);
    for (int x = 0; x < Plan::kBoxes; ++x) {
      tma_load_3d(smem + Plan::kK + x * Bc * Plan::kRowBytes, &tm_k, bar_kv, x * Plan::kBoxCols, w.col0, w.bk);
      tma_load_3d(smem + Plan::kV + x * Bc * Plan::kRowBytes, &tm_v, bar_kv, x * Plan::kBoxCols, w.col0, w.bk);
    }
  }
  RingState<kStages> ring;
  for (int s = 0; s < w.n_steps; ++s, ring.advance()) {
    const int st = ring.stage, bh = w.head_of(s, p), i = w.block_of(s, p);
    if (s >= kStages) named_barrier_sync(5 + st, 288);  // the consumers are done with step s - 2
    if (!leader) continue;
    mbarrier_arrive_expect_tx(&full[st], Plan::kStepBytes);
    for (int x = 0; x < Plan::kBoxes; ++x) {
      tma_load_3d(smem + Plan::kQ + st * Plan::kQBytes + x * Br * Plan::kRowBytes, &tm_q, &full[st],
                  x * Plan::kBoxCols, i * Br, bh);
      tma_load_3d(smem + Plan::kdO + st * Plan::kQBytes + x * Br * Plan::kRowBytes, &tm_do, &full[st],
                  x * Plan::kBoxCols, i * Br, bh);
    }
    const size_t row = size_t(bh) * p.n_qblocks * Br + size_t(i) * Br;
    bulk_load(smem + Plan::kL + st * Br * 4, p.lse2 + row, Br * 4, &full[st]);
    bulk_load(smem + Plan::kD + st * Br * 4, p.delta + row, Br * 4, &full[st]);
  }
}

// ---------------------------------------------------------------- consumer warpgroups (warps 4-11)
template <class T, int D>
__device__ __forceinline__ void consumer(const Fa3BwdParams& p, unsigned char* smem) {
  using Plan = BwdPlan<T, D>;
  uint64_t* bar_kv = reinterpret_cast<uint64_t*>(smem + Plan::kBars);
  uint64_t* full = bar_kv + 1;
  uint64_t* dq_full = dq_bars<Plan>(smem);
  uint64_t* dq_empty = dq_full + 4;
  const float* sL = reinterpret_cast<const float*>(smem + Plan::kL);
  const float* sD = reinterpret_cast<const float*>(smem + Plan::kD);
  // wg: 0 or 1 for warpgroups 1 and 2 (keys 0-63, 64-127).
  const int tid = fresh_thread_index() - 128, wg = tid / 128, wtid = tid % 128, warp = wtid / 32, lane = tid % 32;
  const int t = lane % 4;
  const int lag = wg == 0 ? 1 : 0;  // consumer 0 multiplies step s - 1's dQ in step s
  const Walk w(p);
  const int col0 = w.col0, n_steps = w.n_steps;
  const int diag = causal_diag(p.nq, p.nk);

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

  // This thread's keys (rows of S^T, dK, dV) within the block, and its queries' columns.
  const int key_local = 64 * wg + 16 * warp + lane / 4;  // and key_local + 8

  float dk[D / 2], dv[D / 2];
#pragma unroll
  for (int x = 0; x < D / 2; ++x) dk[x] = dv[x] = 0.f;

  // Step sd's dQ half: wait for the other consumer's half of its dS^T, then multiply (issued,
  // not waited for). sd = -1 (consumer 0 in step 0, which has no earlier step) multiplies
  // buffer 1, not yet written, and the handover below drops the result: with the product
  // or its stores under a branch, ptxas spilled 584 bytes and serialised the loop's wgmma.
  auto dq_product = [&](int sd, float (&dq)[D / 4]) {
    const int src_ds = Plan::kdS + ((sd + 2) % 2) * Plan::kdSBytes;
    if (sd >= 0) named_barrier_sync(1 + 2 * (1 - wg) + sd % 2, 256);  // half[other][sd % 2]
    wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < Bc / 16; ++kk)
      WgmmaSSMN<T, D / 2>::mma(dq, mnmajor(src_ds, Bc, 0, kk), mnmajor(Plan::kK, Bc, wg * (D / 2), kk), kk > 0);
    wgmma_commit();
  };
  // Once the product is complete: tell the other consumer (if it writes buffer sd % 2 again),
  // then dQ_i's half to shared memory in fragment order, handed to the dQ writer (warp 1).
  // sd = -1: stored into dQ buffer 1, which the writer has not seen yet, and not handed over.
  auto dq_handover = [&](int sd, const float (&dq)[D / 4]) {
    if (sd >= 0 && sd + 2 < n_steps) named_barrier_arrive(7 + 2 * wg + sd % 2, 256);  // done[wg][sd % 2]
    const int buf = (sd + 2) % 2;
    float* sdq = reinterpret_cast<float*>(smem + Plan::kdQ + (2 * buf + wg) * Plan::kdQHalfBytes);
    mbarrier_wait(&dq_empty[2 * wg + buf], ((sd / 2) & 1) ^ 1);  // the writer is done with this buffer
#pragma unroll
    for (int y = 0; y < D / 8; ++y)
      *reinterpret_cast<float2*>(sdq + (y * 128 + wtid) * 2) = make_float2(dq[2 * y], dq[2 * y + 1]);
    fence_proxy_async_shared();  // visible to the copy engine
    __syncwarp();
    if (lane == 0 && sd >= 0) mbarrier_arrive(&dq_full[2 * wg + buf]);
  };

  if (n_steps > 0) mbarrier_wait(bar_kv, 0);
  RingState<kStages> ring;
  for (int s = 0; s < n_steps; ++s, ring.advance()) {
    const int st = ring.stage, bh = w.head_of(s, p), i = w.block_of(s, p), row0 = i * Br;
    const int qt = Plan::kQ + st * Plan::kQBytes, dot = Plan::kdO + st * Plan::kQBytes;
    mbarrier_wait(&full[st], ring.phase);
    tiles = smem + fresh_zero();

    // S^T = K_w Q_i^T and dP^T = V_w dO_i^T (64 keys x 64 queries per warpgroup).
    float sT[Br / 2], dpT[Br / 2];
    wgmma_fence();
#pragma unroll
    for (int k = 0; k < D / 16; ++k) WgmmaSS<T, Br>::mma(sT, kmajor(Plan::kK, Bc, 64 * wg, k), kmajor(qt, Br, 0, k), k > 0);
    wgmma_commit();
#pragma unroll
    for (int k = 0; k < D / 16; ++k)
      WgmmaSS<T, Br>::mma(dpT, kmajor(Plan::kV, Bc, 64 * wg, k), kmajor(dot, Br, 0, k), k > 0);
    wgmma_commit();

    // P^T = 2^(S^T tau log2 e - LSE_i log2 e). Element 4c + e: key key_local + 8 (e / 2),
    // query 8c + 2t + e % 2 of Q_i.
    wgmma_wait<1>();
    fence_operand(sT);
    const float* lse2 = sL + st * Br;
    const float* dlt = sD + st * Br;
    const bool masked = bwd_tile_masked(row0, col0, Br, Bc, p.nq, p.nk, p.causal);
#pragma unroll
    for (int x = 0; x < Br / 2; ++x) {
      const int q = 8 * (x / 4) + 2 * t + (x & 1);
      float pv = exp2_approx(fmaf(sT[x], p.scale_log2, -lse2[q]));
      if (masked) {
        const int key = col0 + key_local + 8 * ((x >> 1) & 1);
        if (key >= p.nk || (p.causal && key > row0 + q + diag)) pv = 0.f;
      }
      sT[x] = pv;
    }
    // dS^T = P^T o (dP^T - D_i)
    wgmma_wait<0>();
    fence_operand(dpT);
#pragma unroll
    for (int x = 0; x < Br / 2; ++x) dpT[x] = sT[x] * (dpT[x] - dlt[8 * (x / 4) + 2 * t + (x & 1)]);
    uint32_t pT[Br / 4], dsT[Br / 4];
    convert_p<T>(sT, pT);
    convert_p<T>(dpT, dsT);

    // dS^T to shared memory for dQ, in the 128-byte swizzle: pair y = 2c + h is key
    // key_local + 8h, queries 8c + 2t, 8c + 2t + 1 (chunk c of the row).
    const int dst_ds = Plan::kdS + (s % 2) * Plan::kdSBytes;  // this step's buffer
    if (s >= 2) named_barrier_sync(7 + 2 * (1 - wg) + s % 2, 256);  // done[other][s % 2]: its dQ of step s - 2 read it
#pragma unroll
    for (int y = 0; y < Br / 4; ++y) {
      const int key = key_local + 8 * (y & 1), c = y / 2;
      *reinterpret_cast<uint32_t*>(smem + dst_ds + key * Plan::kRowBytes + ((c ^ (key & 7)) * 16) + 4 * t) = dsT[y];
    }
    fence_proxy_async_shared();  // visible to wgmma (the async proxy)
    named_barrier_arrive(1 + 2 * wg + s % 2, 256);  // half[wg][s % 2]: this consumer's half is written

    // dV_w += P^T dO_i and dK_w += dS^T Q_i: K = the 64 queries.
    fence_operand(dv);
    fence_operand(dk);
    wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < Br / 16; ++kk) {
      const uint32_t a[4] = {pT[4 * kk], pT[4 * kk + 1], pT[4 * kk + 2], pT[4 * kk + 3]};
      WgmmaRS<T, D>::mma(dv, a, mnmajor(dot, Br, 0, kk), 1);
    }
#pragma unroll
    for (int kk = 0; kk < Br / 16; ++kk) {
      const uint32_t a[4] = {dsT[4 * kk], dsT[4 * kk + 1], dsT[4 * kk + 2], dsT[4 * kk + 3]};
      WgmmaRS<T, D>::mma(dk, a, mnmajor(qt, Br, 0, kk), 1);
    }
    wgmma_commit();

    // dQ_i[:, half wg] = dS K_j[:, half wg] of step sd = s - lag: K = the 128 keys.
    const int sd = s - lag;
    float dq[D / 4];
    dq_product(sd, dq);
    wgmma_wait<0>();
    fence_operand(dv);
    fence_operand(dk);
    fence_operand(dq);
    fence_operand(pT);
    fence_operand(dsT);
    named_barrier_arrive(5 + st, 288);  // Q_i, dO_i, LSE_i, D_i no longer read by this thread
    dq_handover(sd, dq);
  }
  if (lag && n_steps > 0) {  // consumer 0: the last step's dQ
    float dq[D / 4];
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

template <class T, int D>
__global__ void __launch_bounds__(kThreads, 1)
    kernel(const __grid_constant__ CUtensorMap tm_q, const __grid_constant__ CUtensorMap tm_k,
           const __grid_constant__ CUtensorMap tm_v, const __grid_constant__ CUtensorMap tm_do,
           const Fa3BwdParams p) {
  using Plan = BwdPlan<T, D>;
  extern __shared__ unsigned char smem_raw[];
  if (threadIdx.x == 0) {
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
    producer<T, D>(tm_q, tm_k, tm_v, tm_do, p, fresh_smem(smem_raw));
  } else {
    setmaxnreg_inc<240>();
    consumer<T, D>(p, fresh_smem(smem_raw));
  }
}

template <class T, int D>
PreparedStep prepare_d(const BwdStepArgs& a) {
  using Plan = BwdPlan<T, D>;
  const Problem& pr = a.problem;
  const CUtensorMapDataType ty = tma_type<T>();
  const uint64_t bhq = uint64_t(pr.batch) * pr.heads, bhk = uint64_t(pr.batch) * pr.kv_heads;
  const CUtensorMap tq = make_tensor_map_3d(a.q, ty, 2, D, pr.nq, bhq, Plan::kBoxCols, Br);
  const CUtensorMap tdo = make_tensor_map_3d(a.dout, ty, 2, D, pr.nq, bhq, Plan::kBoxCols, Br);
  const CUtensorMap tk = make_tensor_map_3d(a.k, ty, 2, D, pr.nk, bhk, Plan::kBoxCols, Bc);
  const CUtensorMap tv = make_tensor_map_3d(a.v, ty, 2, D, pr.nk, bhk, Plan::kBoxCols, Bc);
  CUDA_CHECK(cudaFuncSetAttribute(kernel<T, D>, cudaFuncAttributeMaxDynamicSharedMemorySize, Plan::kBytes));
  const dim3 grid(ceil_div(pr.nk, Bc), unsigned(bhk));
  const Fa3BwdParams params = a.params;
  PreparedStep s;
  s.grid = int(grid.x * grid.y);
  s.smem_bytes = Plan::kBytes;
  s.launch = [=] {
    kernel<T, D><<<grid, kThreads, Plan::kBytes>>>(tq, tk, tv, tdo, params);
    CUDA_CHECK_LAUNCH("backward b10");
  };
  return s;
}

template <class T>
PreparedStep prepare_t(const BwdStepArgs& a) {
  switch (a.problem.d) {
    case 64: return prepare_d<T, 64>(a);
    case 128: return prepare_d<T, 128>(a);
  }
  throw UsageError("backward b10: head dim " + std::to_string(a.problem.d) + " not built (64, 128)");
}

}  // namespace

PreparedStep prepare(const BwdStepArgs& a) {
  return a.problem.dtype == DType::f16 ? prepare_t<__half>(a) : prepare_t<__nv_bfloat16>(a);
}

}  // namespace attn::ch05::b10
