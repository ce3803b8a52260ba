// Chapter 02, step 2 of 4: the online softmax in two sweeps over HBM.
//
// The series: v3 and v4 are two branches from v2, not one line.
//
//   v1_three_pass.cu               m_i, then l_i, then P: three sweeps over each row
//    '- v2_online.cu               (m_i, l_i) together, online: two sweeps   <- this file
//        |- v3_online_registers.cu  from v2: the row stays in registers, HBM is read once
//        '- v4_fused_values.cu      from v2: (m_i, l_i, O_i) with V, one sweep, P never stored
//
// What changes from v1: sweeps 1 and 2 become one. Each thread keeps a running
// (m, l) and folds in every float4 it loads as a state of its own,
//
//   (m, l) <- (m, l) (+) (max_k x_k, sum_k exp(x_k - max_k x_k))     k = the 4 lanes
//
// so l is rescaled by exp(m_old - m_new) whenever the maximum grows (Milakov and
// Gimelshein 2018). The 256 thread states are then merged with the same (+): a
// warp-shuffle butterfly across lanes, then across the 8 warps through shared memory
// (block_merge in row_ops.cuh). Because (+) is associative and commutative, any split
// of the row, merged in any order, gives the (m_i, l_i) of the whole row.
//
//   sweep 1  (m_i, l_i) = (+) over the row      reads the row
//   sweep 2  P_ij = exp(x_ij - m_i) / l_i       reads it again, writes P
//
// Own count per row of N scores: 2 x 4N bytes read, 4N + 4 written. The price of not
// knowing m_i in advance is in the exponentials: sweep 1 evaluates 1.5 per score (4 for
// the float4, 2 for the merge), where v1's sweep 2 evaluated 1.
//
//   one block of 256 threads per row, the same waves as v1:
//
//     row  | t0 t1 ... t255 | t0 t1 ... t255 | t0 ... t255 | t0 ... t255 | t0 ...
//          '---------------- one wave: 4 x 256 float4 = 4096 scores -----'
//
// Every change from v1: state_of() (the (m, l) of one float4) is new; sweeps 1 and 2
// become the one (m, l) sweep, merged across the block by block_merge() where v1 called
// block_max() and block_sum(); the LSE comes from the merged state (st.lse()).
#include "row_ops.cuh"

namespace attn::ch02::v2 {
namespace {

/// The (m, l) of four scores: their max, and the sum of exp(x - max).
__device__ __forceinline__ SoftmaxState<float> state_of(float4 x) {
  const float m = max4(x);
  return {m, sum4(exp4(x, finite_max(m)))};
}

__global__ void __launch_bounds__(kThreads) softmax_rows(RowArgs a) {
  const long long row = blockIdx.x;
  const float* s = a.S + row * a.nk;  // S_i: this block's row
  float* p = a.P + row * a.nk;
  const int last = row_last_visible(a, row);
  const RowSplit g = split_row(s, a.nk);

  // sweep 1: (m_i, l_i), online: every float4 merged into the thread's state,
  // then the thread states merged across the block
  SoftmaxState<float> st = SoftmaxState<float>::identity();
  sweep(s, g, last, a.tau, [&](float4 x) { st = merge(st, state_of(x)); });
  st = block_merge(st);
  const float shift = finite_max(st.m);

  // sweep 2: P_ij = exp(x_ij - m_i) / l_i
  const float inv_l = st.l > 0.f ? 1.f / st.l : 0.f;
  sweep_write(s, p, g, last, a.tau, [&](float4 x) { return scale4(exp4(x, shift), inv_l); });
  if (threadIdx.x == 0) a.lse[row] = st.lse();
}

}  // namespace

void launch(const RowArgs& a) {
  softmax_rows<<<unsigned(a.rows), kThreads>>>(a);
}

}  // namespace attn::ch02::v2
