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
#include "fa2_kernels.cuh"

namespace attn::ch04 {
namespace {
using namespace attn::cuda;

constexpr int kMainThreads = 256;  // fa2_bwd_main: 8 warps
constexpr int kBcMain = 128;       // keys per fa2_bwd_main thread block (16 per warp)
constexpr int kThreads = 128;      // fa2_bwd_dq: 4 warps
constexpr int Bc = 64;             // keys per K/V step of fa2_bwd_dq
constexpr int Br = 64;             // queries per step (both kernels)
constexpr int kPrepThreads = 256;  // fa2_bwd_preprocess: one warp per row, 8 rows per block
constexpr int kConvertThreads = 256, kConvertBlocks = 1024;  // fa2_bwd_convert: a grid-stride loop,
                                                              // ~8 blocks per SM of an H100/H200

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
  const T* o = static_cast<const T*>(p.o) + row * p.d;
  const T* dout = static_cast<const T*>(p.dout) + row * p.d;
  float acc = 0.f;
  for (int c = lane; c < p.d; c += 32) {
    acc += float(o[c]) * float(dout[c]);
    if (zero_dq) p.dq_accum[row * p.d + c] = 0.f;
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

template <class T, int D>
__global__ void __launch_bounds__(kMainThreads) fa2_bwd_main(const BwdParams p, bool atomic_dq) {
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
  const int diag = causal_diag(p.nq, p.nk);  // query r sees keys c <= r + diag (common/index.hpp)
  const T* K = static_cast<const T*>(p.k) + (std::size_t(b) * p.kv_heads + hk) * p.nk * D;
  const T* V = static_cast<const T*>(p.v) + (std::size_t(b) * p.kv_heads + hk) * p.nk * D;

  // Causal: query rows before col0 - diag see none of K_j.
  const int i_first = p.causal ? max(0, (col0 - diag) / Br) : 0;
  const int n_qblocks = ceil_div(p.nq, Br);
  const int steps_per_head = max(0, n_qblocks - i_first);
  const int n_steps = steps_per_head * group;

  const uint32_t base = smem_u32(smem);  // tiles at fixed offsets from it (bytes):
  constexpr uint32_t oK = 0, oV = Bc * D * 2, oQ = 2 * Bc * D * 2, odO = oQ + Br * D * 2;
  load_tile<Bc, D, kThreads>(base + oK, K, col0, p.nk);
  load_tile<Bc, D, kThreads>(base + oV, V, col0, p.nk);
  auto head_of = [&](int s) { return std::size_t(b) * p.heads + hk * group + s / steps_per_head; };
  auto issue_step = [&](int s) {  // Q_i, dO_i of step s in flight
    const std::size_t head = head_of(s);
    const int i = i_first + s % steps_per_head;
    load_tile<Br, D, kThreads>(base + oQ, static_cast<const T*>(p.q) + head * p.nq * D, i * Br, p.nq);
    load_tile<Br, D, kThreads>(base + odO, static_cast<const T*>(p.dout) + head * p.nq * D, i * Br, p.nq);
  };
  auto stats_of_step = [&](int s) {  // thread x < 64 fetches LSE of row x, x >= 64 D of row x - 64
    const std::size_t head = head_of(s);
    const int r = (i_first + s % steps_per_head) * Br + threadIdx.x % Br;
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
    const int i = i_first + s % steps_per_head;
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

    // P^T = 2^(S^T tau log2e - LSE_i log2e) and dS^T = P^T o (dP^T - D_i). Element e of tile
    // nt: key kw + g + 8(e/2), query 8nt + 2t + e%2 of Q_i.
    const bool masked = col0 + Bc > p.nk || (p.causal && col0 + Bc - 1 > row0 + diag);
#pragma unroll
    for (int nt = 0; nt < 8; ++nt)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int q = nt * 8 + 2 * t + (e % 2);
        float pv = exp2_approx(fmaf(st[nt][e], p.scale_log2, -sL[q]));
        if (masked) {
          const int key = col0 + kw + g + (e / 2) * 8, row = row0 + q;
          if (key >= p.nk || (p.causal && key > row + diag)) pv = 0.f;
        }
        st[nt][e] = pv;
        // EXERCISE ch04.3: the softmax backward on fragments: dS^T = P^T o (dP^T - D_i)
        //| dpt[nt][e] = pv * dpt[nt][e];  // TODO: your code here
        dpt[nt][e] = pv * (dpt[nt][e] - sD[q]);
        // END EXERCISE
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
      float* dqa = p.dq_accum + head_of(s) * p.nq * D;
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        const int row = row0 + qg * 16 + g + 8 * r;
        if (row < p.nq)
#pragma unroll
          for (int dt = 0; dt < DT / 2; ++dt)
            atomic_add2(dqa + std::size_t(row) * D + dh * (D / 2) + dt * 8 + 2 * t, p.scale * dq[dt][2 * r],
                        p.scale * dq[dt][2 * r + 1]);
      }
    }
    // Nobody reads LSE_i, D_i after the barrier above; the next barrier publishes these.
    if (more && threadIdx.x < 2 * Br) (threadIdx.x < Br ? sL : sD)[threadIdx.x % Br] = next_stat;
  }
  cp_async_wait<0>();

