#pragma once
/// \file step_launch.cuh
/// \brief How the host side (fa3_gpu.cu) hands a problem to one step's kernel: device
///        pointers and parameters in, a ready-to-call launch out. Each step file builds
///        its own tensor maps (their boxes are the step's tiles) once, in prepare_vN(),
///        so that a timed launch is nothing but the kernel launch.

#include <cuda_runtime.h>

#include <functional>

#include "common/problem.hpp"
#include "fa3_common.cuh"

namespace attn::ch05 {

struct StepArgs {
  Problem problem;
  const void* q = nullptr;  ///< device Q, K, V in the problem's dtype (fp8 step: Q8, K8, V8^T)
  const void* k = nullptr;
  const void* v = nullptr;
  Fa3Params params;         ///< o, lse and the sizes filled in; scale pointers for fp8
  int sms = 132;            ///< multiprocessors, for the persistent grid
  int nk_pad = 0;           ///< fp8: row pitch of V^T in keys (a multiple of 16)
};

struct PreparedStep {
  std::function<void()> launch;  ///< enqueues the kernel on the default stream
  int grid = 0;
  int smem_bytes = 0;
};

PreparedStep prepare_v1(const StepArgs& a);
PreparedStep prepare_v2(const StepArgs& a);
PreparedStep prepare_v3(const StepArgs& a);
PreparedStep prepare_v4(const StepArgs& a);
PreparedStep prepare_v5(const StepArgs& a);
PreparedStep prepare_v6(const StepArgs& a);
PreparedStep prepare_v7(const StepArgs& a);

}  // namespace attn::ch05
