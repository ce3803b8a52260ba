// Chapter 02, step 1 of 4: the safe softmax in three sweeps over HBM.
//
// The series: v3 and v4 are two branches from v2, not one line.
//
//   v1_three_pass.cu               m_i, then l_i, then P: three sweeps over each row   <- this file
//    '- v2_online.cu               (m_i, l_i) together, online: two sweeps
//        |- v3_online_registers.cu  from v2: the row stays in registers, HBM is read once
//        '- v4_fused_values.cu      from v2: (m_i, l_i, O_i) with V, one sweep, P never stored
//
// This is chapter 01's softmax_rows (01_naive/naive.cu) with 16-byte loads and stores
// and kUnroll loads in flight per thread; the algorithm is unchanged:
//
//   sweep 1  m_i  = max_j x_ij                      reads the row
//   sweep 2  l_i  = sum_j exp(x_ij - m_i)           reads it again
//   sweep 3  P_ij = exp(x_ij - m_i) / l_i           reads it a third time, writes P
//
// with x_ij = tau * S_ij, and -inf for a masked key. Its own count per row of N scores:
// 3 x 4N bytes read, 4N + 4 written (P and the LSE). An empty row (every key masked)
// shifts by finite_max(-inf) = 0, so it gets P = 0 and LSE = -inf, not NaN.
//
//   one block of 256 threads per row (blockIdx.x = row); each sweep, thread t loads
//   float4 t, t+256, t+512, t+768 of the body before using any of them:
//
//     row  | t0 t1 ... t255 | t0 t1 ... t255 | t0 ... t255 | t0 ... t255 | t0 ...
//          '---------------- one wave: 4 x 256 float4 = 4096 scores -----'
//
// Every change from chapter 01's softmax_rows: the row is read with sweep() and
// written with sweep_write() (row_ops.cuh: 16-byte loads and stores, kUnroll in flight,
// the unaligned head and tail floats apart), and exp is exp_score() (ex2.approx with
// log2 e applied after the subtraction) where chapter 01 calls __expf.
#include "row_ops.cuh"

namespace attn::ch02::v1 {
namespace {

__global__ void __launch_bounds__(kThreads) softmax_rows(RowArgs a) {
  const long long row = blockIdx.x;
  const float* s = a.S + row * a.nk;  // S_i: this block's row
  float* p = a.P + row * a.nk;
  const int last = row_last_visible(a, row);
  const RowSplit g = split_row(s, a.nk);

  // sweep 1: m_i = max_j x_ij
  float m = neg_inf<float>();
  sweep(s, g, last, a.tau, [&](float4 x) { m = fmaxf(m, max4(x)); });
  m = block_max(m);
  const float shift = finite_max(m);

  // sweep 2: l_i = sum_j exp(x_ij - m_i)
  float l = 0.f;
  sweep(s, g, last, a.tau, [&](float4 x) { l += sum4(exp4(x, shift)); });
  l = block_sum(l);

  // sweep 3: P_ij = exp(x_ij - m_i) / l_i
  const float inv_l = l > 0.f ? 1.f / l : 0.f;
  sweep_write(s, p, g, last, a.tau, [&](float4 x) { return scale4(exp4(x, shift), inv_l); });
  if (threadIdx.x == 0) a.lse[row] = l > 0.f ? m + logf(l) : neg_inf<float>();
}

}  // namespace

void launch(const RowArgs& a) {
  softmax_rows<<<unsigned(a.rows), kThreads>>>(a);
}

}  // namespace attn::ch02::v1
