// Chapter 06 - masks in the backward: chapter 04's backward with a mask policy. This is the
// chapter's final masked backward (rows "final backward" in the report): one source, its
// configuration the constants at the top of namespace backward_mask below and the block
// map's tiles beside its declaration in mask_kernels.cuh (Br, Bc, DqBc):
//
//   configuration (bf16, d = 128; one row, every mask and score modifier)
//   | kernel             | keys a block         | query rows a step | threads | dQ                          |
//   |--------------------|----------------------|-------------------|---------|-----------------------------|
//   | fa2_bwd_main       | Bc = 128 (kBcMain)   | Br = 64           | 256     | fp32 atomics (the default)  |
//   | fa2_bwd_dq         | DqBc = 64 (kDqBc)    | Br = 64           | 128     | fixed order (deterministic) |
//   | preprocess, convert, sink | -             | -                 | 256     | -                           |
//
//   ../../04_fa2/backward.cu   chapter 04's backward (this file's parent)
// > backward_mask.cu           + the policy: block map, keep, score and its derivative
//
// `diff ../../04_fa2/backward.cu backward_mask.cu` shows the policy going in. What
// changes (masks/mask_policy.hpp has the interface):
//
//   1. fa2_bwd_main takes a Policy. Its steps are the block map's query blocks of this
//      key block (the transposed lists, partial first), for each query head of the KV
//      group, instead of every query block from the causal diagonal on.
//   2. keep(b, h, i, j) masks P on partial tiles only.
//   3. With Policy::kScore, P = 2^(score(tau S) log2(e) - LSE log2(e)) and
//      dS = P o (dP - D) o score'(tau S): the derivative of ALiBi is 1, of softcap
//      1 - tanh^2(tau S / cap). A learnable sink needs nothing here: the forward's
//      LSE already contains it, and it has no value row.
//   4. Strided rows (the packed varlen layout) in every load and store.
//   5. Chapter 04's deterministic dQ kernel (fa2_bwd_dq) walks the forward lists of a
//      second map (query blocks of 64 x key blocks of 64): the key blocks of its query
//      block, partial first, with the same policy. Only d = 128, bf16.
//   6. With Policy::kSink, fa2_bwd_sink: dLoss/dsink_h = -sum_i 2^(sink_h - LSE_i) D_i
//      (one block per head, a fixed-order sum), from the preprocess's D_i.
//
// Chapter 04's description of the kernels:
//
// Chapter 04 - FlashAttention-2 backward (Algorithm 2 of the FA2 paper, no dropout).
//
//   fa2_bwd_preprocess   D_i = rowsum(dO_i o O_i); the fp32 dQ accumulator zeroed
//   fa2_bwd_main         one thread block per (K/V block j, KV head): K_j, V_j stay in
//                        shared memory, dK_j and dV_j in registers, while the block walks
//                        every query block i of every query head sharing this KV head:
//                          S  = Q_i K_j^T          P  = exp(S tau - LSE_i)
//                          dV_j += P^T dO_i        dP = dO_i V_j^T
//                          dS = P o (dP - D_i)     dK_j += tau dS^T Q_i
//                          dQ_i += tau dS K_j      (fp32 atomics: many j add into one i)
//   fa2_bwd_dq           deterministic mode: dQ from a separate kernel parallel over Q
//                        blocks, summing over j in a fixed order (no atomics), at the
//                        price of recomputing S, P and dP
//   fa2_bwd_convert      dQ accumulator (fp32) -> dQ in the input dtype
//
// Why atomics: the K/V-parallel grid (FA2's choice for the backward, so that dK_j
// and dV_j are each owned by one block and need no reduction) makes every block j
// contribute to every dQ_i. Chapter 03's FA1 backward had one block per (batch,
// head), which owned all of dQ, and so needed none; FA2 trades that for parallelism
// over the sequence and pays with fp32 atomics on dQ (the study notes say FA2 removed them: it did not).
//
// Warp layout of fa2_bwd_main (8 warps, Bc = 128 keys, Br = 64 queries per step):
//
//            queries of Q_i ->  (Br = 64)
//   keys   warp 0 | S^T, P^T, dP^T, dS^T : 16 keys x 64 queries | dK, dV rows 0..15
//   of     warp 1 |                        16 x 64              | dK, dV rows 16..31
//   K_j     ...   |                                             | ...
//          warp 7 |                        16 x 64              | dK, dV rows 112..127
//
// Each warp holds the transposed tiles (keys as rows), so P^T and dS^T are already
// the A operands of dV += P^T dO and dK += dS^T Q. dQ needs dS with queries as rows:
// dS^T goes through shared memory once and comes back transposed by ldmatrix.trans,
// and the 8 warps split dQ_i (64 x d) into 4 row groups x 2 column halves.
// A K/V block of 128 keys halves the dQ atomics (and the reloads of Q_i, dO_i)
// against 64; on sm_90 each atomic adds two floats at once.
#include "common/cuda/check.cuh"
#include "common/cuda/cp_async.cuh"
#include "common/cuda/fast_math.cuh"
#include "common/cuda/index.cuh"
#include "common/cuda/ldmatrix.cuh"
#include "common/cuda/mma_sync.cuh"
#include "common/cuda/smem_tiles.cuh"
#include "common/online_softmax.hpp"
#include "masks/mask_kernels.cuh"
#include "masks/mask_policy.hpp"

