// Chapter 02, step 4 of 4: one sweep with values, carrying (m_i, l_i, O_i).
//
// The series: v3 and v4 are two branches from v2, not one line.
//
//   v1_three_pass.cu               m_i, then l_i, then P: three sweeps over each row
//    '- v2_online.cu               (m_i, l_i) together, online: two sweeps
//        |- v3_online_registers.cu  from v2: the row stays in registers, HBM is read once
//        '- v4_fused_values.cu      from v2: (m_i, l_i, O_i) with V, one sweep, P never stored   <- this file
//
// What changes from v2: the second sweep existed only to write P. When what is wanted
// is O_i = sum_j P_ij V_j, the weighted sum can ride along with (m, l) and be rescaled by
// the same weights, O_i left unnormalised until the end:
//
//   (m_i, l_i, O_i) <- (m_i, l_i, O_i) (+) (m_ij, l_ij, O_ij)       for each tile j of Bc keys
//       m_ij = max_k x_ik,  P_ij = exp(x_ij - m_ij),  l_ij = sum_k P_ij,  O_ij = P_ij V_j
//   O_i <- O_i / l_i,   LSE_i = m_i + log l_i                         after the last tile
//
// One sweep over S, P never leaves the chip, and the LSE (what FlashAttention's backward
// keeps) comes for free. This is FlashAttention's inner loop with the scores given
// instead of computed: chapter 03 computes S_ij = tau Q_i K_j^T in the same place.
//
//   one block of Br = 8 warps per 8 consecutive rows of one (batch, head); warp w owns
//   row i0 + w. Each step stages V_j (Bc x dv) in shared memory for all 8 rows:
//
//        keys j0 .. j0+63                       V_j (64 x dv), shared memory
//   w0  | lane 0..31 | lane 0..31 |  S_ij       +--------------------------+
//   w1  | x[0]       | x[1]       |  registers  | dims: lane 0 | lane 1 | ..| each lane owns
//   ..                                          +--------------------------+ dv/32 dims of O_i
//   w7                              P_ij -> shared memory (Br x Bc), read back as broadcasts
//
// Own count: S read once (4N bytes per row), V_j read once per block of Br rows
// (4 N dv bytes per block), O and the LSE written once (4 dv + 4 per row). Each score
// costs dv multiply-adds with V_j read from shared memory: with dv = 64 this kernel is
// bound by those reads and FMAs, not by HBM. Sharing each read of V_j across several
// rows in registers is a matrix multiply, which the tensor-core chapters take up.
//
// Every change from v2: load_dims() (a lane's R dims of a row of V_j) replaces
// state_of(); the kernel becomes a template on D = dv with one warp per row and kBr rows
// per block (the grid is batch x heads x ceil(nq / kBr) blocks, launched per dv); its
// body is the tiled loop above, which stages V_j, forms P_ij in shared memory, adds
// P_ij V_j and merges with merge_into(); it writes O and the LSE instead of P; and the
// launcher refuses a dv other than 32, 64 or 128 (UsageError).
#include "row_ops.cuh"