  // dK_j = tau sum dS^T Q and dV_j = sum P^T dO over every query head of the group.
  T* dK = static_cast<T*>(p.dk) + (std::size_t(b) * p.kv_heads + hk) * p.nk * D;
  T* dV = static_cast<T*>(p.dv) + (std::size_t(b) * p.kv_heads + hk) * p.nk * D;
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int key = col0 + kw + g + 8 * r;
    if (key >= p.nk) continue;
#pragma unroll
    for (int dt = 0; dt < DT; ++dt) {
      *reinterpret_cast<uint32_t*>(dK + std::size_t(key) * D + dt * 8 + 2 * t) =
          pack2<T>(p.scale * dk[dt][2 * r], p.scale * dk[dt][2 * r + 1]);
      *reinterpret_cast<uint32_t*>(dV + std::size_t(key) * D + dt * 8 + 2 * t) =
          pack2<T>(dv[dt][2 * r], dv[dt][2 * r + 1]);
    }
  }
}

/// Deterministic dQ: one thread block per (Q block, query head), K/V blocks in a fixed
/// order, dQ_i accumulated in registers and written once. 4 warps x 16 query rows.
template <class T, int D>
__global__ void __launch_bounds__(kThreads) fa2_bwd_dq(const BwdParams p) {
  constexpr int KC = D / 8, DT = D / 8;
  extern __shared__ __align__(128) unsigned char smem[];  // Q_i, dO_i [Br][D]; K_j, V_j [Bc][D]
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
  const int i = blockIdx.x, bh = blockIdx.y, b = bh / p.heads, h = bh % p.heads;
  const int hk = kv_head_of(h, p.heads, p.kv_heads);
  const int row0 = i * Br, diag = causal_diag(p.nq, p.nk);
  const T* K = static_cast<const T*>(p.k) + (std::size_t(b) * p.kv_heads + hk) * p.nk * D;
  const T* V = static_cast<const T*>(p.v) + (std::size_t(b) * p.kv_heads + hk) * p.nk * D;
  int n_end = p.nk;
  if (p.causal) n_end = min(p.nk, min(row0 + Br, p.nq) + diag);
  const int n_blocks = n_end > 0 ? ceil_div(n_end, Bc) : 0;

  const uint32_t base = smem_u32(smem);
  constexpr uint32_t oQ = 0, odO = Br * D * 2, oK = 2 * Br * D * 2, oV = oK + Bc * D * 2;
  load_tile<Br, D, kThreads>(base + oQ, static_cast<const T*>(p.q) + std::size_t(bh) * p.nq * D, row0, p.nq);
  load_tile<Br, D, kThreads>(base + odO, static_cast<const T*>(p.dout) + std::size_t(bh) * p.nq * D, row0, p.nq);
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

  for (int j = 0; j < n_blocks; ++j) {
    __syncthreads();  // every warp is done with K_{j-1}, V_{j-1}
    load_tile<Bc, D, kThreads>(base + oK, K, j * Bc, p.nk);
    load_tile<Bc, D, kThreads>(base + oV, V, j * Bc, p.nk);
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
    const int col0 = j * Bc;
    const bool masked = col0 + Bc > p.nk || (p.causal && col0 + Bc - 1 > row0 + diag);
#pragma unroll
    for (int nt = 0; nt < 8; ++nt)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        float pv = exp2_approx(fmaf(s[nt][e], p.scale_log2, -lse2[e / 2]));
        if (masked) {
          const int key = col0 + nt * 8 + 2 * t + (e % 2), row = row0 + warp * 16 + g + 8 * (e / 2);
          if (key >= p.nk || (p.causal && key > row + diag)) pv = 0.f;
        }
        s[nt][e] = pv * (dp[nt][e] - delta[e / 2]);  // dS
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
  T* dQ = static_cast<T*>(p.dq) + std::size_t(bh) * p.nq * D;
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int row = row0 + warp * 16 + g + 8 * r;
    if (row >= p.nq) continue;
#pragma unroll
    for (int dt = 0; dt < DT; ++dt)
      *reinterpret_cast<uint32_t*>(dQ + std::size_t(row) * D + dt * 8 + 2 * t) =
          pack2<T>(p.scale * dq[dt][2 * r], p.scale * dq[dt][2 * r + 1]);
  }
}