namespace attn::ch06::backward_mask {
namespace {
using namespace attn::cuda;

constexpr int kMainThreads = 256;  // fa2_bwd_main: 8 warps
constexpr int kBcMain = Bc;        // keys per fa2_bwd_main thread block (16 per warp): 128 (mask_kernels.cuh)
static_assert(Br == 64, "queries per step");
constexpr int kPrepThreads = 256;  // fa2_bwd_preprocess: one warp per row, 8 rows per block
constexpr int kConvertThreads = 256, kConvertBlocks = 1024;  // fa2_bwd_convert: a grid-stride loop,
                                                              // ~8 blocks per SM of an H100/H200
constexpr int kDqThreads = 128;  // fa2_bwd_dq: 4 warps
constexpr int kDqBc = DqBc;      // keys per K/V step of fa2_bwd_dq (mask_kernels.cuh)
constexpr int kSinkThreads = 256;  // fa2_bwd_sink

/// dst[0..1] += (a, b): one 8-byte atomic on sm_90, two 4-byte ones before it.
__device__ __forceinline__ void atomic_add2(float* dst, float a, float b) {
#if __CUDA_ARCH__ >= 900
  atomicAdd(reinterpret_cast<float2*>(dst), make_float2(a, b));
#else
  atomicAdd(dst, a);
  atomicAdd(dst + 1, b);
#endif
}

/// D_i = dO_i . O_i, one warp per row; also zeroes that row of the dQ accumulator.
template <class T>
__global__ void fa2_bwd_preprocess(const BwdParams p, bool zero_dq) {
  const std::size_t rows = std::size_t(p.batch) * p.heads * p.nq;
  const std::size_t row = std::size_t(blockIdx.x) * (blockDim.x / 32) + threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  if (row >= rows) return;
  const int i = int(row % p.nq), bh = int(row / p.nq), b = bh / p.heads, h = bh % p.heads;
  const long long at_o = p.so.at(b, h) + i * p.so.row, at_q = p.sq.at(b, h) + i * p.sq.row;
  const T* o = static_cast<const T*>(p.o) + at_o;
  const T* dout = static_cast<const T*>(p.dout) + at_o;
  float acc = 0.f;
  for (int c = lane; c < p.d; c += 32) {
    acc += float(o[c]) * float(dout[c]);
    if (zero_dq) p.dq_accum[at_q + c] = 0.f;
  }
#pragma unroll
  for (int off = 16; off > 0; off /= 2) acc += __shfl_xor_sync(0xffffffffu, acc, off);
  if (lane == 0) p.delta[row] = acc;
}

/// LSE of query row r in base-2 units, or +inf where P must be 0 (past the end, or an
/// empty row whose LSE is -inf): 2^(s - inf) = 0, never NaN.
__device__ __forceinline__ float lse_log2(const float* lse, int r, int nq) {
  if (r >= nq) return INFINITY;
  const float v = lse[r];
  return v == -INFINITY ? INFINITY : v * float(kLog2e);
}

template <class T, int D, class Policy>
__global__ void __launch_bounds__(kMainThreads) fa2_bwd_main(const BwdParams p, bool atomic_dq, const Policy pol) {
  constexpr int KC = D / 8, DT = D / 8, Bc = kBcMain, kThreads = kMainThreads;
  extern __shared__ __align__(128) unsigned char smem[];
  T* sK = reinterpret_cast<T*>(smem);  // [Bc][D]
  T* sV = sK + Bc * D;                 // [Bc][D]
  T* sQ = sV + Bc * D;                 // [Br][D]
  T* sdO = sQ + Br * D;                // [Br][D]
  T* sdS = sdO + Br * D;               // [Bc][Br]  dS^T, swizzled with 8 chunks per row
  float* sL = reinterpret_cast<float*>(sdS + Bc * Br);  // [Br] LSE_i in base 2
  float* sD = sL + Br;                                   // [Br] D_i

  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
  const int j = blockIdx.x, bk = blockIdx.y, b = bk / p.kv_heads, hk = bk % p.kv_heads;
  const int group = p.heads / p.kv_heads;
  const int col0 = j * Bc;        // first key of K_j
  const int kw = warp * 16;       // this warp's keys within K_j
  const T* K = static_cast<const T*>(p.k) + p.sk.at(b, hk);
  const T* V = static_cast<const T*>(p.v) + p.sv.at(b, hk);

  // The block map's query blocks of K_j (partial first), for each query head of the
  // group: step s is entry n of head h's list.
  int n_steps = 0;
  for (int hh = 0; hh < group; ++hh) {
    const int owner = p.map.owner(b, hk * group + hh, j);
    n_steps += p.map.n_part[owner] + p.map.n_full[owner];
  }
  struct Step { int h, i; bool masked; };
  auto step_at = [&](int s) {
    for (int hh = 0;; ++hh) {
      const int owner = p.map.owner(b, hk * group + hh, j), np = p.map.n_part[owner];
      const int cnt = np + p.map.n_full[owner];
      if (s < cnt || hh == group - 1)
        return Step{hk * group + hh, s < np ? p.map.part[std::size_t(owner) * p.map.inner + s]
                                            : p.map.full[std::size_t(owner) * p.map.inner + s - np], s < np};
      s -= cnt;
    }
  };

  const uint32_t base = smem_u32(smem);  // tiles at fixed offsets from it (bytes):
  constexpr uint32_t oK = 0, oV = Bc * D * 2, oQ = 2 * Bc * D * 2, odO = oQ + Br * D * 2;
  load_tile_ld<Bc, D, kThreads>(base + oK, K, col0, p.nk, p.sk.row);
  load_tile_ld<Bc, D, kThreads>(base + oV, V, col0, p.nk, p.sv.row);
  auto head_of = [&](int s) { return std::size_t(b) * p.heads + step_at(s).h; };
  auto issue_step = [&](int s) {  // Q_i, dO_i of step s in flight
    const Step st = step_at(s);
    const int i = st.i;
    load_tile_ld<Br, D, kThreads>(base + oQ, static_cast<const T*>(p.q) + p.sq.at(b, st.h), i * Br, p.nq, p.sq.row);
    load_tile_ld<Br, D, kThreads>(base + odO, static_cast<const T*>(p.dout) + p.so.at(b, st.h), i * Br, p.nq, p.so.row);
  };
  auto stats_of_step = [&](int s) {  // thread x < 64 fetches LSE of row x, x >= 64 D of row x - 64
    const std::size_t head = head_of(s);
    const int r = step_at(s).i * Br + threadIdx.x % Br;
    return threadIdx.x < Br       ? lse_log2(p.lse + head * p.nq, r, p.nq)
           : threadIdx.x < 2 * Br ? (r < p.nq ? p.delta[head * p.nq + r] : 0.f)
                                  : 0.f;
  };
  if (n_steps > 0) {
    issue_step(0);
    const float st = stats_of_step(0);
    if (threadIdx.x < 2 * Br) (threadIdx.x < Br ? sL : sD)[threadIdx.x % Br] = st;
  }
  cp_async_commit();

  // ldmatrix lanes (common/cuda/smem_tiles.cuh), three patterns shared by every tile (tile offsets are
  // compile-time constants added to the address):
  //   rowA   A operand from rows kw + lane%16 (this warp's keys of K_j or V_j)
  //   colB   B operand whose columns are tile rows (Q_i^T, dO_i^T)
  //   transB B operand read transposed (Q_i, dO_i, K_j)
  const SwizzledLane<KC> rowA(base, kw + lane % 16, lane / 16);
  const SwizzledLane<KC> colB(base, (lane / 16) * 8 + lane % 8, (lane / 8) % 2);
  const SwizzledLane<KC> transB(base, lane % 8 + ((lane / 8) % 2) * 8, lane / 16);
  // dQ_i split over the 8 warps: query group qg (16 rows) x column half dh (D/2 dims).
  // A = dS (queries x keys) read transposed from dS^T: keys kk*16 + (lane/16)*8 + lane%8,
  // query chunk 2*qg + (lane/8)%2; B = K_j transposed, dims dh*D/2 + 16dp: one address
  // per lane and per dp (kk moves by whole 16-row steps, which keep the swizzle).
  const int qg = warp % 4, dh = warp / 4;
  const uint32_t ds_at = smem_u32(sdS) + uint32_t(((lane / 16) * 8 + lane % 8) * 8 +
                                                   ((2 * qg + (lane / 8) % 2) ^ (lane & 7))) * 16u;
  uint32_t kq_at[DT / 4];
#pragma unroll
  for (int dp = 0; dp < DT / 4; ++dp)
    kq_at[dp] = base + oK + uint32_t((lane % 8 + ((lane / 8) % 2) * 8) * KC +
                                     ((dh * (KC / 2) + 2 * dp + lane / 16) ^ (lane & 7))) * 16u;

  float dk[DT][4], dv[DT][4];
#pragma unroll
  for (int dt = 0; dt < DT; ++dt)
#pragma unroll
    for (int e = 0; e < 4; ++e) dk[dt][e] = dv[dt][e] = 0.f;

  for (int s = 0; s < n_steps; ++s) {
    const Step step = step_at(s);
    const int i = step.i, h = step.h;
    const int row0 = i * Br;
    cp_async_wait<0>();  // Q_i, dO_i (and K_j, V_j) have arrived ...
    __syncthreads();     // ... and LSE_i, D_i are in shared memory, for every thread

    // S^T = K_w Q_i^T and dP^T = V_w dO_i^T: 16 keys x 64 queries per warp.
    float st[8][4], dpt[8][4];
#pragma unroll
    for (int nt = 0; nt < 8; ++nt)
#pragma unroll
      for (int e = 0; e < 4; ++e) st[nt][e] = dpt[nt][e] = 0.f;
#pragma unroll
    for (int kk = 0; kk < D / 16; ++kk) {
      uint32_t ak[4], av[4];
      ldmatrix_x4(ak, rowA.at(0, 2 * kk) + oK);
      ldmatrix_x4(av, rowA.at(0, 2 * kk) + oV);
#pragma unroll
      for (int np = 0; np < 4; ++np) {
        uint32_t bq[4], bo[4];
        ldmatrix_x4(bq, colB.at(np * 16, 2 * kk) + oQ);
        ldmatrix_x4(bo, colB.at(np * 16, 2 * kk) + odO);
        mma_m16n8k16<T>(st[2 * np], ak, bq[0], bq[1]);
        mma_m16n8k16<T>(st[2 * np + 1], ak, bq[2], bq[3]);
        mma_m16n8k16<T>(dpt[2 * np], av, bo[0], bo[1]);
        mma_m16n8k16<T>(dpt[2 * np + 1], av, bo[2], bo[3]);
      }
    }

    // P^T = 2^(score(S^T tau) log2e - LSE_i log2e) and dS^T = P^T o (dP^T - D_i) o score'.
    // Element e of tile nt: key kw + g + 8(e/2), query 8nt + 2t + e%2 of Q_i. The mask
    // only on the map's partial tiles (the ragged last key block is always partial).
    const bool masked = step.masked;
#pragma unroll
    for (int nt = 0; nt < 8; ++nt)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int q = nt * 8 + 2 * t + (e % 2);
        const int key = col0 + kw + g + (e / 2) * 8, row = row0 + q;
        float pv, dmod = 1.f;
        if constexpr (Policy::kScore) {
          pv = exp2_approx(pol.score(st[nt][e] * p.scale, b, h, row, key) * float(kLog2e) - sL[q]);
          dmod = pol.dscore(st[nt][e] * p.scale, b, h, row, key);
        } else {
          pv = exp2_approx(fmaf(st[nt][e], p.scale_log2, -sL[q]));
        }
        if (masked) {
          if (key >= p.nk || row >= p.nq || !pol.keep(b, h, row, key)) pv = 0.f;
        }
        st[nt][e] = pv;
        dpt[nt][e] = pv * (dpt[nt][e] - sD[q]);  // dS^T = P^T o (dP^T - D_i), chapter 04's exercise ch04.3
        dpt[nt][e] *= dmod;  // the score modifier's derivative (1 without one)
      }

    // dV_w += P^T dO_i and dK_w += dS^T Q_i: k over the 64 queries, B operands transposed.
#pragma unroll
    for (int kq = 0; kq < Br / 16; ++kq) {
      uint32_t ap[4], as[4];
      ap[0] = pack2<T>(st[2 * kq][0], st[2 * kq][1]);
      ap[1] = pack2<T>(st[2 * kq][2], st[2 * kq][3]);
      ap[2] = pack2<T>(st[2 * kq + 1][0], st[2 * kq + 1][1]);
      ap[3] = pack2<T>(st[2 * kq + 1][2], st[2 * kq + 1][3]);
      as[0] = pack2<T>(dpt[2 * kq][0], dpt[2 * kq][1]);
      as[1] = pack2<T>(dpt[2 * kq][2], dpt[2 * kq][3]);
      as[2] = pack2<T>(dpt[2 * kq + 1][0], dpt[2 * kq + 1][1]);
      as[3] = pack2<T>(dpt[2 * kq + 1][2], dpt[2 * kq + 1][3]);
      if (atomic_dq) {
        // dS^T to shared memory for dQ (row = key, 4 bytes per (row, query pair)).
#pragma unroll
        for (int half = 0; half < 2; ++half) {
          const int nt = 2 * kq + half;
          const int q = nt * 8 + 2 * t;
          const int key0 = kw + g, key1 = kw + g + 8;
          *reinterpret_cast<uint32_t*>(sdS + swizzle<8>(key0, q / 8) * 8 + q % 8) = half ? as[2] : as[0];
          *reinterpret_cast<uint32_t*>(sdS + swizzle<8>(key1, q / 8) * 8 + q % 8) = half ? as[3] : as[1];
        }
      }
#pragma unroll
      for (int dp = 0; dp < DT / 2; ++dp) {
        uint32_t bo[4], bq[4];
        ldmatrix_x4_trans(bo, transB.at(kq * 16, 2 * dp) + odO);
        ldmatrix_x4_trans(bq, transB.at(kq * 16, 2 * dp) + oQ);
        mma_m16n8k16<T>(dv[2 * dp], ap, bo[0], bo[1]);
        mma_m16n8k16<T>(dv[2 * dp + 1], ap, bo[2], bo[3]);
        mma_m16n8k16<T>(dk[2 * dp], as, bq[0], bq[1]);
        mma_m16n8k16<T>(dk[2 * dp + 1], as, bq[2], bq[3]);
      }
    }
    __syncthreads();  // dS^T is complete in shared memory; Q_i, dO_i, LSE_i, D_i are no longer read
    // (the next step writes dS^T again only after its first barrier, when dQ is done)

    // Next step's Q and dO stream in while dQ is computed; its LSE, D come into registers.
    const bool more = s + 1 < n_steps;
    float next_stat = 0.f;
    if (more) {
      issue_step(s + 1);
      next_stat = stats_of_step(s + 1);
    }
    cp_async_commit();

    if (atomic_dq) {
      // dQ_i += tau dS K_j for this warp's 16 queries x D/2 dims, k over the 128 keys.
      float dq[DT / 2][4];
#pragma unroll
      for (int dt = 0; dt < DT / 2; ++dt) dq[dt][0] = dq[dt][1] = dq[dt][2] = dq[dt][3] = 0.f;
#pragma unroll
      for (int kk = 0; kk < Bc / 16; ++kk) {
        uint32_t a[4];
        ldmatrix_x4_trans(a, ds_at + uint32_t(kk * 16 * 8) * 16u);
#pragma unroll
        for (int dp = 0; dp < DT / 4; ++dp) {
          uint32_t bk[4];
          ldmatrix_x4_trans(bk, kq_at[dp] + uint32_t(kk * 16 * KC) * 16u);
          mma_m16n8k16<T>(dq[2 * dp], a, bk[0], bk[1]);
          mma_m16n8k16<T>(dq[2 * dp + 1], a, bk[2], bk[3]);
        }
      }
      float* dqa = p.dq_accum + p.sq.at(b, h);
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        const int row = row0 + qg * 16 + g + 8 * r;
        if (row < p.nq)
#pragma unroll
          for (int dt = 0; dt < DT / 2; ++dt)
            atomic_add2(dqa + row * p.sq.row + dh * (D / 2) + dt * 8 + 2 * t, p.scale * dq[dt][2 * r],
                        p.scale * dq[dt][2 * r + 1]);
      }
    }
    // Nobody reads LSE_i, D_i after the barrier above; the next barrier publishes these.
    if (more && threadIdx.x < 2 * Br) (threadIdx.x < Br ? sL : sD)[threadIdx.x % Br] = next_stat;
  }
  cp_async_wait<0>();

