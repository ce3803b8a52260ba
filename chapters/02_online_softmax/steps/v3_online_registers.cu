// Chapter 02, step 3 of 4: the online softmax with the row kept in registers.
//
// The series: v3 and v4 are two branches from v2, not one line.
//
//   v1_three_pass.cu               m_i, then l_i, then P: three sweeps over each row
//    '- v2_online.cu               (m_i, l_i) together, online: two sweeps
//        |- v3_online_registers.cu  from v2: the row stays in registers, HBM is read once   <- this file
//        '- v4_fused_values.cu      from v2: (m_i, l_i, O_i) with V, one sweep, P never stored
//
// What changes from v2: the row is loaded once, into registers, and both sweeps run
// there. A block of T threads, each holding kVecsPerThread = 8 float4, keeps up to
// 32 x T scores: rows of up to kRowInRegisters = 32768 scores with T <= 1024. Longer
// rows do not fit, and the launcher says so (the caller then runs v2).
//
//   sweep 1  (m_t, l_t) of the thread's scores, then (m_i, l_i) = (+) over the block    registers
//   sweep 2  P_ij = exp(x_ij - m_t) * w_t / l_i,  w_t = exp(m_t - m_i)                  registers, writes P
//
// Own count per row of N scores: 4N bytes read, 4N + 4 written: the least a softmax
// that stores P can move. The loads and stores carry evict-first hints (__ldcs,
// __stcs): every byte is touched once, so none of it should displace anything in L2.
//
// All eight loads of a thread are issued before the first is used; with T chosen as
// the fewest whole warps that cover the row, each thread holds up to 128 bytes in flight:
//
//     T = 32 * ceil(N / (4 * 8 * 32))        N = 4096: T = 128,  N = 32768: T = 1024
//
//     row  | t0 t1 ... tT-1 | t0 t1 ... tT-1 | ... 8 times ... | t0 t1 ... tT-1 |
//            x[0]             x[1]                               x[7]      (float4 registers)
//
// With its scores in registers, a thread needs no running rescale: it takes their max
// m_t first, then one exponential per score, p = exp(x - m_t), kept where x was. The
// block then merges the thread states in the n-ary form of (+): one block max, one weight
// w_t = exp(m_t - m_i) per thread, one block sum. That hands every thread the weight (+)
// gives its state, so sweep 2 is a multiply by w_t / l_i: one exponential per score in
// all, where v2 evaluates two and a half (and its pairwise butterfly ten per thread).
//
// Every change from v2: load_scores4_once() replaces v2's state_of() (the __ldcs load);
// the block is up to kMaxThreads threads (__launch_bounds__ and registers_threads(N) in
// the launcher); the kernel body loads the row into x[] and runs both sweeps there,
// merging in the n-ary form (block_max, block_sum) and storing P with __stcs; and the
// launcher refuses a row longer than kRowInRegisters (UsageError) instead of launching.
#include "row_ops.cuh"

namespace attn::ch02::v3 {
namespace {

/// The four scores of body float4 `v`, streamed: read once, evict first.
__device__ __forceinline__ float4 load_scores4_once(const float* row, RowSplit g, int v, int last, float tau) {
  const float4 s = __ldcs(reinterpret_cast<const float4*>(row + g.head) + v);
  const int j = g.head + 4 * v;
  return make_float4(score(s.x, j, last, tau), score(s.y, j + 1, last, tau), score(s.z, j + 2, last, tau),
                     score(s.w, j + 3, last, tau));
}

__global__ void __launch_bounds__(kMaxThreads) softmax_rows(RowArgs a) {
  const long long row = blockIdx.x;
  const float* s = a.S + row * a.nk;  // S_i: this block's row
  float* p = a.P + row * a.nk;
  const int last = row_last_visible(a, row);
  const RowSplit g = split_row(s, a.nk);
  const int t = threadIdx.x, T = blockDim.x;

  // The thread's share of S_i, loaded once: 8 float4 (x[k] = float4 t + kT of the body),
  // and at most one head and one tail score.
  float4 x[kVecsPerThread];
#pragma unroll
  for (int k = 0; k < kVecsPerThread; ++k)
    x[k] = t + k * T < g.nvec ? load_scores4_once(s, g, t + k * T, last, a.tau) : neg_inf4();
  const float x_head = t < g.head ? load_score1(s, t, last, a.tau).x : neg_inf<float>();
  const float x_tail = t < g.tail ? load_score1(s, g.tail_start() + t, last, a.tau).x : neg_inf<float>();

  // sweep 1, in registers: the thread's (m_t, l_t), keeping p = exp(x - m_t) where x was
  float m_t = fmaxf(x_head, x_tail);
#pragma unroll
  for (int k = 0; k < kVecsPerThread; ++k) m_t = fmaxf(m_t, max4(x[k]));
  const float shift_t = finite_max(m_t);
  const float p_head = exp_score(x_head, shift_t), p_tail = exp_score(x_tail, shift_t);
  float l_t = p_head + p_tail;
#pragma unroll
  for (int k = 0; k < kVecsPerThread; ++k) {
    x[k] = exp4(x[k], shift_t);  // x[k] now holds p = exp(x - m_t)
    l_t += sum4(x[k]);
  }
  // (m_i, l_i) = (+) of the block's thread states, in the n-ary form of (+):
  //   m_i = max_t m_t,   w_t = exp(m_t - m_i),   l_i = sum_t l_t w_t
  const float m_i = block_max(m_t);
  const float w_t = merge_weights(m_t, m_i).wa;  // this thread's weight in the merge (0 if it saw no key)
  const float l_i = block_sum(l_t * w_t);
  const SoftmaxState<float> st{m_i, l_i};

  // sweep 2, in registers: P_ij = exp(x_ij - m_t) * w_t / l_i, one multiply per score
  const float c_t = l_i > 0.f ? w_t / l_i : 0.f;
  float4* p4 = reinterpret_cast<float4*>(p + g.head);
#pragma unroll
  for (int k = 0; k < kVecsPerThread; ++k)
    if (t + k * T < g.nvec) __stcs(p4 + t + k * T, scale4(x[k], c_t));
  if (t < g.head) p[t] = p_head * c_t;
  if (t < g.tail) p[g.tail_start() + t] = p_tail * c_t;
  if (t == 0) a.lse[row] = st.lse();
}

}  // namespace

void launch(const RowArgs& a) {
  if (!row_fits_in_registers(a.nk)) throw UsageError("v3 keeps a row in registers: rows of at most 32768 scores");
  softmax_rows<<<unsigned(a.rows), registers_threads(a.nk)>>>(a);
}

}  // namespace attn::ch02::v3
