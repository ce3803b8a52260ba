// Chapter 05, backward step 5: a dQ writer warp.
//
// The backward's main path: b1, b2, b5, b6, b10, b11, then final_backward.cu (the lab, steps/lab/,
// holds b3, b4, b7-b9 and b12-b17). b5 changes the lab's b4, which changes b3, which changes b2:
// against b2 it makes the three changes below, b3's and b4's first.
//
// What changes from b4. In b4 one consumer thread per warpgroup issues each step's
// reduce-add, and the whole warpgroup waits for it at the next step: for the copy engine to
// have read the tile (a named barrier before the tile is rewritten) and, in the
// deterministic mode, for the previous key block's add into the same tile and then for its
// own add to complete, a trip to L2 and back every step (with the causal mask b1's
// deterministic mode runs at less than half its default speed). b5 hands the tile over instead:
//
//     consumer warpgroup w, step s:  wait dq_empty[w][s % 2] -> write dQ tile (fragment order)
//                                    -> fence, __syncwarp, 4 warps arrive dq_full[w][s % 2]
//     producer warp 1, one thread:   wait dq_full[w][s % 2] -> [deterministic: wait for its turn]
//                                    -> reduce-add -> [deterministic: wait for it, pass the turn]
//                                    -> wait until the engine has read the tile -> arrive dq_empty[w][s % 2]
//
// Two tiles per warpgroup (32 KB more shared memory at d = 128: 210 KB), so the consumers
// wait only if the writer falls two steps behind. The named barriers 3 and 4 of b4 are gone.
// (ptxas: 20 bytes of local memory in the consumers at d = 128, five loads a step; none at
// d = 64.)
//
// What b4 changed from b3. K_j and V_j stay put for the whole walk, so the compiler computes
// their 24 descriptors (8 K-steps of K_j K-major for S^T, 8 of K_j MN-major for dQ, 8 of
// V_j) once, before the loop, and keeps their low words alive across it: with dK_j, dV_j
// (128 fp32) and the step's accumulators that does not fit the consumers' 240 registers,
// and ptxas spills them to local memory (b3 at d = 128: 128 bytes stored, 152 loaded,
// every load inside the loop). b4 derives the descriptors every step from a shared-memory
// base the compiler cannot see through (`smem + fresh_zero()`, roles.cuh): a few integer
// adds per wgmma, and ptxas reports no local memory at all.
//
// What b3 changed from b2. b2 writes a warpgroup's 64 x d/2 fp32 dQ tile to shared memory
// row by row. A store instruction of a warp covers 8 rows x 4 pairs of columns, and rows
// are d/2 x 4 = 256 bytes apart (d = 128): the 8 rows fall on the same banks, an 8-way
// conflict, 32 such stores per thread and step. The tile's layout does not matter to
// anyone but the postprocess, which reads each element once: so b3 keeps the registers'
// order,
//
//     float2 y (= accumulators 2y, 2y + 1) of thread w (0..127) of the warpgroup  at  (y x 128 + w) x 2,
//
// consecutive lanes at consecutive 8 bytes, and the postprocess maps (row, column) to
// that position (dq_accum_fragment_index(), backward_tiles.hpp). The reduce-add adds
// tiles element by element, so any layout that is the same for every key block works.
//
// The producer warpgroup and the ring are b2's, the products and operands b1's.
//
// In the recorded H100 run it reaches 449 TFLOP/s at d = 128, N = 8K (419 causal) against b2's
// 350 (324), and 402 (247 causal) in the deterministic mode against b2's 249 (143).
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