  // dK_j = tau sum dS^T Q and dV_j = sum P^T dO over every query head of the group.
  T* dK = static_cast<T*>(p.dk) + p.sk.at(b, hk);
  T* dV = static_cast<T*>(p.dv) + p.sv.at(b, hk);
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int key = col0 + kw + g + 8 * r;
    if (key >= p.nk) continue;
#pragma unroll
    for (int dt = 0; dt < DT; ++dt) {
      *reinterpret_cast<uint32_t*>(dK + key * p.sk.row + dt * 8 + 2 * t) =
          pack2<T>(p.scale * dk[dt][2 * r], p.scale * dk[dt][2 * r + 1]);
      *reinterpret_cast<uint32_t*>(dV + key * p.sv.row + dt * 8 + 2 * t) =
          pack2<T>(dv[dt][2 * r], dv[dt][2 * r + 1]);
    }
  }
}

/// Deterministic dQ: one thread block per (Q block, query head), the key blocks of the
/// forward lists in a fixed order, dQ_i accumulated in registers and written once. 4 warps
/// x 16 query rows (chapter 04's fa2_bwd_dq with the policy).
template <class T, int D, class Policy>
__global__ void __launch_bounds__(kDqThreads) fa2_bwd_dq(const BwdParams p, const Policy pol) {
  constexpr int KC = D / 8, DT = D / 8, Bc = kDqBc, kThreads = kDqThreads;
  extern __shared__ __align__(128) unsigned char smem[];  // Q_i, dO_i [Br][D]; K_j, V_j [Bc][D]
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
  const int i = blockIdx.x, bh = blockIdx.y, b = bh / p.heads, h = bh % p.heads;
  const int hk = kv_head_of(h, p.heads, p.kv_heads);
  const int row0 = i * Br;
  const T* K = static_cast<const T*>(p.k) + p.sk.at(b, hk);
  const T* V = static_cast<const T*>(p.v) + p.sv.at(b, hk);
  const int owner = p.dq_map.owner(b, h, i), n_part = p.dq_map.n_part[owner];
  const int n_blocks = n_part + p.dq_map.n_full[owner];
  const int* part = p.dq_map.part + std::size_t(owner) * p.dq_map.inner;
  const int* full = p.dq_map.full + std::size_t(owner) * p.dq_map.inner;

  const uint32_t base = smem_u32(smem);
  constexpr uint32_t oQ = 0, odO = Br * D * 2, oK = 2 * Br * D * 2, oV = oK + Bc * D * 2;
  load_tile_ld<Br, D, kThreads>(base + oQ, static_cast<const T*>(p.q) + p.sq.at(b, h), row0, p.nq, p.sq.row);
  load_tile_ld<Br, D, kThreads>(base + odO, static_cast<const T*>(p.dout) + p.so.at(b, h), row0, p.nq, p.so.row);
  cp_async_commit();
  const SwizzledLane<KC> rowA(base, warp * 16 + lane % 16, lane / 16);             // Q_i, dO_i rows of this warp
  const SwizzledLane<KC> colB(base, (lane / 16) * 8 + lane % 8, (lane / 8) % 2);   // K_j^T, V_j^T
  const SwizzledLane<KC> transB(base, lane % 8 + ((lane / 8) % 2) * 8, lane / 16);  // K_j

  float lse2[2], delta[2];
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int row = row0 + warp * 16 + g + 8 * r;
    lse2[r] = lse_log2(p.lse + std::size_t(bh) * p.nq, row, p.nq);
    delta[r] = row < p.nq ? p.delta[std::size_t(bh) * p.nq + row] : 0.f;
  }
  float dq[DT][4];
