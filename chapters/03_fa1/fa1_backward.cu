// Chapter 03 - FlashAttention-1, backward: Algorithm 4 of Dao et al. 2022 (no dropout).
//
//   01 naive          (CPU model only) five GEMM-shaped passes over stored P, dP, dS
// > 03 FA1            recompute S and P block by block from the LSE; K/V outer  <- this file
//   04 FA2            parallel over K/V blocks, dQ accumulated with atomics
//
// What this step changes. Chapter 01's backward reads back the N^2 matrix P that its
// forward stored and writes two more (dP, dS). FA1 keeps only O and the LSE (O(N)) and
// recomputes, for each block pair, S_ij = tau Q_i K_j^T and P_ij = exp(S_ij - LSE_i):
// one matmul more (2.5x the forward's FLOPs instead of 2x) and no N^2 traffic.
//
// Two kernels:
//   fa1_backward_dot  D_i = rowsum(dO_i o O_i), one warp per row (the paper computes it
//                     inside the loop, line 19; once up front reads O once)
//   fa1_backward      one thread block per (batch, KV head); the query heads of its
//                     group run inside, so their dK_j, dV_j contributions add on chip
//
//   for j:                                   K_j, V_j -> shared memory; dK_j = dV_j = 0
//     for each query head of the group, for i (causal: up to the diagonal):
//       Q_i, dO_i, LSE_i, D_i -> shared memory
//       P_ij  = exp(S_ij - LSE_i)            (Br x Bc, shared)   lines 12-14
//       dS_ij = P_ij o (dO_i V_j^T - D_i)    (Br x Bc, shared)   lines 17, 20
//       dV_j += P_ij^T dO_i                  (registers)         line 16
//       dK_j += tau dS_ij^T Q_i              (registers)         line 22
//       dQ_i += tau dS_ij K_j                (HBM, fp32)         line 21
//     dK_j, dV_j -> HBM
//
// No atomics: dQ_i is updated by a read-modify-write in global memory, and only this
// thread block ever touches the rows of dQ that belong to its (batch, head group); its
// steps run one after another. Chapter 04 makes the K/V blocks of one head run in
// parallel thread blocks: several blocks then add into the same dQ_i at the same time,
// and the read-modify-write must become an atomic add (or a separate reduction).
//
// Thread layout (256 threads, tx = tid % 16, ty = tid / 16):
//   P_ij, dS_ij (Br x Bc):  rows ty + 16a, columns tx + 16b
//   dK_j, dV_j  (Bc x d):   keys ty + 16a, columns tx + 16b   (kept in registers over all i)
//   dQ_i        (Br x d):   rows ty + 16a, columns tx + 16b
// Arithmetic: plain fp32 FMA, base-2 exponentials, as in fa1.cu.
#include <type_traits>

#include "common/cuda/buffer.cuh"
#include "common/cuda/check.cuh"
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

struct BackwardArgs {
  const void* q;     ///< [B][Hq][Nq][d]
  const void* k;     ///< [B][Hkv][Nk][d]
  const void* v;     ///< [B][Hkv][Nk][d]
  const void* dout;  ///< [B][Hq][Nq][d]
  const float* lse;  ///< [B][Hq][Nq] from the forward, natural log
  const float* D;    ///< [B][Hq][Nq] rowsum(dO o O)
  void* dq;          ///< [B][Hq][Nq][d]
  void* dk;          ///< [B][Hkv][Nk][d]
  void* dv;          ///< [B][Hkv][Nk][d]
  float* dq_acc;     ///< [B][Hq][Nq][d] fp32 scratch: dQ_i between steps
  int heads, kv_heads, nq, nk;
  float scale;       ///< tau
  float scale_log2;  ///< tau * log2(e)
  bool causal;
};

/// D_i = dO_i . O_i for every query row, one warp per row.
template <class T>
__global__ void __launch_bounds__(kThreads) fa1_backward_dot(const T* __restrict__ dout, const T* __restrict__ o,
                                                             float* __restrict__ D, std::size_t rows, int d) {
  const std::size_t row = std::size_t(blockIdx.x) * kWarps + threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  if (row >= rows) return;  // whole warps leave together
  float s = 0.f;
  for (int c = lane; c < d; c += 32) s = fmaf(to_float(dout[row * d + c]), to_float(o[row * d + c]), s);
  s = warp_sum(s);
  if (lane == 0) D[row] = s;
}

template <int D, int Br, int Bc>
struct BackwardSmem {
  float K[Bc * tile_ld<D>()];     // K_j   (Bc x d)
  float V[Bc * tile_ld<D>()];     // V_j   (Bc x d)
  float Q[Br * tile_ld<D>()];     // Q_i   (Br x d)
  float dO[Br * tile_ld<D>()];    // dO_i  (Br x d)
  float P[Br * score_ld<Bc>()];   // P_ij  (Br x Bc)
  float dS[Br * score_ld<Bc>()];  // dS_ij (Br x Bc)
  float lse[Br];                  // LSE_i in base 2
  float Di[Br];                   // D_i
};