namespace attn::ch02::v4 {
namespace {

/// This lane's R dims of one row of V_j, in one shared-memory load (R = 1, 2 or 4).
template <int R>
__device__ __forceinline__ void load_dims(const float* src, float (&dst)[R]) {
  if constexpr (R == 4) {
    const float4 t = *reinterpret_cast<const float4*>(src);
    dst[0] = t.x, dst[1] = t.y, dst[2] = t.z, dst[3] = t.w;
  } else if constexpr (R == 2) {
    const float2 t = *reinterpret_cast<const float2*>(src);
    dst[0] = t.x, dst[1] = t.y;
  } else {
    dst[0] = src[0];
  }
}

template <int D>
__global__ void __launch_bounds__(kBr * 32) softmax_rows(RowArgs a) {
  constexpr int R = D / 32;        // O_i dims per lane
  constexpr int kKeys = kBc / 32;  // scores per lane per tile
  __shared__ __align__(16) float V_j[kBc][D];
  __shared__ __align__(16) float P_ij[kBr][kBc];

  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int blocks_per_head = cuda::ceil_div(a.nq, kBr);
  const long long bh = blockIdx.x / blocks_per_head;  // b * heads + h
  const int i = int(blockIdx.x % blocks_per_head) * kBr + warp;
  const bool active = i < a.nq;  // the last block of a head may have idle warps
  const int b = int(bh / a.heads), h = int(bh % a.heads);
  const int hk = cuda::kv_head_of(h, a.heads, a.kv_heads);
  const long long row = bh * a.nq + i;
  const float* s = a.S + (active ? row : 0) * a.nk;  // S_i
  const float* v = a.V + ((long long)b * a.kv_heads + hk) * a.nk * D;
  const int last = active ? row_last_visible(a, row) : -1;

  SoftmaxState<float> st = SoftmaxState<float>::identity();  // (m_i, l_i)
  float o[R] = {};                                            // this lane's dims of O_i
  for (int j0 = 0; j0 < a.nk; j0 += kBc) {
    const int bc = min(kBc, a.nk - j0);
    __syncthreads();  // every warp is done with the previous V_j and P_ij
    // V_j: bc rows of D floats, contiguous; 16-byte loads by the whole block, zeros past nk
    const float4* src = reinterpret_cast<const float4*>(v + (long long)j0 * D);
    float4* dst = reinterpret_cast<float4*>(&V_j[0][0]);
    for (int e = threadIdx.x; e < kBc * D / 4; e += kBr * 32)
      dst[e] = e < bc * D / 4 ? __ldg(src + e) : make_float4(0.f, 0.f, 0.f, 0.f);
    __syncthreads();
    if (!active) continue;

    // S_ij: lane holds keys j0 + lane + 32u, so each load is one 128-byte row segment
    float x[kKeys];
    float m_ij = neg_inf<float>();
#pragma unroll
    for (int u = 0; u < kKeys; ++u) {
      const int j = j0 + lane + 32 * u;
      x[u] = j <= last ? a.tau * __ldg(s + j) : neg_inf<float>();
      m_ij = fmaxf(m_ij, x[u]);
    }
    m_ij = warp_max(m_ij);
    const float shift = finite_max(m_ij);
    float l_ij = 0.f;
#pragma unroll
    for (int u = 0; u < kKeys; ++u) {
      const float p = exp_score(x[u], shift);
      P_ij[warp][lane + 32 * u] = p;
      l_ij += p;
    }
    l_ij = warp_sum(l_ij);
    __syncwarp();  // P_ij of this warp is written

    // O_ij = P_ij V_j, this lane's R dims: four keys per broadcast read of P_ij
    float o_ij[R] = {};
#pragma unroll 4
    for (int k = 0; k < kBc; k += 4) {
      const float4 p4 = *reinterpret_cast<const float4*>(&P_ij[warp][k]);
      const float pk[4] = {p4.x, p4.y, p4.z, p4.w};
#pragma unroll
      for (int q = 0; q < 4; ++q) {
        float vk[R];
        load_dims<R>(&V_j[k + q][lane * R], vk);  // consecutive lanes, consecutive words
#pragma unroll
        for (int r = 0; r < R; ++r) o_ij[r] = fmaf(pk[q], vk[r], o_ij[r]);
      }
    }
    // (m_i, l_i, O_i) <- (m_i, l_i, O_i) (+) (m_ij, l_ij, O_ij)
    merge_into(st, o, SoftmaxState<float>{m_ij, l_ij}, o_ij, R);
  }
  if (!active) return;

  float* out = a.O + row * D + lane * R;
#pragma unroll
  for (int r = 0; r < R; ++r) out[r] = st.l > 0.f ? o[r] / st.l : 0.f;  // O_i / l_i; 0 for an empty row
  if (lane == 0) a.lse[row] = st.lse();
}

}  // namespace

void launch(const RowArgs& a) {
  const long long blocks = (long long)(a.rows / a.nq) * cuda::ceil_div(a.nq, kBr);
  switch (a.dv) {
    case 32: softmax_rows<32><<<unsigned(blocks), kBr * 32>>>(a); break;
    case 64: softmax_rows<64><<<unsigned(blocks), kBr * 32>>>(a); break;
    case 128: softmax_rows<128><<<unsigned(blocks), kBr * 32>>>(a); break;
    default: throw UsageError("the fused kernel supports dv = 32, 64 or 128");
  }
}

}  // namespace attn::ch02::v4
