// Chapter 05, step 3 of 8: warp specialisation.
//
//     v1  TMA: chapter 04's last kernel with cp.async replaced by TMA copies and mbarriers
//     v2  wgmma: S = Q K^T with both operands in shared memory, O += P V with P in registers
//   > v3  warp specialisation: a producer warpgroup, two consumer warpgroups, setmaxnreg
//     v4  pingpong: named barriers alternate the two consumers' GEMMs
//     v5  intra-warpgroup overlap: S_j = Q K_j^T issued before softmax(S_{j-1}) is done
//     v6  masked blocks first: only the key blocks the causal diagonal crosses take the mask
//     v7  persistent blocks: one per SM, each walking a longest-first list of tiles
//     v8  every head dim: d = 64, 128, 256, each with its key block and ring depth
//         then final.cu and final_fp8.cu: v8 with the configurations the lab (steps/lab/)
//         measured, FP8 inputs (the lab's v9) in final_fp8.cu
//
// What changes from v2. A third warpgroup joins, and it only moves data:
//
//     warpgroup 0 (producer)   one thread: wait empty[s] -> expect_tx -> TMA K_j, V_j into stage s
//     warpgroup 1 (consumer)   rows  0-63:  wait full[s] -> wgmma -> arrive empty[s]
//     warpgroup 2 (consumer)   rows 64-127: the same on its rows
//
// The __syncthreads() that recycled a stage in v2 is gone: each stage now has an
// "empty" mbarrier as well as a "full" one, and each of the 8 consumer warps arrives
// on it when its wgmma no longer reads the stage. So the producer runs ahead by up to
// kStages blocks and the consumers never wait for each other. K and V have their own
// barriers, so Q K_j^T starts before V_j has arrived and K_j is released before P V_j.
//
// Registers are re-divided between roles at run time: the producer drops to 24 per
// thread (setmaxnreg.dec) and the consumers rise to 240 (setmaxnreg.inc):
// 128 x 24 + 256 x 240 = 64,512 of the SM's 65,536.
//
// In the recorded H100 run it reaches 622 TFLOP/s at d = 128, N = 8K (511 causal), against
// v2's 547 (435).
#include "common/cuda/check.cuh"
#include "common/cuda/hopper/mbarrier.cuh"
#include "common/cuda/hopper/roles.cuh"
#include "common/cuda/hopper/setmaxnreg.cuh"
#include "common/cuda/hopper/tma.cuh"
#include "common/cuda/hopper/wgmma.cuh"
#include "fa3_common.cuh"
#include "step_launch.cuh"

