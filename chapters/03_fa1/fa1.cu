// Chapter 03 - FlashAttention-1, forward: Algorithm 1 of Dao et al. 2022 on the GPU.
//
//   01 naive          three kernels, S and P written to HBM
//   02 online softmax one pass per row, (m, l, O) carried in registers
// > 03 FA1            tiles through shared memory, K/V outer, (m, l, O) in HBM   <- this file
//   04 FA2            Q outer, tensor cores, one Q block per thread block
//
// What this step changes. Chapter 02's fused pass walks one query row over all keys
// with its (m, l, O) in registers. FA1 tiles both sides: a block of B_c keys and
// values is staged in shared memory once and reused by every block of B_r queries;
// S_ij (B_r x B_c) lives only in shared memory, so no N^2 matrix reaches HBM. The
// price of the paper's loop order (K/V outside, Q inside) is that each Q block's
// (m_i, l_i, O_i) must leave the chip after every step and come back for the next:
// the traffic is Theta(N^2 d^2 / M), not Theta(N d). Chapter 04 swaps the loops.
//
// Grid: one thread block per (batch, query head), 256 threads. K/V heads are shared
// by their query-head group (GQA); each block reads its group's K/V, never writes it.
//
// Per step (i, j), with B_r x B_c = 64 x 64 (d = 128) as the example:
//
//   K_j, V_j  (Bc x d, fp32)  staged once per j ---------------------.
//   Q_i       (Br x d, fp32)  staged every step                        |  shared
//   S_ij      (Br x Bc, fp32) = tau log2(e) Q_i K_j^T, then P~_ij     |  memory
//   m_i, l_i, and the two rescale factors per row  -----------------'
//   O_i       (Br x d, fp32)  registers: P~_ij V_j, combined with O_acc from HBM
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
// log2 e folded into the softmax scale). Tensor cores are chapter 04's step.
#include <type_traits>

#include "common/cuda/buffer.cuh"
#include "common/cuda/check.cuh"
#include "common/cuda/device_problem.cuh"
#include "common/cuda/index.cuh"
#include "common/cuda/timing.cuh"
#include "common/cuda/types.cuh"
#include "common/errors.hpp"
#include "common/online_softmax.hpp"
#include "fa1_blocks.hpp"
#include "fa1_gpu.hpp"
#include "fa1_tiles.cuh"

namespace attn::ch03 {
namespace {

struct ForwardArgs {
  const void* q;  ///< [B][Hq][Nq][d]
  const void* k;  ///< [B][Hkv][Nk][d]
  const void* v;  ///< [B][Hkv][Nk][d]
  void* o;        ///< [B][Hq][Nq][d], written once per row
  float* lse;     ///< [B][Hq][Nq], natural log, -inf for an empty row
  float* o_acc;   ///< [B][Hq][Nq][d] fp32 scratch: O_i between steps
  float* m;       ///< [B][Hq][Nq] scratch, base-2 units
  float* l;       ///< [B][Hq][Nq] scratch
  int heads, kv_heads, nq, nk;
  float scale_log2;  ///< tau * log2(e)
  bool causal;
};

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
__global__ void __launch_bounds__(kThreads, 1) fa1_forward(const ForwardArgs a) {
  constexpr Blocks kB = kernel_forward_blocks(D);
  constexpr int Br = kB.Br, Bc = kB.Bc;
  constexpr int RA = Br / 16, CS = Bc / 16, CO = D / 16;  // rows per thread; columns per thread in S_ij, O_i
  constexpr int kLd = tile_ld<D>(), sLd = score_ld<Bc>();
  static_assert(Br % 16 == 0 && Bc % 32 == 0 && D % 16 == 0, "the thread layout needs these multiples");
  extern __shared__ float4 smem_raw[];
  ForwardSmem<D, Br, Bc>& sm = *reinterpret_cast<ForwardSmem<D, Br, Bc>*>(smem_raw);

  const int bh = blockIdx.x, b = bh / a.heads, h = bh % a.heads;
  const int hk = cuda::kv_head_of(h, a.heads, a.kv_heads);
  const std::size_t kv_head = std::size_t(b) * a.kv_heads + hk;
  const T* __restrict__ Q = static_cast<const T*>(a.q) + std::size_t(bh) * a.nq * D;
  const T* __restrict__ K = static_cast<const T*>(a.k) + kv_head * a.nk * D;
  const T* __restrict__ V = static_cast<const T*>(a.v) + kv_head * a.nk * D;
  T* __restrict__ O = static_cast<T*>(a.o) + std::size_t(bh) * a.nq * D;
  float* __restrict__ O_acc = a.o_acc + std::size_t(bh) * a.nq * D;
  float* __restrict__ m = a.m + std::size_t(bh) * a.nq;
  float* __restrict__ l = a.l + std::size_t(bh) * a.nq;
  float* __restrict__ lse = a.lse + std::size_t(bh) * a.nq;

  const int tid = threadIdx.x, tx = tid % 16, ty = tid / 16, warp = tid / 32, lane = tid % 32;
  const Blocks blocks{Br, Bc};
  const int Tr = ceil_div(a.nq, Br), Tc = ceil_div(a.nk, Bc);

  // Q blocks whose rows are all empty (causal, Nq > Nk) meet no key: O = 0, LSE = -inf.
  for (int i = 0; i < Tr; ++i) {
    if (last_visit(a.nq, a.nk, a.causal, blocks, i) >= 0) continue;
    const int i0 = i * Br, rows = min(Br, a.nq - i0);
    for (int e = tid; e < rows * D; e += kThreads) O[std::size_t(i0) * D + e] = from_float<T>(0.f);
    for (int r = tid; r < rows; r += kThreads) lse[i0 + r] = neg_inf<float>();
  }

  for (int j = 0; j < Tc; ++j) {  // line 5: K/V blocks outside
    const int j0 = j * Bc, kr = min(Bc, a.nk - j0);
    // Line 6. The last step of the previous j ended with a barrier, so nobody still reads K, V.
    stage_rows<T, D, Bc>(K + std::size_t(j0) * D, kr, sm.K);
    stage_rows<T, D, Bc>(V + std::size_t(j0) * D, kr, sm.V);

    for (int i = 0; i < Tr; ++i) {  // line 7: Q blocks inside
      const int last = last_visit(a.nq, a.nk, a.causal, blocks, i);
      if (j > last) continue;  // the same decision in every thread: no divergent barrier
      const int i0 = i * Br, rows = min(Br, a.nq - i0);

      // Line 8: Q_i, and (m_i, l_i) as step j - 1 left them (the identity at j = 0).
      stage_rows<T, D, Br>(Q + std::size_t(i0) * D, rows, sm.Q);
      if (tid < Br) {
        const bool stored = j > 0 && tid < rows;
        sm.m[tid] = stored ? m[i0 + tid] : neg_inf<float>();
        sm.l[tid] = stored ? l[i0 + tid] : 0.f;
      }
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

      // Line 12: O_i <- scale_old * O_i + scale_new * P~_ij V_j, O_i from and to HBM.
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
            if (j > 0) o = fmaf(so, O_acc[at + c], o);  // never read at j = 0: O_acc is not yet written
            if (final_step) O[at + c] = from_float<T>(o);
            else O_acc[at + c] = o;
          }
        }
        // Line 13: (m_i, l_i) back to HBM, or the LSE on Q block i's last step.
        if (tid < rows) {
          if (final_step) lse[i0 + tid] = sm.l[tid] > 0.f ? Base2::lse(sm.m[tid], sm.l[tid]) : neg_inf<float>();
          else {
            m[i0 + tid] = sm.m[tid];
            l[i0 + tid] = sm.l[tid];
          }
        }
      }
      __syncthreads();  // the next step overwrites Q_i, S_ij, m_i, l_i
    }
  }
}