#pragma unroll
  for (int dt = 0; dt < DT; ++dt) dq[dt][0] = dq[dt][1] = dq[dt][2] = dq[dt][3] = 0.f;

  for (int n = 0; n < n_blocks; ++n) {
    const int j = n < n_part ? part[n] : full[n - n_part];
    __syncthreads();  // every warp is done with K_{j-1}, V_{j-1}
    load_tile_ld<Bc, D, kThreads>(base + oK, K, j * Bc, p.nk, p.sk.row);
    load_tile_ld<Bc, D, kThreads>(base + oV, V, j * Bc, p.nk, p.sv.row);
    cp_async_commit();
    cp_async_wait<0>();
    __syncthreads();
    float s[8][4], dp[8][4];
#pragma unroll
    for (int nt = 0; nt < 8; ++nt)
#pragma unroll
      for (int e = 0; e < 4; ++e) s[nt][e] = dp[nt][e] = 0.f;
#pragma unroll
    for (int kk = 0; kk < D / 16; ++kk) {
      uint32_t aq[4], ao[4];
      ldmatrix_x4(aq, rowA.at(0, 2 * kk) + oQ);
      ldmatrix_x4(ao, rowA.at(0, 2 * kk) + odO);
#pragma unroll
      for (int np = 0; np < 4; ++np) {
        uint32_t bk[4], bv[4];
        ldmatrix_x4(bk, colB.at(np * 16, 2 * kk) + oK);
        ldmatrix_x4(bv, colB.at(np * 16, 2 * kk) + oV);
        mma_m16n8k16<T>(s[2 * np], aq, bk[0], bk[1]);
        mma_m16n8k16<T>(s[2 * np + 1], aq, bk[2], bk[3]);
        mma_m16n8k16<T>(dp[2 * np], ao, bv[0], bv[1]);
        mma_m16n8k16<T>(dp[2 * np + 1], ao, bv[2], bv[3]);
      }
    }
    // P = 2^(score(S tau) log2e - LSE_i log2e), dS = P o (dP - D_i) o score'; the mask on
    // the map's partial blocks only, as in fa2_bwd_main.
    const int col0 = j * Bc;
    const bool masked = n < n_part;
#pragma unroll
    for (int nt = 0; nt < 8; ++nt)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int key = col0 + nt * 8 + 2 * t + (e % 2), row = row0 + warp * 16 + g + 8 * (e / 2);
        float pv, dmod = 1.f;
        if constexpr (Policy::kScore) {
          pv = exp2_approx(pol.score(s[nt][e] * p.scale, b, h, row, key) * float(kLog2e) - lse2[e / 2]);
          dmod = pol.dscore(s[nt][e] * p.scale, b, h, row, key);
        } else {
          pv = exp2_approx(fmaf(s[nt][e], p.scale_log2, -lse2[e / 2]));
        }
        if (masked) {
          if (key >= p.nk || row >= p.nq || !pol.keep(b, h, row, key)) pv = 0.f;
        }
        s[nt][e] = pv * (dp[nt][e] - delta[e / 2]) * dmod;  // dS
      }