namespace attn::ch05::v3 {
namespace {

using namespace attn::hopper;

constexpr int D = 128;        // head dim of this step's kernels
constexpr int Bc = 128;       // keys per block
constexpr int kStages = 2;    // K/V ring depth
constexpr int kThreads = 384; // producer + two consumer warpgroups
constexpr int kConsumerWarps = 8;

// ---------------------------------------------------------------- producer warpgroup (warps 0-3)
// One thread issues every copy: Q once, then K_j and V_j into the ring as stages free up.
template <class T>
__device__ __forceinline__ void producer(const CUtensorMap& tm_q, const CUtensorMap& tm_k, const CUtensorMap& tm_v,
                                         const Fa3Params& p, unsigned char* smem) {
  using Plan = SmemPlan<T, D, Bc, kStages>;
  const Barriers<kStages> bar(smem + Plan::kBars);
  if (fresh_thread_index() != 0) return;
  const int m_block = p.causal ? fresh_grid_size_x() - 1 - fresh_block_index_x() : fresh_block_index_x();  // heaviest first
  const int bh = fresh_block_index_y();
  const int bhk = (bh / p.heads) * p.kv_heads + kv_head_of(bh % p.heads, p.heads, p.kv_heads);
  const int Tc = kv_blocks(m_block, kBr, Bc, p.nq, p.nk, p.causal).n_max;

  mbarrier_arrive_expect_tx(bar.full_q, Plan::kQBytes);
  for (int b = 0; b < Plan::kBoxes; ++b)
    tma_load_3d(smem + Plan::kQ + b * kBr * Plan::kRowBytes, &tm_q, bar.full_q, b * Plan::kBoxCols, m_block * kBr, bh);
  RingState<kStages> ring;
  for (int j = 0; j < Tc; ++j, ring.advance()) {
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

// ---------------------------------------------------------------- consumer warpgroups (warps 4-11)
template <class T>
__device__ __forceinline__ void consumer(const Fa3Params& p, unsigned char* smem) {
  using Plan = SmemPlan<T, D, Bc, kStages>;
  const Barriers<kStages> bar(smem + Plan::kBars);
  // wg: 0 or 1 for warpgroups 1 and 2 (rows 0-63, 64-127); warp: 0-7 counted from warpgroup 1.
  const int tid = fresh_thread_index() - 128, wg = tid / 128, warp = tid / 32, lane = tid % 32;
  const int m_block = p.causal ? fresh_grid_size_x() - 1 - fresh_block_index_x() : fresh_block_index_x();  // heaviest first
  const int bh = fresh_block_index_y();
  const int Tc = kv_blocks(m_block, kBr, Bc, p.nq, p.nk, p.causal).n_max;

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

  mbarrier_wait(bar.full_q, 0);
  RingState<kStages> ring;
  for (int j = 0; j < Tc; ++j, ring.advance()) {
    // S_ij = Q_i K_j^T (64 x Bc per warpgroup)
    float s[Bc / 2];
    mbarrier_wait(&bar.full_k[ring.stage], ring.phase);
    wgmma_fence();
#pragma unroll
    for (int k = 0; k < D / 16; ++k) WgmmaSS<T, Bc>::mma(s, q_desc(k), k_desc(ring.stage, k), k > 0);
    wgmma_commit();
    wgmma_wait<0>();
    fence_operand(s);
    if (lane == 0) mbarrier_arrive(&bar.empty_k[ring.stage]);  // K_j no longer read by this warp

    // P_ij = exp2(c S_ij - c m_i), O_i *= alpha (masking only where a key can be hidden)
    if (p.causal || j * Bc + Bc > p.nk) apply_mask(s, j * Bc, lane, limit);
    float alpha[2];
    softmax.update(s, p.scale_log2, alpha);
    rescale(o, alpha);
    uint32_t pr[Bc / 4];
    convert_p<T>(s, pr);

    // O_i += P_ij V_j
    mbarrier_wait(&bar.full_v[ring.stage], ring.phase);
    fence_operand(o);
    wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < Bc / 16; ++kk) {
      const uint32_t a[4] = {pr[4 * kk], pr[4 * kk + 1], pr[4 * kk + 2], pr[4 * kk + 3]};
      WgmmaRS<T, D>::mma(o, a, v_desc(ring.stage, kk), 1);
    }
    wgmma_commit();
    wgmma_wait<0>();
    fence_operand(o);
    if (lane == 0) mbarrier_arrive(&bar.empty_v[ring.stage]);  // V_j no longer read by this warp
  }

  float inv_l[2], lse[2];
  softmax.finish(p.scale_log2, inv_l, lse);
  store_o<T>(p, bh, row, lane, o, inv_l, lse);
}

template <class T>
__global__ void __launch_bounds__(kThreads, 1)
    kernel(const __grid_constant__ CUtensorMap tm_q, const __grid_constant__ CUtensorMap tm_k,
           const __grid_constant__ CUtensorMap tm_v, const Fa3Params p) {
  using Plan = SmemPlan<T, D, Bc, kStages>;
  extern __shared__ unsigned char smem_raw[];
  if (threadIdx.x == 0) {
    const Barriers<kStages> bar(align_1024(smem_raw) + Plan::kBars);
    mbarrier_init(bar.full_q, 1);
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
    producer<T>(tm_q, tm_k, tm_v, p, fresh_smem(smem_raw));
  } else {
    setmaxnreg_inc<240>();
    consumer<T>(p, fresh_smem(smem_raw));
  }
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

}  // namespace attn::ch05::v3
