#pragma once
/// \file ring_step.cuh
/// \brief The per-step compute of the GPU ring: one (query chunk, key chunk) pair is an
///        ordinary attention problem, run by chapter 04's final forward and its
///        backward behind one small adapter (ring_step_ch04.cu, the only file that
///        includes chapter 04).
#include <cuda_runtime.h>

#include "common/dtype.hpp"

namespace attn::ch06::ring {

/// One attention problem in the project's layout: Q, O [batch][heads][nq][d],
/// K, V [batch][kv_heads][nk][d], LSE [batch][heads][nq] (fp32, natural log).
/// `causal` is bottom-right aligned (row i sees keys j <= i + nk - nq).
struct StepProblem {
  const void* q = nullptr;
  const void* k = nullptr;
  const void* v = nullptr;
  int batch = 1, heads = 1, kv_heads = 1, nq = 0, nk = 0, d = 0;
  float scale = 0;
  bool causal = false;
  DType dtype = DType::bf16;
};

/// Forward: writes the normalised O (dtype) and the LSE of the pair.
struct StepForwardOut {
  void* o = nullptr;
  float* lse = nullptr;
};

/// Backward: given the *final* O and LSE of these query rows (after every step's
/// merge) and dO, writes this pair's dQ, dK, dV (dtype). dq_accum and delta are
/// the kernel's own scratch ([batch][heads][nq][d] and [batch][heads][nq], fp32).
struct StepBackwardArgs {
  const void* o = nullptr;
  const void* dout = nullptr;
  const float* lse = nullptr;
  void* dq = nullptr;
  void* dk = nullptr;
  void* dv = nullptr;
  float* dq_accum = nullptr;
  float* delta = nullptr;
};

/// False when the kernel has no instance for this dtype / head dim.
bool step_forward(const StepProblem& p, const StepForwardOut& out, cudaStream_t s);
bool step_backward(const StepProblem& p, const StepBackwardArgs& a, cudaStream_t s);
/// Head dims the forward (and, with `backward`, the backward) supports.
bool step_supports(int d, DType t, bool backward);

}  // namespace attn::ch06::ring
