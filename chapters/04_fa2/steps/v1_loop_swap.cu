// Chapter 04 - FlashAttention-2 forward, built in steps (the main path; the lab's
// experiments are in lab/, LAB.md). Each file is a whole kernel; `diff` two
// neighbours to see one move (the first against chapter 03's fa1.cu).
//
//   ../../03_fa1/fa1.cu        chapter 03: K/V outer, Q inner, (m, l, O) through HBM
// > v1_loop_swap.cu            Q outer, K/V inner, grid (Nq/Br, B*H): (m, l, O) stay on chip
//   v2_mma.cu                  tensor cores: mma.sync m16n8k16, Q split over 4 warps, P in registers
//   v3_ldmatrix_swizzle.cu     ldmatrix fragments from XOR-swizzled shared memory: no bank conflicts
//   v4_cp_async.cu             cp.async: K_{j+1} and V_j stream in while the other product runs
//   v5_heaviest_first.cu       causal: the query blocks with the most keys start first
//   v6_two_tiles_per_warp.cu   each warp owns 2 x 16 query rows (Br = 128): a K/V fragment feeds 2 mmas
//   final.cu                   one configuration table per head dim, fp16 too (the final kernel)
//
// This step: FlashAttention-1's loops, swapped; everything else is chapter 03's
// kernel as it was (fa1.cu: the 16 x 16 thread layout, fp32 tiles in shared memory,
// exponentials in base 2 with log2(e) folded into the scale, causal block skipping
// by last_visit). Chapter 03 walked K/V blocks in the outer loop and, for each,
// every Q block, reading and writing (m, l, O) in HBM on every step. Here a thread
// block owns one Q block for its whole life and walks the K/V blocks it can see:
//
//   - the grid covers the query blocks: grid = (ceil(Nq / Br), B * Hq), thousands of
//     blocks where FA1 had B * H (the loop over i stays, as a grid-stride loop that
//     runs once, so that the body keeps its shape);
//   - Q_i is staged once, before the K/V loop, instead of once per K/V block;
//   - (m_i, l_i) stay in shared memory and O_i in registers across the K/V loop: the
//     HBM scratch O_acc, m, l of chapter 03 is gone, and O and the LSE are written
//     once, on the last K/V block;
//   - the kernel takes chapter 04's FwdParams and its launcher has chapter 04's
//     interface (`launch` below): bf16 at d = 64 and 128, like steps 2-8.
//
// Per step (i, j), with B_r x B_c = 64 x 64 (d = 128) as the example:
//
//   K_j, V_j  (Bc x d, fp32)  staged once per j ---------------------.
//   Q_i       (Br x d, fp32)  staged once per i                        |  shared
//   S_ij      (Br x Bc, fp32) = tau log2(e) Q_i K_j^T, then P~_ij     |  memory
//   m_i, l_i, and the two rescale factors per row  -----------------'
//   O_i       (Br x d, fp32)  registers, for every j: P~_ij V_j combined with O_i
//
//   thread (tx, ty) = (tid % 16, tid / 16) owns, in S_ij and in O_i,
//
//            col tx    tx+16    tx+32 ...
//   row ty    [x]      [x]      [x]
//   row ty+16 [x]      [x]      [x]        4 rows x (Bc/16 or d/16) columns
//   row ty+32 [x]      [x]      [x]        (strided, so a warp's 32 lanes touch
//   row ty+48 [x]      [x]      [x]         2 rows x 16 consecutive columns)
//
//   and warp w computes the row statistics of rows w, w+8, w+16, ...
//
// Arithmetic: plain fp32 FMA on CUDA cores, exponentials in base 2 (exp2f, with
// log2 e folded into the softmax scale). Tensor cores are the next step.
#include "chapters/03_fa1/fa1_blocks.hpp"  // chapter 03's block sizes and last_visit, reused as they are
#include "chapters/03_fa1/fa1_tiles.cuh"   // chapter 03's thread layout, tile staging, warp reductions
#include "common/cuda/check.cuh"
#include "common/cuda/index.cuh"
#include "common/cuda/types.cuh"
#include "common/online_softmax.hpp"
#include "fa2_kernels.cuh"

