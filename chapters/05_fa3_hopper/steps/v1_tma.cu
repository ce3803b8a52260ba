// Chapter 05, step 1 of 9: TMA and mbarriers.
//
//   > v1  TMA loads completing on mbarriers, a 2-stage K/V ring; mma.sync compute
//     v2  wgmma: S = Q K^T with both operands in shared memory, O += P V with P in registers
//     v3  warp specialisation: a producer warpgroup, two consumer warpgroups, setmaxnreg
//     v4  pingpong: named barriers alternate the two consumers' GEMMs
//     v5  intra-warpgroup overlap: S_j = Q K_j^T issued before softmax(S_{j-1}) is done
//     v6  causal block skipping: only the key blocks some row sees, the masked ones first
//     v7  persistent blocks: one per SM, each walking a longest-first list of tiles
//     v8  every head dim: d = 64, 128, 256, each with its key block and ring depth
//     v9  FP8 (E4M3): per-block scales, Hadamard rotation of Q and K, V transposed
//
// What changes from chapter 04's FA2 kernel: only how tiles reach shared memory.
// Chapter 04's threads each copied 16-byte pieces with cp.async and computed the
// swizzled address of every piece. Here one thread asks the copy engine (TMA) for a
// whole box, [128 rows][64 columns] of Q or [Bc rows][64 columns] of K or V, and the
// engine writes it swizzled (the 128-byte swizzle of hopper/wgmma.cuh) and reports
// the bytes to an mbarrier. The 256 threads only wait for the barrier's phase:
//
//     thread 0:       arrive_expect_tx(full_k[s], bytes); TMA K_j -> stage s   (returns at once)
//     all threads:    wait(full_k[s], phase of round j / 2)                    (until the bytes landed)
//                     ... compute on stage s ...
//                     __syncthreads(); thread 0 refills stage s with K_{j+2}, V_{j+2}
//
// The compute is FA2's: eight warps, each owning 16 query rows, mma.sync.m16n8k16
// with fragments loaded by ldmatrix from the swizzled tiles (the same XOR the copy
// engine applied, computed by swz() below).
//
// With every operand passing through registers, Bc = 128 needs more than the 255
// registers a thread may have (ptxas spills), so this step uses Bc = 64; v2's wgmma
// reads Q and K from shared memory and affords Bc = 128.
//
//     warp w (0-7) owns rows 16w..16w+15 of the Br = 128 tile:
//     S_w (16 x Bc) = Q_w K_j^T    Bc/8 n-tiles x d/16 k-steps of m16n8k16
//     O_w (16 x d) += P_w V_j      d/8 n-tiles x Bc/16 k-steps, V through ldmatrix.trans
#include "common/cuda/check.cuh"
#include "common/cuda/hopper/mbarrier.cuh"
#include "common/cuda/hopper/tma.cuh"
#include "common/cuda/smem_addr.cuh"
#include "fa3_common.cuh"
#include "step_launch.cuh"

namespace attn::ch05::v1 {
namespace {

using namespace attn::hopper;
using attn::cuda::smem_u32;

constexpr int D = 128;        // head dim of this step's kernels
constexpr int Bc = 64;        // keys per block (128 spills: S, P, O and fragments all live in registers)
constexpr int kStages = 2;    // K/V ring depth
constexpr int kThreads = 256; // eight warps of 16 rows

/// Shared-memory address of (row, byte offset in the row) inside a box of 128-byte
/// rows that TMA wrote with the 128-byte swizzle: 16-byte chunk c of row r sits at c ^ (r % 8).
__device__ __forceinline__ uint32_t swz(uint32_t box, int row, int byte) {
  return box + row * 128 + ((((byte >> 4) ^ (row & 7))) << 4) + (byte & 15);
}

/// Four 8x8 matrices of 16-bit elements; lane l gives the row address of matrix l / 8.
__device__ __forceinline__ void ldmatrix_x4(uint32_t (&r)[4], uint32_t addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(addr) : "memory");
}
/// The same, each matrix transposed (for V, whose k dimension runs down the rows).
__device__ __forceinline__ void ldmatrix_x4_trans(uint32_t (&r)[4], uint32_t addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(addr) : "memory");
}