#pragma unroll
    for (int kk = 0; kk < Bc / 16; ++kk) {
      uint32_t a[4];
      a[0] = pack2<T>(s[2 * kk][0], s[2 * kk][1]);
      a[1] = pack2<T>(s[2 * kk][2], s[2 * kk][3]);
      a[2] = pack2<T>(s[2 * kk + 1][0], s[2 * kk + 1][1]);
      a[3] = pack2<T>(s[2 * kk + 1][2], s[2 * kk + 1][3]);
#pragma unroll
      for (int dp2 = 0; dp2 < DT / 2; ++dp2) {
        uint32_t bk[4];
        ldmatrix_x4_trans(bk, transB.at(kk * 16, 2 * dp2) + oK);
        mma_m16n8k16<T>(dq[2 * dp2], a, bk[0], bk[1]);
        mma_m16n8k16<T>(dq[2 * dp2 + 1], a, bk[2], bk[3]);
      }
    }
  }
  cp_async_wait<0>();
  T* dQ = static_cast<T*>(p.dq) + p.sq.at(b, h);
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int row = row0 + warp * 16 + g + 8 * r;
    if (row >= p.nq) continue;
#pragma unroll
    for (int dt = 0; dt < DT; ++dt)
      *reinterpret_cast<uint32_t*>(dQ + row * p.sq.row + dt * 8 + 2 * t) =
          pack2<T>(p.scale * dq[dt][2 * r], p.scale * dq[dt][2 * r + 1]);
  }
}

