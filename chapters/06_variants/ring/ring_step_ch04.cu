// The adapter from ring attention's per-step compute to chapter 04's kernels.
//
// Chapter 04's kernel interface is included by its path (chapters/04_fa2/...): the
// ring reuses chapter 04's final forward step, which returns O and the LSE, and its
// backward, which takes the LSE and O of the whole row. This file is the only place
// that names chapter 04's launchers; if chapter 04 renames them, only this file changes.
#include "chapters/04_fa2/fa2_kernels.cuh"
#include "common/online_softmax.hpp"
#include "ring/ring_step.cuh"

namespace attn::ch06::ring {

bool step_supports(int d, DType t, bool backward) {
  if (t != DType::bf16 && t != DType::f16) return false;
  return backward ? (d == 64 || d == 128) : (d == 64 || d == 128 || d == 256);
}

bool step_forward(const StepProblem& p, const StepForwardOut& out, cudaStream_t s) {
  ch04::FwdParams f{};
  f.q = p.q;
  f.k = p.k;
  f.v = p.v;
  f.o = out.o;
  f.lse = out.lse;
  f.batch = p.batch;
  f.heads = p.heads;
  f.kv_heads = p.kv_heads;
  f.nq = p.nq;
  f.nk = p.nk;
  f.d = p.d;
  f.scale = p.scale;
  f.scale_log2 = float(double(p.scale) * kLog2e);
  f.causal = p.causal;
  return ch04::final_fwd::launch(f, p.dtype, s);  // chapter 04's final forward kernel (steps/final.cu)
}

bool step_backward(const StepProblem& p, const StepBackwardArgs& a, cudaStream_t s) {
  ch04::BwdParams b{};
  b.q = p.q;
  b.k = p.k;
  b.v = p.v;
  b.o = a.o;
  b.dout = a.dout;
  b.lse = a.lse;
  b.dq = a.dq;
  b.dk = a.dk;
  b.dv = a.dv;
  b.dq_accum = a.dq_accum;
  b.delta = a.delta;
  b.batch = p.batch;
  b.heads = p.heads;
  b.kv_heads = p.kv_heads;
  b.nq = p.nq;
  b.nk = p.nk;
  b.d = p.d;
  b.scale = p.scale;
  b.scale_log2 = float(double(p.scale) * kLog2e);
  b.causal = p.causal;
  return ch04::launch_backward(b, p.dtype, /*deterministic=*/false, s);
}

}  // namespace attn::ch06::ring