template <class T>
__global__ void fa2_bwd_convert(const BwdParams p) {
  const std::size_t n = std::size_t(p.batch) * p.heads * p.nq * p.d;
  for (std::size_t k = std::size_t(blockIdx.x) * blockDim.x + threadIdx.x; k < n; k += std::size_t(gridDim.x) * blockDim.x)
    static_cast<T*>(p.dq)[k] = T(p.dq_accum[k]);
}

template <class T, int D>
void launch_all(const BwdParams& p, bool deterministic, cudaStream_t s) {
  const std::size_t rows = std::size_t(p.batch) * p.heads * p.nq;
  constexpr int kPrepRows = kPrepThreads / 32;  // rows per preprocess block
  fa2_bwd_preprocess<T><<<unsigned((rows + kPrepRows - 1) / kPrepRows), kPrepThreads, 0, s>>>(p, !deterministic);
  constexpr int main_smem = (2 * kBcMain + 2 * Br) * D * 2 + kBcMain * Br * 2 + 2 * Br * 4;
  constexpr int dq_smem = (2 * Br + 2 * Bc) * D * 2;
  static const bool configured = [] {  // once per instantiation
    CUDA_CHECK(cudaFuncSetAttribute(fa2_bwd_main<T, D>, cudaFuncAttributeMaxDynamicSharedMemorySize, main_smem));
    CUDA_CHECK(cudaFuncSetAttribute(fa2_bwd_dq<T, D>, cudaFuncAttributeMaxDynamicSharedMemorySize, dq_smem));
    return true;
  }();
  (void)configured;
  fa2_bwd_main<T, D><<<dim3(ceil_div(p.nk, kBcMain), p.batch * p.kv_heads), kMainThreads, main_smem, s>>>(
      p, !deterministic);
  if (deterministic) {
    fa2_bwd_dq<T, D><<<dim3(ceil_div(p.nq, Br), p.batch * p.heads), kThreads, dq_smem, s>>>(p);
  } else {
    fa2_bwd_convert<T><<<kConvertBlocks, kConvertThreads, 0, s>>>(p);
  }
}

template <class T>
bool launch_dtype(const BwdParams& p, bool deterministic, cudaStream_t s) {
  switch (p.d) {
    case 64: launch_all<T, 64>(p, deterministic, s); return true;
    case 128: launch_all<T, 128>(p, deterministic, s); return true;
    default: return false;
  }
}

}  // namespace

bool launch_backward(const BwdParams& p, DType t, bool deterministic, cudaStream_t s) {
  if (t == DType::bf16) return launch_dtype<__nv_bfloat16>(p, deterministic, s);
  if (t == DType::f16) return launch_dtype<__half>(p, deterministic, s);
  return false;
}

}  // namespace attn::ch04
