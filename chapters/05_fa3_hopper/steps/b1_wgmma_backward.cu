// Chapter 05, backward step 1: all five products of the backward on wgmma.
//
// The backward's main path: b1, b2, b5, b6, b10, b11, then final_backward.cu (the lab, steps/lab/,
// holds b3, b4, b7-b9 and b12-b17). b1 derives from chapter 04's backward.
//
// FA2's Algorithm 2, as chapter 04's backward.cu runs it, with Hopper's machinery. What
// changes from chapter 04's last backward (chapters/04_fa2/backward.cu, fa2_bwd_main):
//
//   * Two warpgroups of 4 warps (256 threads) instead of 8 independent warps: warpgroup
//     w owns keys 64w .. 64w + 63 of the block's Bc = 128, as one m64 wgmma tile.
//   * S^T = K_j Q_i^T and dP^T = V_j dO_i^T: wgmma with both operands in shared memory
//     (K-major, the forward's Q K^T form), where chapter 04 loaded ldmatrix fragments.
//   * dV_j += P^T dO_i and dK_j += dS^T Q_i: wgmma with A = P^T, dS^T straight from the
//     accumulator registers and B = dO_i, Q_i read MN-major (the forward's P V form).
//   * dQ_i = dS K_j: dS^T goes to shared memory (128-byte swizzled, as TMA would write
//     it) and wgmma reads it transposed, with K_j transposed too (WgmmaSSMN,
//     common/cuda/hopper/wgmma.cuh); each warpgroup computes half of dQ_i's columns.
//   * dQ leaves through shared memory and one cp.reduce.async.bulk .add.f32 per
//     warpgroup and step (common/cuda/hopper/bulk_copy.cuh) into an fp32 accumulator
//     laid out by tile halves (backward_tiles.hpp), instead of one fp32 atomic per
//     two elements from every thread.
//   * Q_i, dO_i arrive by TMA and LSE_i, D_i by bulk copies (padded by the preprocess,
//     so a copy never runs past the tensor), in a 2-stage ring: step s + 2 is in
//     flight while step s computes; K_j, V_j arrive once, by TMA.
//   * Deterministic mode is a flag of the same kernel: before its add into dQ_i, key
//     block j waits until blocks 0 .. j-1 have added theirs (a counter per tile half,
//     acquire/release); chapter 04 recomputed dQ in a separate kernel instead.
//
// Per thread block (key block j of KV head hk; d = 128, bf16):
//
//     shared memory                                 registers (per consumer thread)
//     K_j, V_j     128 x d   32 KB each, once       dK_j, dV_j  64 keys x d / wg: 64 + 64 fp32
//     Q_i, dO_i     64 x d   16 KB each, 2 stages   S^T, dP^T   64 keys x 64 queries: 32 + 32
//     LSE_i, D_i    64 fp32              2 stages   P^T, dS^T   the same as bf16 pairs: 16 + 16
//     dS^T    128 x 64 bf16  16 KB                  dQ_i half   64 queries x d/2: 32
//     dQ_i    64 x d fp32    32 KB (2 halves)
//
// Operands (A x B, "smem" = a descriptor, "regs" = the accumulator as A fragments):
//
//     S^T  = K_j   Q_i^T    A smem K-major, B smem K-major        m64 n64  k16 x d/16
//     dP^T = V_j   dO_i^T   A smem K-major, B smem K-major        m64 n64  k16 x d/16
//     dV  += P^T   dO_i     A regs,         B smem MN-major       m64 n(d) k16 x 4
//     dK  += dS^T  Q_i      A regs,         B smem MN-major       m64 n(d) k16 x 4
//     dQ   = dS    K_j      A smem MN-major (dS^T), B smem MN-major m64 n(d/2) k16 x 8
//
// In the recorded H100 run it reaches 402 TFLOP/s at d = 128, N = 8K (375 causal), and 305
// (172 causal) in the deterministic mode.
#include "common/cuda/check.cuh"
#include "common/errors.hpp"
#include "common/cuda/fast_math.cuh"
#include "common/cuda/hopper/bulk_copy.cuh"
#include "common/cuda/hopper/mbarrier.cuh"
#include "common/cuda/hopper/named_barrier.cuh"
#include "common/cuda/hopper/tma.cuh"
#include "common/cuda/hopper/wgmma.cuh"
#include "backward_launch.cuh"
#include "backward_tiles.hpp"
#include "fa3_common.cuh"