template <class T, int D>
__global__ void __launch_bounds__(kThreads, 1) fa1_backward(const BackwardArgs a) {
  constexpr Blocks kB = kernel_backward_blocks(D);
  constexpr int Br = kB.Br, Bc = kB.Bc;
  constexpr int RA = Br / 16, CS = Bc / 16, KA = Bc / 16, CO = D / 16;
  constexpr int kLd = tile_ld<D>(), sLd = score_ld<Bc>();
  static_assert(Br % 16 == 0 && Bc % 16 == 0 && D % 16 == 0, "the thread layout needs these multiples");
  extern __shared__ float4 smem_raw[];
  BackwardSmem<D, Br, Bc>& sm = *reinterpret_cast<BackwardSmem<D, Br, Bc>*>(smem_raw);

  const int b = blockIdx.x / a.kv_heads, hk = blockIdx.x % a.kv_heads, g = a.heads / a.kv_heads;
  const std::size_t kv_head = std::size_t(b) * a.kv_heads + hk;
  const T* __restrict__ K = static_cast<const T*>(a.k) + kv_head * a.nk * D;
  const T* __restrict__ V = static_cast<const T*>(a.v) + kv_head * a.nk * D;
  T* __restrict__ dK = static_cast<T*>(a.dk) + kv_head * a.nk * D;
  T* __restrict__ dV = static_cast<T*>(a.dv) + kv_head * a.nk * D;

  const int tid = threadIdx.x, tx = tid % 16, ty = tid / 16;
  const Blocks blocks{Br, Bc};
  const int Tr = ceil_div(a.nq, Br), Tc = ceil_div(a.nk, Bc);

  // Q blocks whose rows are all empty are never visited: their dQ is 0.
  for (int hh = 0; hh < g; ++hh) {
    T* dQ = static_cast<T*>(a.dq) + (std::size_t(b) * a.heads + hk * g + hh) * a.nq * D;
    for (int i = 0; i < Tr; ++i) {
      if (last_visit(a.nq, a.nk, a.causal, blocks, i) >= 0) continue;
      const int i0 = i * Br, rows = min(Br, a.nq - i0);
      for (int e = tid; e < rows * D; e += kThreads) dQ[std::size_t(i0) * D + e] = from_float<T>(0.f);
    }
  }

  for (int j = 0; j < Tc; ++j) {  // line 7
    const int j0 = j * Bc, kr = min(Bc, a.nk - j0);
    stage_rows<T, D, Bc>(K + std::size_t(j0) * D, kr, sm.K);  // line 8
    stage_rows<T, D, Bc>(V + std::size_t(j0) * D, kr, sm.V);
    float dK_j[KA][CO] = {}, dV_j[KA][CO] = {};              // line 9

    for (int hh = 0; hh < g; ++hh) {
      const std::size_t bh = std::size_t(b) * a.heads + hk * g + hh;
      const T* __restrict__ Q = static_cast<const T*>(a.q) + bh * a.nq * D;
      const T* __restrict__ dO = static_cast<const T*>(a.dout) + bh * a.nq * D;
      T* __restrict__ dQ = static_cast<T*>(a.dq) + bh * a.nq * D;
      float* __restrict__ dQ_acc = a.dq_acc + bh * a.nq * D;
      const float* __restrict__ lse = a.lse + bh * a.nq;
      const float* __restrict__ Dvec = a.D + bh * a.nq;

      for (int i = 0; i < Tr; ++i) {  // line 10
        const int last = last_visit(a.nq, a.nk, a.causal, blocks, i);
        if (j > last) continue;
        const int i0 = i * Br, rows = min(Br, a.nq - i0);

        // Line 11: Q_i, dO_i, LSE_i, D_i (dQ_i stays in HBM; each thread reads its own part).
        stage_rows<T, D, Br>(Q + std::size_t(i0) * D, rows, sm.Q);
        stage_rows<T, D, Br>(dO + std::size_t(i0) * D, rows, sm.dO);
        if (tid < Br) {
          sm.lse[tid] = tid < rows ? lse[i0 + tid] * float(kLog2e) : 0.f;
          sm.Di[tid] = tid < rows ? Dvec[i0 + tid] : 0.f;
        }
        __syncthreads();

        // Lines 12-20: S_ij and dP_ij = dO_i V_j^T in registers, then
        // P_ij = 2^(S_ij log2 e - LSE_i log2 e) and dS_ij = P_ij o (dP_ij - D_i) to shared memory.
        {
          float s[RA][CS] = {}, dp[RA][CS] = {};
#pragma unroll 2
          for (int k = 0; k < D; ++k) {
            float q[RA], o[RA], kk[CS], vv[CS];
#pragma unroll
            for (int ra = 0; ra < RA; ++ra) {
              q[ra] = sm.Q[(ty + 16 * ra) * kLd + k];
              o[ra] = sm.dO[(ty + 16 * ra) * kLd + k];
            }
#pragma unroll
            for (int cb = 0; cb < CS; ++cb) {
              kk[cb] = sm.K[(tx + 16 * cb) * kLd + k];
              vv[cb] = sm.V[(tx + 16 * cb) * kLd + k];
            }
#pragma unroll
            for (int ra = 0; ra < RA; ++ra)
#pragma unroll
              for (int cb = 0; cb < CS; ++cb) {
                s[ra][cb] = fmaf(q[ra], kk[cb], s[ra][cb]);
                dp[ra][cb] = fmaf(o[ra], vv[cb], dp[ra][cb]);
              }
          }
#pragma unroll
          for (int ra = 0; ra < RA; ++ra) {
            const int r = ty + 16 * ra, row = i0 + r;
#pragma unroll
            for (int cb = 0; cb < CS; ++cb) {
              const int c = tx + 16 * cb, key = j0 + c;
              // Padding rows and keys, and masked pairs, get P = 0 (so dS = 0): an empty
              // row, whose LSE is -inf, has no visible key and never reaches exp2f.
              const bool visible = r < rows && c < kr && (!a.causal || cuda::causal_visible(row, key, a.nq, a.nk));
              const float prob = visible ? exp2f(fmaf(s[ra][cb], a.scale_log2, -sm.lse[r])) : 0.f;
              sm.P[r * sLd + c] = prob;
              sm.dS[r * sLd + c] = prob * (dp[ra][cb] - sm.Di[r]);
            }
          }
        }
        __syncthreads();

        // Lines 16 and 22: dV_j += P_ij^T dO_i, dK_j += dS_ij^T Q_i (tau applied at the store).
        for (int r = 0; r < rows; ++r) {
          float pk[KA], dsk[KA], dov[CO], qv[CO];
#pragma unroll
          for (int ka = 0; ka < KA; ++ka) {
            pk[ka] = sm.P[r * sLd + ty + 16 * ka];
            dsk[ka] = sm.dS[r * sLd + ty + 16 * ka];
          }
#pragma unroll
          for (int cb = 0; cb < CO; ++cb) {
            dov[cb] = sm.dO[r * kLd + tx + 16 * cb];
            qv[cb] = sm.Q[r * kLd + tx + 16 * cb];
          }
#pragma unroll
          for (int ka = 0; ka < KA; ++ka)
#pragma unroll
            for (int cb = 0; cb < CO; ++cb) {
              dV_j[ka][cb] = fmaf(pk[ka], dov[cb], dV_j[ka][cb]);
              dK_j[ka][cb] = fmaf(dsk[ka], qv[cb], dK_j[ka][cb]);
            }
        }

        // Line 21: dQ_i <- dQ_i + tau dS_ij K_j, read and written back by the thread that
        // owns the element; fp32 until Q block i's last step, then the dtype, once.
        {
          float dq[RA][CO] = {};
#pragma unroll 4
          for (int c = 0; c < kr; ++c) {
            float ds[RA], kv[CO];
#pragma unroll
            for (int ra = 0; ra < RA; ++ra) ds[ra] = sm.dS[(ty + 16 * ra) * sLd + c];
#pragma unroll
            for (int cb = 0; cb < CO; ++cb) kv[cb] = sm.K[c * kLd + tx + 16 * cb];
#pragma unroll
            for (int ra = 0; ra < RA; ++ra)
#pragma unroll
              for (int cb = 0; cb < CO; ++cb) dq[ra][cb] = fmaf(ds[ra], kv[cb], dq[ra][cb]);
          }
          const bool final_step = j == last;
#pragma unroll
          for (int ra = 0; ra < RA; ++ra) {
            const int r = ty + 16 * ra;
            if (r >= rows) continue;
            const std::size_t at = std::size_t(i0 + r) * D;
#pragma unroll
            for (int cb = 0; cb < CO; ++cb) {
              const int col = tx + 16 * cb;
              float x = a.scale * dq[ra][cb];
              if (j > 0) x += dQ_acc[at + col];  // never read at j = 0: not yet written
              if (final_step) dQ[at + col] = from_float<T>(x);
              else dQ_acc[at + col] = x;
            }
          }
        }
        __syncthreads();  // the next step overwrites Q_i, dO_i, P_ij, dS_ij
      }
    }

    // Line 24: dK_j, dV_j to HBM, once.
#pragma unroll
    for (int ka = 0; ka < KA; ++ka) {
      const int key = j0 + ty + 16 * ka;
      if (key >= a.nk) continue;
#pragma unroll
      for (int cb = 0; cb < CO; ++cb) {
        const std::size_t at = std::size_t(key) * D + tx + 16 * cb;
        dK[at] = from_float<T>(a.scale * dK_j[ka][cb]);
        dV[at] = from_float<T>(dV_j[ka][cb]);
      }
    }
  }
}

