#pragma once
/// \file step_args.cuh
/// \brief A forward step's arguments for one problem (step_launch.cuh's StepArgs): the
///        device pointers, the sizes, the base-2 scale, the query tiles and the SM count of
///        the current GPU. Host code only.
///
/// The one place that fills StepArgs from a Problem: chapter 05's host side (fa3_gpu.cu),
/// chapter 06's packed GQA forward (gqa_mla/gqa_mla_gpu.cu) and the C library
/// (python/csrc/lineage_c.cu) all call it.

#include <cuda_runtime.h>

#include "common/cuda/check.cuh"
#include "common/index.hpp"
#include "common/online_softmax.hpp"
#include "common/problem.hpp"
#include "step_launch.cuh"

namespace attn::ch05 {

/// Q, K, V in the problem's dtype (an fp8 step: Q8, K8, V8^T, and the caller sets nk_pad and
/// the scale pointers); O and the LSE as the step writes them. The SM count is the current
/// device's.
inline StepArgs make_step_args(const Problem& p, const void* q, const void* k, const void* v, void* o,
                               float* lse) {
  StepArgs a;
  a.problem = p;
  a.q = q;
  a.k = k;
  a.v = v;
  a.params.o = o;
  a.params.lse = lse;
  a.params.batch = p.batch;
  a.params.heads = p.heads;
  a.params.kv_heads = p.kv_heads;
  a.params.nq = p.nq;
  a.params.nk = p.nk;
  a.params.scale_log2 = float(p.softmax_scale() * kLog2e);
  a.params.causal = p.causal;
  a.params.n_qtiles = ceil_div(p.nq, kBr);
  int dev = 0;
  CUDA_CHECK(cudaGetDevice(&dev));
  CUDA_CHECK(cudaDeviceGetAttribute(&a.sms, cudaDevAttrMultiProcessorCount, dev));
  return a;
}

}  // namespace attn::ch05
