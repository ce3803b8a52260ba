// Chapter 04 - FlashAttention-2 forward, built in steps. Each file is a whole kernel;
// `diff` two neighbours to see one move.
//
// > v1_loop_swap.cu          Q outer, K/V inner, grid (Nq/Br, B*H); scalar FMA math
//   v2_mma.cu                tensor cores: mma.sync m16n8k16, Q split over 4 warps, P in registers
//   v3_ldmatrix_swizzle.cu   ldmatrix fragments from XOR-swizzled shared memory: no bank conflicts
//   v4_cp_async.cu           cp.async: K_{j+1} and V_j stream in while the other product runs
//   v5_exp2_causal.cu        exp2 with tau*log2(e) folded in, causal block skipping, heaviest-first order
//   v6_final.cu              two 16-row tiles per warp (Br = 128), deferred row sums, coalesced
//                            O stores through shared memory; bf16 and fp16, d in {64, 128, 256}
//
// This step: FlashAttention-1's loops, swapped. Chapter 03 walked K/V blocks in the
// outer loop and, for each, every Q block, reading and writing (m, l, O) in HBM on
// every step. Here a thread block owns one Q block for its whole life and walks the
// K/V blocks: (m_i, l_i, O_i) never leave the chip, O_i is divided by l_i once at
// the end, and the LSE is written once. Because Q blocks are independent, the
// sequence becomes a grid dimension: grid = (ceil(Nq / Br), B * Hq), thousands of
// blocks where FA1 had B * H.
//
// The math is plain FMA in fp32 on bf16 tiles: thread x owns query row row0 + x
// (Q_i is kept transposed in shared memory so that the 128 threads read 128
// consecutive elements), and all threads read the same K_j / V_j element at once
// (a broadcast).
//
//        Q_i (Br = 128 rows)        K_j, V_j (Bc = 32 keys, in shared memory)
//        thread 0   -> row 0        s_j = tau q . k_j for 32 keys, online softmax,
//        thread 1   -> row 1        o = alpha o + sum_j p_j v_j   (o: d floats in registers)
//        ...
//        thread 127 -> row 127
#include "common/online_softmax.hpp"
#include "common/cuda/types.cuh"
#include "fa2_kernels.cuh"

namespace attn::ch04 {
namespace {

constexpr int Br = 128, Bc = 32, kThreads = Br;

template <class T, int D>
__global__ void __launch_bounds__(kThreads) fa2_fwd_v1(const FwdParams p) {
  __shared__ T sQt[D][Br];  // Q_i transposed: sQt[k][x] = Q[row0 + x][k]   (32 KB at d = 128)
  __shared__ T sK[Bc][D];   // K_j                                            (8 KB)
  __shared__ T sV[Bc][D];   // V_j                                            (8 KB)
  const int x = threadIdx.x;
  const int i_blk = blockIdx.x;
  const int bh = blockIdx.y, b = bh / p.heads, h = bh % p.heads;
  const int hk = h / (p.heads / p.kv_heads);
  const T* Q = static_cast<const T*>(p.q) + std::size_t(bh) * p.nq * D;
  const T* K = static_cast<const T*>(p.k) + (std::size_t(b) * p.kv_heads + hk) * p.nk * D;
  const T* V = static_cast<const T*>(p.v) + (std::size_t(b) * p.kv_heads + hk) * p.nk * D;
  T* O = static_cast<T*>(p.o) + std::size_t(bh) * p.nq * D;
  float* LSE = p.lse + std::size_t(bh) * p.nq;
  const int row0 = i_blk * Br, row = row0 + x;
  const int diag = p.nk - p.nq;  // row i sees keys j <= i + diag
  const int n_blocks = (p.nk + Bc - 1) / Bc;

  for (int e = x; e < Br * D; e += kThreads) {  // coalesced read, transposed store
    const int r = e / D, k = e % D;
    sQt[k][r] = row0 + r < p.nq ? Q[std::size_t(row0 + r) * D + k] : from_float<T>(0.f);
  }

  float o[D];  // O_i row x, unnormalised
#pragma unroll
  for (int k = 0; k < D; ++k) o[k] = 0.f;
  float m = neg_inf<float>(), l = 0.f;  // running max (raw scores) and row sum

  for (int j = 0; j < n_blocks; ++j) {
    __syncthreads();  // every thread is done with K_{j-1} and V_{j-1}
    for (int e = x; e < Bc * D; e += kThreads) {
      const int r = e / D, k = e % D;
      const bool in = j * Bc + r < p.nk;
      sK[r][k] = in ? K[std::size_t(j * Bc + r) * D + k] : from_float<T>(0.f);
      sV[r][k] = in ? V[std::size_t(j * Bc + r) * D + k] : from_float<T>(0.f);
    }
    __syncthreads();  // K_j, V_j (and, the first time, Q_i) are in shared memory

    // S_ij for this thread's row: 32 dot products of length d.
    float s[Bc];
#pragma unroll
    for (int c = 0; c < Bc; ++c) s[c] = 0.f;
    for (int k = 0; k < D; ++k) {
      const float q = to_float(sQt[k][x]);
#pragma unroll
      for (int c = 0; c < Bc; ++c) s[c] = fmaf(q, to_float(sK[c][k]), s[c]);
    }
    float mx = neg_inf<float>();
#pragma unroll
    for (int c = 0; c < Bc; ++c) {
      const int col = j * Bc + c;
      if (col >= p.nk || (p.causal && col > row + diag)) s[c] = neg_inf<float>();
      mx = fmaxf(mx, s[c]);
    }

    // Online softmax (common/online_softmax.hpp): m_new = max(m, rowmax(S)),
    // P = exp(tau (S - m_new)), O and l rescaled by exp(tau (m - m_new)).
    const float m_new = fmaxf(m, mx);
    const float shift = finite_max(m_new);  // an all-masked row shifts by 0, not -inf
    const float alpha = __expf((m - shift) * p.scale);
    m = m_new;
    float rowsum = 0.f;
#pragma unroll
    for (int c = 0; c < Bc; ++c) {
      s[c] = __expf((s[c] - shift) * p.scale);
      rowsum += s[c];
    }
    l = l * alpha + rowsum;
#pragma unroll
    for (int k = 0; k < D; ++k) {  // O_i += P_ij V_j (unrolled: o[] must stay in registers)
      float acc = o[k] * alpha;
#pragma unroll
      for (int c = 0; c < Bc; ++c) acc = fmaf(s[c], to_float(sV[c][k]), acc);
      o[k] = acc;
    }
  }

  // Epilogue: O_i / l_i and LSE_i = tau m_i + log l_i, once.
  if (row < p.nq) {
    const float inv = l > 0.f ? 1.f / l : 0.f;  // an empty row's output is 0
#pragma unroll
    for (int k = 0; k < D; ++k) O[std::size_t(row) * D + k] = from_float<T>(o[k] * inv);
    LSE[row] = l > 0.f ? BaseE::lse(m * p.scale, l) : neg_inf<float>();
  }
}

template <class T, int D>
void launch(const FwdParams& p, cudaStream_t s) {
  const dim3 grid((p.nq + Br - 1) / Br, p.batch * p.heads);
  fa2_fwd_v1<T, D><<<grid, kThreads, 0, s>>>(p);
}

}  // namespace

bool launch_v1(const FwdParams& p, DType t, cudaStream_t s) {
  if (t != DType::bf16) return false;
  switch (p.d) {
    case 64: launch<__nv_bfloat16, 64>(p, s); return true;
    case 128: launch<__nv_bfloat16, 128>(p, s); return true;
    default: return false;
  }
}

}  // namespace attn::ch04
