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

namespace {

/// What chapter 04's forward and backward parameters (FwdParams, BwdParams) take alike from a
/// step problem: Q, K, V, the sizes and the scales.
template <class Params>
void set_step_problem(Params& x, const StepProblem& p) {
  x.q = p.q;
  x.k = p.k;
  x.v = p.v;
  x.batch = p.batch;
  x.heads = p.heads;
  x.kv_heads = p.kv_heads;
  x.nq = p.nq;
  x.nk = p.nk;
  x.d = p.d;
  x.scale = p.scale;
  x.scale_log2 = float(double(p.scale) * kLog2e);
  x.causal = p.causal;
}

}  // namespace

bool step_forward(const StepProblem& p, const StepForwardOut& out, cudaStream_t s) {
  ch04::FwdParams f{};
  set_step_problem(f, p);
  f.o = out.o;
  f.lse = out.lse;
  return ch04::final_fwd::launch(f, p.dtype, s);  // chapter 04's final forward kernel (steps/final.cu)
}

bool step_backward(const StepProblem& p, const StepBackwardArgs& a, cudaStream_t s) {
  ch04::BwdParams b{};
  set_step_problem(b, p);
  b.o = a.o;
  b.dout = a.dout;
  b.lse = a.lse;
  b.dq = a.dq;
  b.dk = a.dk;
  b.dv = a.dv;
  b.dq_accum = a.dq_accum;
  b.delta = a.delta;
  return ch04::launch_backward(b, p.dtype, /*deterministic=*/false, s);
}

}  // namespace attn::ch06::ring
