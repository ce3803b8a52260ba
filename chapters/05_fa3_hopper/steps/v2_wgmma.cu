// Chapter 05, step 2 of 8: wgmma.
//
//     v1  TMA: chapter 04's last kernel with cp.async replaced by TMA copies and mbarriers
//   > v2  wgmma: S = Q K^T with both operands in shared memory, O += P V with P in registers
//     v3  warp specialisation: a producer warpgroup, two consumer warpgroups, setmaxnreg
//     v4  pingpong: named barriers alternate the two consumers' GEMMs
//     v5  intra-warpgroup overlap: S_j = Q K_j^T issued before softmax(S_{j-1}) is done
//     v6  masked blocks first: only the key blocks the causal diagonal crosses take the mask
//     v7  persistent blocks: one per SM, each walking a longest-first list of tiles
//     v8  every head dim: d = 64, 128, 256, each with its key block and ring depth
//         then final.cu and final_fp8.cu: v8 with the configurations the lab (steps/lab/)
//         measured, FP8 inputs (the lab's v9) in final_fp8.cu
//
// What changes from v1. The MMA warps become two warpgroups of four, and each
// warpgroup multiplies its 64 x 128 slice of the tile with one instruction stream:
//
//     S (64 x Bc) = Q_wg (64 x d) K_j^T      d/16 wgmma.m64n128k16, A and B read by the
//                                            tensor core from the swizzled smem tiles
//     O (64 x d) += P (64 x Bc) V_j (Bc x d)  Bc/16 wgmma.m64n128k16, A = P from registers,
//                                            B = V read N-major (the "transpose B" bit)
//
// No ldmatrix, no fragments of Q or K in registers: the descriptors say where the
// tiles are and how they are swizzled (common/cuda/hopper/wgmma.cuh). Each GEMM is
// issued, committed and waited for at once; v5 will stop waiting.
//
//     warpgroup 0 (warps 0-3)   rows  0-63   S0 = Q[0:64] K^T,   O[0:64]  += P0 V
//     warpgroup 1 (warps 4-7)   rows 64-127  S1 = Q[64:128] K^T, O[64:128] += P1 V
//
// With the operands read from shared memory, registers are no longer the limit on the
// key block: Bc = 128, and K and V get a ring of two stages each (stage j % 2), so
// that block j+1 lands while block j is computed. The accumulator layout is still
// mma.sync's (common/cuda/frag_softmax.cuh), so the softmax is the same code; each
// thread now writes its part of O straight from registers (store_o() in
// fa3_common.cuh) instead of staging the tile in shared memory as v1 did, and this
// step and the next five are built for d = 128 only (v8 brings the other head dims).
//
// Still as in v1: thread 0 issues every copy, a stage is refilled after a
// __syncthreads() that says both warpgroups are done with it, causal tiles visit only
// the key blocks some row sees (kv_blocks() in fa3_tiles.hpp), and the heaviest
// causal tiles are launched first.
//
// In the recorded H100 run it reaches 547 TFLOP/s at d = 128, N = 8K (435 causal), against
// v1's 388 (348).
#include "common/cuda/check.cuh"
#include "common/cuda/hopper/mbarrier.cuh"
#include "common/cuda/hopper/tma.cuh"
#include "common/cuda/hopper/wgmma.cuh"
#include "fa3_common.cuh"
#include "step_launch.cuh"