namespace attn::ch04::v1 {
namespace {
// Chapter 03's pieces, by name (a using-directive would also bring in its own ceil_div):
using ch03::Blocks;
using ch03::kernel_forward_blocks;
using ch03::kThreads;
using ch03::kWarps;
using ch03::last_visit;
using ch03::score_ld;
using ch03::stage_rows;
using ch03::tile_ld;
using ch03::warp_max;
using ch03::warp_sum;

/// Shared memory of one block (dynamic: above the 48 KB static limit).
template <int D, int Br, int Bc>
struct ForwardSmem {
  float K[Bc * tile_ld<D>()];   // K_j   (Bc x d)
  float V[Bc * tile_ld<D>()];   // V_j   (Bc x d)
  float Q[Br * tile_ld<D>()];   // Q_i   (Br x d)
  float S[Br * score_ld<Bc>()];  // S_ij, then P~_ij (Br x Bc)
  float m[Br], l[Br];           // m_i, l_i of the step (base 2)
  float scale_old[Br];          // l_i e^{m_i - m_new} / l_new
  float scale_new[Br];          //     e^{m~ - m_new} / l_new
};

template <class T, int D>
__global__ void __launch_bounds__(kThreads, 1) fwd_kernel(const FwdParams a) {
  constexpr Blocks kB = kernel_forward_blocks(D);
  constexpr int Br = kB.Br, Bc = kB.Bc;
  constexpr int RA = Br / 16, CS = Bc / 16, CO = D / 16;  // rows per thread; columns per thread in S_ij, O_i
  constexpr int kLd = tile_ld<D>(), sLd = score_ld<Bc>();
  static_assert(Br % 16 == 0 && Bc % 32 == 0 && D % 16 == 0, "the thread layout needs these multiples");
  extern __shared__ float4 smem_raw[];
  ForwardSmem<D, Br, Bc>& sm = *reinterpret_cast<ForwardSmem<D, Br, Bc>*>(smem_raw);

  const int bh = blockIdx.y, b = bh / a.heads, h = bh % a.heads;
  const int hk = cuda::kv_head_of(h, a.heads, a.kv_heads);
  const std::size_t kv_head = std::size_t(b) * a.kv_heads + hk;
  const T* __restrict__ Q = static_cast<const T*>(a.q) + std::size_t(bh) * a.nq * D;
  const T* __restrict__ K = static_cast<const T*>(a.k) + kv_head * a.nk * D;
  const T* __restrict__ V = static_cast<const T*>(a.v) + kv_head * a.nk * D;
  T* __restrict__ O = static_cast<T*>(a.o) + std::size_t(bh) * a.nq * D;
  float* __restrict__ lse = a.lse + std::size_t(bh) * a.nq;

  const int tid = threadIdx.x, tx = tid % 16, ty = tid / 16, warp = tid / 32, lane = tid % 32;
  const Blocks blocks{Br, Bc};
  const int Tr = ceil_div(a.nq, Br);

  for (int i = blockIdx.x; i < Tr; i += gridDim.x) {  // line 5, swapped: Q blocks outside, one per thread block
    const int last = last_visit(a.nq, a.nk, a.causal, blocks, i);
    const int i0 = i * Br, rows = min(Br, a.nq - i0);
    // A Q block whose rows are all empty (causal, Nq > Nk) meets no key: O = 0, LSE = -inf.
    if (last < 0) {
      for (int e = tid; e < rows * D; e += kThreads) O[std::size_t(i0) * D + e] = from_float<T>(0.f);
      for (int r = tid; r < rows; r += kThreads) lse[i0 + r] = neg_inf<float>();
      continue;
    }

    // Line 8, once per Q block: Q_i, and (m_i, l_i) = the identity; O_i = 0 in registers.
    stage_rows<T, D, Br>(Q + std::size_t(i0) * D, rows, sm.Q);
    if (tid < Br) {
      sm.m[tid] = neg_inf<float>();
      sm.l[tid] = 0.f;
    }
    float o_i[RA][CO] = {};

    for (int j = 0; j <= last; ++j) {  // line 7, swapped: K/V blocks inside, up to the last one Q_i sees
      const int j0 = j * Bc, kr = min(Bc, a.nk - j0);
      // Line 6. The last step ended with a barrier, so nobody still reads K, V.
      stage_rows<T, D, Bc>(K + std::size_t(j0) * D, kr, sm.K);
      stage_rows<T, D, Bc>(V + std::size_t(j0) * D, kr, sm.V);
      __syncthreads();

      // Line 9: S_ij = tau Q_i K_j^T (base 2), masked as it is written.
      {
        float acc[RA][CS] = {};
#pragma unroll 4
        for (int k = 0; k < D; ++k) {
          float q[RA], kk[CS];
#pragma unroll
          for (int ra = 0; ra < RA; ++ra) q[ra] = sm.Q[(ty + 16 * ra) * kLd + k];
#pragma unroll
          for (int cb = 0; cb < CS; ++cb) kk[cb] = sm.K[(tx + 16 * cb) * kLd + k];
#pragma unroll
          for (int ra = 0; ra < RA; ++ra)
#pragma unroll
            for (int cb = 0; cb < CS; ++cb) acc[ra][cb] = fmaf(q[ra], kk[cb], acc[ra][cb]);
        }
#pragma unroll
        for (int ra = 0; ra < RA; ++ra) {
          const int r = ty + 16 * ra, row = i0 + r;
#pragma unroll
          for (int cb = 0; cb < CS; ++cb) {
            const int c = tx + 16 * cb, key = j0 + c;
            const bool visible = c < kr && (!a.causal || cuda::causal_visible(row, key, a.nq, a.nk));
            sm.S[r * sLd + c] = visible ? acc[ra][cb] * a.scale_log2 : neg_inf<float>();
          }
        }
      }
      __syncthreads();

      // Lines 10-11, one warp per row: m~ = rowmax(S_ij), P~ = 2^(S_ij - m~), l~ = rowsum(P~),
      // then (m_new, l_new) = (m_i, l_i) (+) (m~, l~). finite_max() keeps a row with every
      // key masked at P~ = 0 instead of NaN.
      for (int r = warp; r < Br; r += kWarps) {
        float x[Bc / 32];
        float m_tilde = neg_inf<float>();
#pragma unroll
        for (int c = 0; c < Bc / 32; ++c) {
          x[c] = sm.S[r * sLd + lane + 32 * c];
          m_tilde = fmaxf(m_tilde, x[c]);
        }
        m_tilde = warp_max(m_tilde);
        const float shift = finite_max(m_tilde);
        float l_tilde = 0.f;
#pragma unroll
        for (int c = 0; c < Bc / 32; ++c) {
          x[c] = exp2f(x[c] - shift);
          sm.S[r * sLd + lane + 32 * c] = x[c];
          l_tilde += x[c];
        }
        l_tilde = warp_sum(l_tilde);
        if (lane == 0) {
          const MergeWeights<float> w = merge_weights<Base2>(sm.m[r], m_tilde);
          const float l_new = sm.l[r] * w.wa + l_tilde * w.wb;
          const float inv = l_new > 0.f ? 1.f / l_new : 0.f;
          sm.scale_old[r] = sm.l[r] * w.wa * inv;
          sm.scale_new[r] = w.wb * inv;
          sm.m[r] = w.m;
          sm.l[r] = l_new;
        }
      }
      __syncthreads();

      // Line 12: O_i <- scale_old * O_i + scale_new * P~_ij V_j, O_i in registers.
      {
        float acc[RA][CO] = {};
#pragma unroll 4
        for (int k = 0; k < kr; ++k) {
          float pr[RA], vv[CO];
#pragma unroll
          for (int ra = 0; ra < RA; ++ra) pr[ra] = sm.S[(ty + 16 * ra) * sLd + k];
#pragma unroll
          for (int cb = 0; cb < CO; ++cb) vv[cb] = sm.V[k * kLd + tx + 16 * cb];
#pragma unroll
          for (int ra = 0; ra < RA; ++ra)
#pragma unroll
            for (int cb = 0; cb < CO; ++cb) acc[ra][cb] = fmaf(pr[ra], vv[cb], acc[ra][cb]);
        }
        const bool final_step = j == last;
#pragma unroll
        for (int ra = 0; ra < RA; ++ra) {
          const int r = ty + 16 * ra;
          if (r >= rows) continue;
          const float so = sm.scale_old[r], sn = sm.scale_new[r];
          const std::size_t at = std::size_t(i0 + r) * D;
#pragma unroll
          for (int cb = 0; cb < CO; ++cb) {
            const int c = tx + 16 * cb;
            float o = sn * acc[ra][cb];
            if (j > 0) o = fmaf(so, o_i[ra][cb], o);  // at j = 0, O_i is still the identity
            if (final_step) O[at + c] = from_float<T>(o);
            else o_i[ra][cb] = o;
          }
        }
        // Line 13: the LSE on Q block i's last step; (m_i, l_i) stay in shared memory.
        if (tid < rows) {
          if (final_step) lse[i0 + tid] = sm.l[tid] > 0.f ? Base2::lse(sm.m[tid], sm.l[tid]) : neg_inf<float>();
        }
      }
      __syncthreads();  // the next step overwrites K_j, V_j, S_ij, m_i, l_i
    }
  }
}

template <class T, int D>
void launch(const FwdParams& a, cudaStream_t s) {
  constexpr Blocks kB = kernel_forward_blocks(D);
  constexpr int smem = int(sizeof(ForwardSmem<D, kB.Br, kB.Bc>));
  static const bool configured = [] {
    CUDA_CHECK(cudaFuncSetAttribute(fwd_kernel<T, D>, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
    return true;
  }();
  (void)configured;
  const dim3 grid(ceil_div(a.nq, kB.Br), a.batch * a.heads);
  fwd_kernel<T, D><<<grid, kThreads, smem, s>>>(a);
}

}  // namespace

bool launch(const FwdParams& p, DType t, cudaStream_t s) {
  if (t != DType::bf16) return false;
  switch (p.d) {
    case 64: launch<__nv_bfloat16, 64>(p, s); return true;
    case 128: launch<__nv_bfloat16, 128>(p, s); return true;
    default: return false;
  }
}

}  // namespace attn::ch04::v1