template <class T, int D>
void launch_forward(const ForwardArgs& a, int grid) {
  constexpr Blocks kB = kernel_forward_blocks(D);
  constexpr int smem = int(sizeof(ForwardSmem<D, kB.Br, kB.Bc>));
  static const bool configured = [] {
    CUDA_CHECK(cudaFuncSetAttribute(fa1_forward<T, D>, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
    return true;
  }();
  (void)configured;
  fa1_forward<T, D><<<grid, kThreads, smem>>>(a);
  CUDA_CHECK_LAUNCH("fa1_forward");
}

void launch_forward(const Problem& p, const ForwardArgs& a) {
  const int grid = p.batch * p.heads;
  dispatch_dtype(p.dtype, [&](auto tag) {
    using T = decltype(tag);
    if constexpr (std::is_same_v<T, float>) {
      throw UsageError(kernel_unsupported(p));
    } else {
      switch (p.d) {
        case 32: launch_forward<T, 32>(a, grid); break;
        case 64: launch_forward<T, 64>(a, grid); break;
        case 128: launch_forward<T, 128>(a, grid); break;
        default: throw UsageError(kernel_unsupported(p));
      }
    }
  });
}

}  // namespace

double fa1_device_bytes(const Problem& p, bool backward) {
  const double e = dtype_bytes(p.dtype);
  double bytes = e * double(p.q_elems() + p.k_elems() + p.v_elems() + p.o_elems()) +
                 4.0 * double(p.lse_elems()) +                           // LSE
                 4.0 * double(p.o_elems()) + 8.0 * double(p.lse_elems());  // O_acc, m, l
  if (backward)
    bytes += e * double(p.o_elems() + p.q_elems() + p.k_elems() + p.v_elems()) +  // dO, dQ, dK, dV
             4.0 * double(p.lse_elems()) + 4.0 * double(p.q_elems());           // D, dQ_acc
  return bytes;
}

GpuForward fa1_forward_gpu(const Problem& p, const AttnInputs& in, bool time, int warmup) {
  if (const std::string why = kernel_unsupported(p); !why.empty()) throw UsageError(why);
  GpuForward r;
  DeviceProblem dev(p, in);
  DeviceBuffer<float> o_acc(p.o_elems()), m(p.lse_elems()), l(p.lse_elems());
  ForwardArgs a{dev.q.data(), dev.k.data(), dev.v.data(), dev.o.data(), dev.lse.get(), o_acc.get(), m.get(), l.get(),
                p.heads, p.kv_heads, p.nq, p.nk, float(p.softmax_scale() * kLog2e), p.causal};

  // The checked run: outputs and scratch poisoned, so an unwritten output or a read of
  // scratch before it was written shows up as NaN.
  dev.poison_outputs();
  o_acc.poison();
  m.poison();
  l.poison();
  launch_forward(p, a);
  CUDA_CHECK(cudaDeviceSynchronize());
  r.o = dev.o.to_host();
  r.lse = dev.lse.download();
  if (time) {
    TimingOptions opt;
    opt.warmup = warmup;
    r.time_ms = time_gpu([&] { launch_forward(p, a); }, opt).median_ms;
  }
  return r;
}

}  // namespace attn::ch03