namespace attn::ch05::v2 {
namespace {

using namespace attn::hopper;

constexpr int D = 128;        // head dim of this step's kernels
constexpr int Bc = 128;       // keys per block
constexpr int kStages = 2;    // K/V ring depth
constexpr int kThreads = 256; // two warpgroups

template <class T>
__global__ void __launch_bounds__(kThreads, 1)
    kernel(const __grid_constant__ CUtensorMap tm_q, const __grid_constant__ CUtensorMap tm_k,
           const __grid_constant__ CUtensorMap tm_v, const Fa3Params p) {
  using Plan = SmemPlan<T, D, Bc, kStages>;
  extern __shared__ unsigned char smem_raw[];
  unsigned char* smem = align_1024(smem_raw);
  uint64_t* full_q = reinterpret_cast<uint64_t*>(smem + Plan::kBars);
  uint64_t* full_k = full_q + 2;
  uint64_t* full_v = full_k + kStages;

  const int tid = threadIdx.x, wg = tid / 128, warp = tid / 32, lane = tid % 32;
  const int m_block = p.causal ? int(gridDim.x) - 1 - int(blockIdx.x) : int(blockIdx.x);  // heaviest first
  const int bh = blockIdx.y;
  const int bhk = (bh / p.heads) * p.kv_heads + kv_head_of(bh % p.heads, p.heads, p.kv_heads);
  const KvRange kv = kv_blocks(m_block, kBr, Bc, p.nq, p.nk, p.causal);
  const int Tc = kv.n_max;

  // K_j and V_j into ring stage `stage`: d / 64 boxes of Bc rows x 128 bytes each.
  auto load_kv = [&](int j, int stage) {
    mbarrier_arrive_expect_tx(&full_k[stage], Plan::kKBytes);
    for (int b = 0; b < Plan::kBoxes; ++b)
      tma_load_3d(smem + Plan::kK + stage * Plan::kKBytes + b * Bc * Plan::kRowBytes, &tm_k, &full_k[stage],
                  b * Plan::kBoxCols, j * Bc, bhk);
    mbarrier_arrive_expect_tx(&full_v[stage], Plan::kVBytes);
    for (int b = 0; b < Plan::kBoxes; ++b)
      tma_load_3d(smem + Plan::kV + stage * Plan::kVBytes + b * Bc * Plan::kRowBytes, &tm_v, &full_v[stage],
                  b * Plan::kBoxCols, j * Bc, bhk);
  };

  if (tid == 0) {
    mbarrier_init(full_q, 1);
    for (int s = 0; s < kStages; ++s) {
      mbarrier_init(&full_k[s], 1);
      mbarrier_init(&full_v[s], 1);
    }
    mbarrier_init_fence();
  }
  __syncthreads();
  if (tid == 0) {
    mbarrier_arrive_expect_tx(full_q, Plan::kQBytes);
    for (int b = 0; b < Plan::kBoxes; ++b)
      tma_load_3d(smem + Plan::kQ + b * kBr * Plan::kRowBytes, &tm_q, full_q, b * Plan::kBoxCols, m_block * kBr, bh);
    for (int j = 0; j < kStages && j < Tc; ++j) load_kv(j, j);
  }

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
  const int limit[2] = {key_limit(row[0], p.nq, p.nk, p.causal), key_limit(row[1], p.nq, p.nk, p.causal)};

  float o[D / 2];  // O_i: 64 x d per warpgroup, fp32
#pragma unroll
  for (int i = 0; i < D / 2; ++i) o[i] = 0.f;
  RowSoftmax softmax;
  softmax.init();

  mbarrier_wait(full_q, 0);
  for (int j = 0; j < Tc; ++j) {
    const int stage = j % kStages;
    const uint32_t phase = (j / kStages) & 1;

    // S_ij = Q_i K_j^T (64 x Bc per warpgroup)
    float s[Bc / 2];
    mbarrier_wait(&full_k[stage], phase);
    wgmma_fence();
#pragma unroll
    for (int k = 0; k < D / 16; ++k) WgmmaSS<T, Bc>::mma(s, q_desc(k), k_desc(stage, k), k > 0);
    wgmma_commit();
    wgmma_wait<0>();
    fence_operand(s);

    // P_ij = exp2(c S_ij - c m_i), O_i *= alpha (masking only where a key can be hidden)
    if (p.causal || j * Bc + Bc > p.nk) apply_mask(s, j * Bc, lane, limit);
    float alpha[2];
    softmax.update(s, p.scale_log2, alpha);
    rescale(o, alpha);
    uint32_t pr[Bc / 4];
    convert_p<T>(s, pr);

    // O_i += P_ij V_j
    mbarrier_wait(&full_v[stage], phase);
    fence_operand(o);
    wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < Bc / 16; ++kk) {
      const uint32_t a[4] = {pr[4 * kk], pr[4 * kk + 1], pr[4 * kk + 2], pr[4 * kk + 3]};
      WgmmaRS<T, D>::mma(o, a, v_desc(stage, kk), 1);
    }
    wgmma_commit();
    wgmma_wait<0>();
    fence_operand(o);

    __syncthreads();  // both warpgroups are done with this stage: refill it
    if (tid == 0 && j + kStages < Tc) load_kv(j + kStages, stage);
  }

  float inv_l[2], lse[2];
  softmax.finish(p.scale_log2, inv_l, lse);
  store_o<T>(p, bh, row, lane, o, inv_l, lse);
}

template <class T>
PreparedStep prepare(const StepArgs& a) {
  using Plan = SmemPlan<T, D, Bc, kStages>;
  const Problem& pr = a.problem;
  const CUtensorMapDataType ty = tma_type<T>();
  const uint64_t bhq = uint64_t(pr.batch) * pr.heads, bhk = uint64_t(pr.batch) * pr.kv_heads;
  const CUtensorMap tq = make_tensor_map_3d(a.q, ty, 2, D, pr.nq, bhq, Plan::kBoxCols, kBr);
  const CUtensorMap tk = make_tensor_map_3d(a.k, ty, 2, D, pr.nk, bhk, Plan::kBoxCols, Bc);
  const CUtensorMap tv = make_tensor_map_3d(a.v, ty, 2, D, pr.nk, bhk, Plan::kBoxCols, Bc);
  CUDA_CHECK(cudaFuncSetAttribute(kernel<T>, cudaFuncAttributeMaxDynamicSharedMemorySize, Plan::kBytes));
  const dim3 grid(a.params.n_qtiles, unsigned(bhq));
  const Fa3Params params = a.params;
  PreparedStep s;
  s.grid = int(grid.x * grid.y);
  s.smem_bytes = Plan::kBytes;
  s.launch = [=] {
    kernel<T><<<grid, kThreads, Plan::kBytes>>>(tq, tk, tv, params);
    CUDA_CHECK_LAUNCH("kernel");
  };
  return s;
}

}  // namespace

PreparedStep prepare(const StepArgs& a) {
  return a.problem.dtype == DType::f16 ? prepare<__half>(a) : prepare<__nv_bfloat16>(a);
}

}  // namespace attn::ch05::v2