/// c (16 x 8, fp32) += a (16 x 16) b (16 x 8): one warp-wide mma.sync.
template <class T> __device__ __forceinline__ void mma_16816(float* c, const uint32_t* a, uint32_t b0, uint32_t b1);
template <> __device__ __forceinline__ void mma_16816<__nv_bfloat16>(float* c, const uint32_t* a, uint32_t b0, uint32_t b1) {
  asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};"
               : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
               : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}
template <> __device__ __forceinline__ void mma_16816<__half>(float* c, const uint32_t* a, uint32_t b0, uint32_t b1) {
  asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};"
               : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
               : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

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

  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
  const int m_block = blockIdx.x, bh = blockIdx.y;
  const int bhk = (bh / p.heads) * p.kv_heads + (bh % p.heads) / (p.heads / p.kv_heads);
  const KvRange kv = kv_blocks(m_block, kBr, Bc, p.nq, p.nk, p.causal, /*skip=*/false);
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

  // ldmatrix addresses in the swizzled tiles; a d = 128 tile is two boxes of 64 columns.
  const uint32_t sq = smem_u32(smem + Plan::kQ);
  // Q_w, k-step kk: lane l reads row 16w + l % 16, columns 16kk + 8 (l / 16) ..
  auto q_addr = [&](int kk) {
    const int byte = 2 * (16 * kk + 8 * (lane / 16));
    return swz(sq + (byte / 128) * kBr * 128, 16 * warp + lane % 16, byte % 128);
  };
  // K_j, n-tiles 2np and 2np+1, k-step kk: lane l reads key 16np + 8 (l / 16) + l % 8, column 16kk + 8 ((l / 8) % 2).
  auto k_addr = [&](int stage, int np, int kk) {
    const int byte = 2 * (16 * kk + 8 * ((lane / 8) % 2));
    return swz(smem_u32(smem + Plan::kK + stage * Plan::kKBytes) + (byte / 128) * Bc * 128,
               16 * np + 8 * (lane / 16) + lane % 8, byte % 128);
  };
  // V_j (transposed), d n-tiles 2dp and 2dp+1, k-step kk: lane l reads key 16kk + 8 ((l / 8) % 2) + l % 8, column 16dp + 8 (l / 16).
  auto v_addr = [&](int stage, int dp, int kk) {
    const int byte = 2 * (16 * dp + 8 * (lane / 16));
    return swz(smem_u32(smem + Plan::kV + stage * Plan::kVBytes) + (byte / 128) * Bc * 128,
               16 * kk + 8 * ((lane / 8) % 2) + lane % 8, byte % 128);
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

    // S_ij = Q_i K_j^T (16 x Bc per warp)
    float s[Bc / 2];
#pragma unroll
    for (int i = 0; i < Bc / 2; ++i) s[i] = 0.f;
    mbarrier_wait(&full_k[stage], phase);
#pragma unroll
    for (int kk = 0; kk < D / 16; ++kk) {
      uint32_t qf[4];  // Q_w's k-step kk as the mma A fragment
      ldmatrix_x4(qf, q_addr(kk));
#pragma unroll
      for (int np = 0; np < Bc / 16; ++np) {
        uint32_t b[4];
        ldmatrix_x4(b, k_addr(stage, np, kk));
        mma_16816<T>(&s[8 * np], qf, b[0], b[1]);
        mma_16816<T>(&s[8 * np + 4], qf, b[2], b[3]);
      }
    }

    // P_ij = exp2(c S_ij - c m_i), O_i *= alpha (masking only where a key can be hidden)
    if (p.causal || j * Bc + Bc > p.nk) apply_mask(s, j * Bc, lane, limit);
    float alpha[2];
    softmax.update(s, p.scale_log2, alpha);
    rescale(o, alpha);
    uint32_t pr[Bc / 4];
    convert_p<T>(s, pr);

    // O_i += P_ij V_j
    mbarrier_wait(&full_v[stage], phase);
#pragma unroll
    for (int dp = 0; dp < D / 16; ++dp)
#pragma unroll
      for (int kk = 0; kk < Bc / 16; ++kk) {
        uint32_t b[4];
        ldmatrix_x4_trans(b, v_addr(stage, dp, kk));
        mma_16816<T>(&o[8 * dp], &pr[4 * kk], b[0], b[1]);
        mma_16816<T>(&o[8 * dp + 4], &pr[4 * kk], b[2], b[3]);
      }

    __syncthreads();  // every warp is done with this stage: refill it
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

}  // namespace attn::ch05::v1