namespace attn::ch05::b1 {
namespace {

using namespace attn::hopper;
using attn::cuda::exp2_approx;

constexpr int Br = kBwdBr;     // queries per step
constexpr int Bc = kBwdBc;     // keys per thread block
constexpr int kStages = 2;     // Q_i, dO_i, LSE_i, D_i ring depth
constexpr int kThreads = 256;  // two warpgroups

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
  static constexpr int kdQ = kdS + Bc * Br * 2;        ///< two halves of Br x D/2 fp32
  static constexpr int kdQHalfBytes = Br * (D / 2) * 4;
  static constexpr int kL = kdQ + 2 * kdQHalfBytes;    ///< LSE_i (base 2) per stage
  static constexpr int kD = kL + kStages * Br * 4;     ///< D_i per stage
  static constexpr int kBars = kD + kStages * Br * 4;  ///< kv, full[kStages]
  static constexpr int kStepBytes = 2 * kQBytes + 2 * Br * 4;
  static constexpr int kBytes = kBars + 8 * (1 + kStages) + 1024;
  static_assert(kBwdBr * 2 == kRowBytes, "dS^T rows are one 128-byte swizzled row");
};

template <class T, int D>
__global__ void __launch_bounds__(kThreads, 1)
    kernel(const __grid_constant__ CUtensorMap tm_q, const __grid_constant__ CUtensorMap tm_k,
           const __grid_constant__ CUtensorMap tm_v, const __grid_constant__ CUtensorMap tm_do,
           const Fa3BwdParams p) {
  using Plan = BwdPlan<T, D>;
  extern __shared__ unsigned char smem_raw[];
  unsigned char* smem = align_1024(smem_raw);
  uint64_t* bar_kv = reinterpret_cast<uint64_t*>(smem + Plan::kBars);
  uint64_t* full = bar_kv + 1;
  const float* sL = reinterpret_cast<const float*>(smem + Plan::kL);
  const float* sD = reinterpret_cast<const float*>(smem + Plan::kD);

  const int tid = threadIdx.x, wg = tid / 128, wtid = tid % 128, warp = wtid / 32, lane = tid % 32;
  const int t = lane % 4;
  const int j = blockIdx.x, bk = blockIdx.y, b = bk / p.kv_heads, hk = bk % p.kv_heads;
  const int group = p.heads / p.kv_heads;
  const int col0 = j * Bc;
  const int diag = causal_diag(p.nq, p.nk);
  const int i_first = first_query_block(col0, Br, p.nq, p.nk, p.causal);
  const int steps_per_head = p.n_qblocks - i_first;
  const int n_steps = steps_per_head * group;
  auto head_of = [&](int s) { return b * p.heads + hk * group + s / steps_per_head; };

  if (tid == 0) {
    mbarrier_init(bar_kv, 1);
    for (int s = 0; s < kStages; ++s) mbarrier_init(&full[s], 1);
    mbarrier_init_fence();
  }
  __syncthreads();

  // One thread issues every copy: K_j, V_j once; step s's Q_i, dO_i, LSE_i, D_i into stage s % 2.
  auto issue = [&](int s) {
    const int st = s % kStages, bh = head_of(s), i = i_first + s % steps_per_head;
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
  };
  if (tid == 0 && n_steps > 0) {
    mbarrier_arrive_expect_tx(bar_kv, 2 * Plan::kKVBytes);
    for (int x = 0; x < Plan::kBoxes; ++x) {
      tma_load_3d(smem + Plan::kK + x * Bc * Plan::kRowBytes, &tm_k, bar_kv, x * Plan::kBoxCols, col0, bk);
      tma_load_3d(smem + Plan::kV + x * Bc * Plan::kRowBytes, &tm_v, bar_kv, x * Plan::kBoxCols, col0, bk);
    }
    for (int s = 0; s < kStages && s < n_steps; ++s) issue(s);
  }

  // Descriptors. K-major: the k-th K-step (16 elements = 32 bytes of every row) of a tile
  // of `rows` rows, starting at row `row0` of the tile.
  auto kmajor = [&](int tile, int rows, int row0, int k) {
    const int byte = 32 * k;
    return desc_k_major(smem + tile + (byte / Plan::kRowBytes) * rows * Plan::kRowBytes + row0 * Plan::kRowBytes +
                            byte % Plan::kRowBytes,
                        Plan::kRowBytes);
  };
  // MN-major: K-step kk is rows 16kk .. 16kk + 15 of the tile; columns from `col` on.
  auto mnmajor = [&](int tile, int rows, int col, int kk) {
    const int byte = 2 * col;
    return desc_mn_major(smem + tile + (byte / Plan::kRowBytes) * rows * Plan::kRowBytes + byte % Plan::kRowBytes +
                             kk * 16 * Plan::kRowBytes,
                         rows * Plan::kRowBytes);
  };

  // This thread's keys (rows of S^T, dK, dV) within the block, and its queries' columns.
  const int key_local = 64 * wg + 16 * warp + lane / 4;  // and key_local + 8

  float dk[D / 2], dv[D / 2];
#pragma unroll
  for (int x = 0; x < D / 2; ++x) dk[x] = dv[x] = 0.f;

  if (n_steps > 0) mbarrier_wait(bar_kv, 0);
  for (int s = 0; s < n_steps; ++s) {
    const int st = s % kStages, bh = head_of(s), i = i_first + s % steps_per_head, row0 = i * Br;
    const int qt = Plan::kQ + st * Plan::kQBytes, dot = Plan::kdO + st * Plan::kQBytes;
    mbarrier_wait(&full[st], (s / kStages) & 1);

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
    __syncthreads();  // both warpgroups' halves of dS^T are in shared memory

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
    __syncthreads();  // stage st, dS^T and K_j are no longer read by any wgmma
    if (tid == 0 && s + kStages < n_steps) issue(s + kStages);

    // dQ_i's half to shared memory, then one reduce-add of Br x D/2 floats into the accumulator.
    float* sdq = reinterpret_cast<float*>(smem + Plan::kdQ + wg * Plan::kdQHalfBytes);
    if (wtid == 0) bulk_wait_read<0>();  // the previous step's add has read this half
    named_barrier_sync(1 + wg, 128);
#pragma unroll
    for (int c = 0; c < D / 16; ++c)
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int r = 16 * warp + lane / 4 + 8 * h;
        *reinterpret_cast<float2*>(sdq + r * (D / 2) + 8 * c + 2 * t) = make_float2(dq[4 * c + 2 * h], dq[4 * c + 2 * h + 1]);
      }
    fence_proxy_async_shared();  // visible to the copy engine
    named_barrier_sync(1 + wg, 128);
    if (wtid == 0) {
      float* dst = p.dq_accum + dq_accum_index(bh, row0, wg * (D / 2), p.n_qblocks, Br, D);
      int* order = p.dq_order + (size_t(bh) * p.n_qblocks + i) * 2 + wg;
      if (p.deterministic) ordered_wait(order, j);
      bulk_reduce_add_f32(dst, sdq, Plan::kdQHalfBytes);
      bulk_commit();
      if (p.deterministic) {
        bulk_wait<0>();
        ordered_release(order);
      }
    }
  }
  if (wtid == 0) bulk_wait<0>();

  // dK_j = tau sum dS^T Q and dV_j = sum P^T dO over every query head of the group.
  T* dK = static_cast<T*>(p.dk) + size_t(bk) * p.nk * D;
  T* dV = static_cast<T*>(p.dv) + size_t(bk) * p.nk * D;
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
    CUDA_CHECK_LAUNCH("backward b1");
  };
  return s;
}

template <class T>
PreparedStep prepare_t(const BwdStepArgs& a) {
  switch (a.problem.d) {
    case 64: return prepare_d<T, 64>(a);
    case 128: return prepare_d<T, 128>(a);
  }
  throw UsageError("backward b1: head dim " + std::to_string(a.problem.d) + " not built (64, 128)");
}

}  // namespace

PreparedStep prepare(const BwdStepArgs& a) {
  return a.problem.dtype == DType::f16 ? prepare_t<__half>(a) : prepare_t<__nv_bfloat16>(a);
}

}  // namespace attn::ch05::b1