template <class T, int D>
void launch_backward(const BackwardArgs& a, int grid) {
  constexpr Blocks kB = kernel_backward_blocks(D);
  constexpr int smem = int(sizeof(BackwardSmem<D, kB.Br, kB.Bc>));
  static const bool configured = [] {
    CUDA_CHECK(cudaFuncSetAttribute(fa1_backward<T, D>, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
    return true;
  }();
  (void)configured;
  fa1_backward<T, D><<<grid, kThreads, smem>>>(a);
  CUDA_CHECK_LAUNCH("fa1_backward");
}

/// The D pass: D_i = rowsum(dO_i o O_i).
void launch_dot(const Problem& p, const void* dout, const void* o, float* D) {
  dispatch_dtype(p.dtype, [&](auto tag) {
    using T = decltype(tag);
    if constexpr (std::is_same_v<T, float>) {
      throw UsageError(kernel_unsupported(p));
    } else {
      const std::size_t rows = p.lse_elems();
      fa1_backward_dot<T><<<unsigned((rows + kWarps - 1) / kWarps), kThreads>>>(
          static_cast<const T*>(dout), static_cast<const T*>(o), D, rows, p.dv);
      CUDA_CHECK_LAUNCH("fa1_backward_dot");
    }
  });
}

/// The D pass, then the main kernel.
void launch_backward(const Problem& p, const BackwardArgs& a, const void* o, float* D) {
  launch_dot(p, a.dout, o, D);
  dispatch_dtype(p.dtype, [&](auto tag) {
    using T = decltype(tag);
    if constexpr (std::is_same_v<T, float>) {
      throw UsageError(kernel_unsupported(p));
    } else {
      const int grid = p.batch * p.kv_heads;
      switch (p.d) {
        case 32: launch_backward<T, 32>(a, grid); break;
        case 64: launch_backward<T, 64>(a, grid); break;
        case 128: launch_backward<T, 128>(a, grid); break;
        default: throw UsageError(kernel_unsupported(p));
      }
    }
  });
}

}  // namespace

GpuBackward fa1_backward_gpu(const Problem& p, const AttnInputs& in, bool time, int warmup) {
  if (const std::string why = kernel_unsupported(p); !why.empty()) throw UsageError(why);
  if (in.dout.size() != p.o_elems()) throw UsageError("the backward needs dO");
  // The forward's outputs, computed by the forward kernel itself.
  const GpuForward fwd = fa1_forward_gpu(p, in, false);
  GpuBackward r;
  const DeviceTensor q = DeviceTensor::from_host(in.q, p.dtype), k = DeviceTensor::from_host(in.k, p.dtype),
                     v = DeviceTensor::from_host(in.v, p.dtype), dout = DeviceTensor::from_host(in.dout, p.dtype),
                     o = DeviceTensor::from_host(fwd.o, p.dtype);
  DeviceBuffer<float> lse(p.lse_elems()), D(p.lse_elems()), dq_acc(p.q_elems());
  lse.upload(fwd.lse);
  DeviceTensor dq(p.dtype, p.q_elems()), dk(p.dtype, p.k_elems()), dv(p.dtype, p.v_elems());
  const float tau = float(p.softmax_scale());
  BackwardArgs a{q.data(), k.data(), v.data(), dout.data(), lse.get(), D.get(), dq.data(), dk.data(), dv.data(),
                 dq_acc.get(), p.heads, p.kv_heads, p.nq, p.nk, tau, float(tau * kLog2e), p.causal};

  dq.poison();
  dk.poison();
  dv.poison();
  D.poison();
  dq_acc.poison();
  launch_backward(p, a, o.data(), D.get());
  CUDA_CHECK(cudaDeviceSynchronize());
  r.dq = dq.to_host();
  r.dk = dk.to_host();
  r.dv = dv.to_host();
  if (time) {
    TimingOptions opt;
    opt.warmup = warmup;
    r.time_ms = time_gpu([&] { launch_backward(p, a, o.data(), D.get()); }, opt).median_ms;
    r.dot_ms = time_gpu([&] { launch_dot(p, dout.data(), o.data(), D.get()); }, opt).median_ms;
  }
  return r;
}

}  // namespace attn::ch03