namespace attn::ch05::b5 {
namespace {

using namespace attn::hopper;
using attn::cuda::exp2_approx;

constexpr int Br = kBwdBr;     // queries per step
constexpr int Bc = kBwdBc;     // keys per thread block
constexpr int kStages = 2;     // Q_i, dO_i, LSE_i, D_i ring depth
constexpr int kThreads = 384;  // a producer and two consumer warpgroups
constexpr int kConsumerWarps = 8;

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
  static constexpr int kdS = kdO + kStages * kQBytes;  ///< dS^T: Bc rows of Br = 64 bf16 (128 B)
  static constexpr int kdQ = kdS + Bc * Br * 2;        ///< [buffer 2][half 2] of Br x D/2 fp32
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
    const int buf = s % 2, bh = w.head_of(s, p), i = w.i_first + s % w.steps_per_head;
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
// One thread issues every copy: K_j, V_j once; step s's Q_i, dO_i, LSE_i, D_i into stage s % 2
// once the consumers have released it. One thread of warp 1 is the dQ writer.
template <class T, int D>
__device__ __forceinline__ void producer(const CUtensorMap& tm_q, const CUtensorMap& tm_k, const CUtensorMap& tm_v,
                                         const CUtensorMap& tm_do, const Fa3BwdParams& p, unsigned char* smem) {
  using Plan = BwdPlan<T, D>;
  if (fresh_thread_index() == 32) dq_writer<T, D>(p, smem);
  if (fresh_thread_index() != 0) return;
  uint64_t* bar_kv = reinterpret_cast<uint64_t*>(smem + Plan::kBars);
  uint64_t* full = bar_kv + 1;
  uint64_t* empty = full + kStages;
  const Walk w(p);
  if (w.n_steps == 0) return;
  mbarrier_arrive_expect_tx(bar_kv, 2 * Plan::kKVBytes);
  for (int x = 0; x < Plan::kBoxes; ++x) {
    tma_load_3d(smem + Plan::kK + x * Bc * Plan::kRowBytes, &tm_k, bar_kv, x * Plan::kBoxCols, w.col0, w.bk);
    tma_load_3d(smem + Plan::kV + x * Bc * Plan::kRowBytes, &tm_v, bar_kv, x * Plan::kBoxCols, w.col0, w.bk);
  }
  RingState<kStages> ring;
  for (int s = 0; s < w.n_steps; ++s, ring.advance()) {
    const int st = ring.stage, bh = w.head_of(s, p), i = w.i_first + s % w.steps_per_head;
    mbarrier_wait(&empty[st], ring.phase ^ 1);
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
  uint64_t* empty = full + kStages;
  uint64_t* dq_full = dq_bars<Plan>(smem);
  uint64_t* dq_empty = dq_full + 4;
  const float* sL = reinterpret_cast<const float*>(smem + Plan::kL);
  const float* sD = reinterpret_cast<const float*>(smem + Plan::kD);
  // wg: 0 or 1 for warpgroups 1 and 2 (keys 0-63, 64-127).
  const int tid = fresh_thread_index() - 128, wg = tid / 128, wtid = tid % 128, warp = wtid / 32, lane = tid % 32;
  const int t = lane % 4;
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

  if (n_steps > 0) mbarrier_wait(bar_kv, 0);
  RingState<kStages> ring;
  for (int s = 0; s < n_steps; ++s, ring.advance()) {
    const int st = ring.stage, bh = w.head_of(s, p), i = w.i_first + s % w.steps_per_head, row0 = i * Br;
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
#pragma unroll
    for (int y = 0; y < Br / 4; ++y) {
      const int key = key_local + 8 * (y & 1), c = y / 2;
      *reinterpret_cast<uint32_t*>(smem + Plan::kdS + key * Plan::kRowBytes + ((c ^ (key & 7)) * 16) + 4 * t) = dsT[y];
    }
    fence_proxy_async_shared();  // visible to wgmma (the async proxy)

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
    named_barrier_sync(1, 256);  // both consumers' halves of dS^T are in shared memory

    // dQ_i[:, half wg] = dS K_j[:, half wg]: K = the 128 keys.
    float dq[D / 4];
    wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < Bc / 16; ++kk)
      WgmmaSSMN<T, D / 2>::mma(dq, mnmajor(Plan::kdS, Bc, 0, kk), mnmajor(Plan::kK, Bc, wg * (D / 2), kk), kk > 0);
    wgmma_commit();
    wgmma_wait<0>();
    fence_operand(dv);
    fence_operand(dk);
    fence_operand(dq);
    fence_operand(pT);
    fence_operand(dsT);
    fence_proxy_async_shared();  // this thread's reads of LSE_i, D_i before the copy engine's next write
    __syncwarp();                // every lane's, before lane 0's release of the stage
    if (lane == 0) mbarrier_arrive(&empty[st]);  // Q_i, dO_i, LSE_i, D_i no longer read by this warp
    named_barrier_sync(2, 256);                  // dS^T no longer read by either consumer's dQ

    // dQ_i's half to shared memory in fragment order, handed to the dQ writer (warp 1).
    const int buf = s % 2;
    float* sdq = reinterpret_cast<float*>(smem + Plan::kdQ + (2 * buf + wg) * Plan::kdQHalfBytes);
    mbarrier_wait(&dq_empty[2 * wg + buf], ((s / 2) & 1) ^ 1);  // the writer is done with this buffer
#pragma unroll
    for (int y = 0; y < D / 8; ++y)
      *reinterpret_cast<float2*>(sdq + (y * 128 + wtid) * 2) = make_float2(dq[2 * y], dq[2 * y + 1]);
    fence_proxy_async_shared();  // visible to the copy engine
    __syncwarp();
    if (lane == 0) mbarrier_arrive(&dq_full[2 * wg + buf]);
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
    for (int s = 0; s < kStages; ++s) {
      mbarrier_init(&bar_kv[1 + s], 1);                            // full[s]
      mbarrier_init(&bar_kv[1 + kStages + s], kConsumerWarps);     // empty[s]
    }
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
    CUDA_CHECK_LAUNCH("backward b5");
  };
  return s;
}

template <class T>
PreparedStep prepare_t(const BwdStepArgs& a) {
  switch (a.problem.d) {
    case 64: return prepare_d<T, 64>(a);
    case 128: return prepare_d<T, 128>(a);
  }
  throw UsageError("backward b5: head dim " + std::to_string(a.problem.d) + " not built (64, 128)");
}

}  // namespace

PreparedStep prepare(const BwdStepArgs& a) {
  return a.problem.dtype == DType::f16 ? prepare_t<__half>(a) : prepare_t<__nv_bfloat16>(a);
}

}  // namespace attn::ch05::b5