/// The learnable sink's gradient: the sink is one more score with no value row, so
/// dLoss/dsink_h = sum_i P_sink,i (0 - D_i) = -sum_i e^(sink_h - LSE_i) D_i, over every
/// batch and row of head h. One block per head; each thread sums rows in a fixed order,
/// then a fixed-shape tree: the same bits on every run.
template <class Policy>
__global__ void __launch_bounds__(kSinkThreads) fa2_bwd_sink(const BwdParams p, const Policy pol) {
  __shared__ float part[kSinkThreads];
  const int h = blockIdx.x;
  const float sink = pol.sink(h);
  float acc = 0.f;
  for (int r = threadIdx.x; r < p.batch * p.nq; r += kSinkThreads) {
    const std::size_t row = (std::size_t(r / p.nq) * p.heads + h) * p.nq + r % p.nq;
    acc += __expf(sink - p.lse[row]) * p.delta[row];  // LSE >= sink: never above 1
  }
  part[threadIdx.x] = acc;
  __syncthreads();
  for (int w = kSinkThreads / 2; w > 0; w /= 2) {
    if (threadIdx.x < w) part[threadIdx.x] += part[threadIdx.x + w];
    __syncthreads();
  }
  if (threadIdx.x == 0) p.dsink[h] = -part[0];
}

template <class T>
__global__ void fa2_bwd_convert(const BwdParams p) {
  const std::size_t n = std::size_t(p.batch) * p.heads * p.nq * p.d;
  for (std::size_t k = std::size_t(blockIdx.x) * blockDim.x + threadIdx.x; k < n; k += std::size_t(gridDim.x) * blockDim.x)
    static_cast<T*>(p.dq)[k] = T(p.dq_accum[k]);
}

template <class T, int D, class Policy>
void launch_all(const BwdParams& p, const Policy& pol, cudaStream_t s) {
  const bool deterministic = p.deterministic;
  const std::size_t rows = std::size_t(p.batch) * p.heads * p.nq;
  constexpr int kPrepRows = kPrepThreads / 32;  // rows per preprocess block
  fa2_bwd_preprocess<T><<<unsigned((rows + kPrepRows - 1) / kPrepRows), kPrepThreads, 0, s>>>(p, !deterministic);
  if constexpr (Policy::kSink) {
    if (p.dsink) fa2_bwd_sink<Policy><<<p.heads, kSinkThreads, 0, s>>>(p, pol);
  }
  constexpr int main_smem = (2 * kBcMain + 2 * Br) * D * 2 + kBcMain * Br * 2 + 2 * Br * 4;
  constexpr int dq_smem = (2 * Br + 2 * kDqBc) * D * 2;
  static const bool configured = [] {  // once per instantiation
    CUDA_CHECK(cudaFuncSetAttribute(fa2_bwd_main<T, D, Policy>, cudaFuncAttributeMaxDynamicSharedMemorySize, main_smem));
    CUDA_CHECK(cudaFuncSetAttribute(fa2_bwd_dq<T, D, Policy>, cudaFuncAttributeMaxDynamicSharedMemorySize, dq_smem));
    return true;
  }();
  (void)configured;
  fa2_bwd_main<T, D, Policy><<<dim3(ceil_div(p.nk, kBcMain), p.batch * p.kv_heads), kMainThreads, main_smem, s>>>(
      p, !deterministic, pol);
  if (deterministic) {
    fa2_bwd_dq<T, D, Policy><<<dim3(p.dq_map.outer, p.batch * p.heads), kDqThreads, dq_smem, s>>>(p, pol);
  } else {
    fa2_bwd_convert<T><<<kConvertBlocks, kConvertThreads, 0, s>>>(p);
  }
}

}  // namespace

bool launch(const BwdParams& p, const MaskSpec& spec, const Problem& prob, const PolicyData& d, cudaStream_t s) {
  if (prob.dtype != DType::bf16 || p.d != 128) return false;
  visit_policy(spec, prob, d, [&](const auto& pol) {
    launch_all<__nv_bfloat16, 128>(p, pol, s);
    return 0;
  });
  return true;
}

}  // namespace attn::ch06::backward_mask
