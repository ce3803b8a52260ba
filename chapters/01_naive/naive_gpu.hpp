#pragma once
/// \file naive_gpu.hpp
/// \brief Chapter 01 on the GPU, behind a plain C++ interface (no CUDA types), so
///        main.cpp and the tests compile with or without the CUDA toolkit.

#include <string>
#include <vector>

#include "common/inputs.hpp"
#include "common/problem.hpp"

namespace attn::ch01 {

/// The two pipelines: hand-written tiled GEMMs, or cuBLAS GEMMs around the same softmax.
enum class Pipeline { handwritten, cublas };
const char* pipeline_name(Pipeline p);

struct GpuForward {
  std::vector<float> o, lse;   ///< downloaded results (poisoned before the run)
  double time_ms = 0;          ///< median of the timed repeats (0 when not timed)
  double qk_ms = 0, softmax_ms = 0, pv_ms = 0;  ///< each kernel timed on its own
};

/// Device bytes the pipeline allocates (Q, K, V, O, LSE, S, P).
double naive_device_bytes(const Problem& p, Pipeline which);

/// Runs the pipeline once for the check, then, when `time` is set, times the whole
/// pipeline and each kernel (median of 20 with L2 flush).
GpuForward naive_forward_gpu(const Problem& p, const AttnInputs& in, Pipeline which, bool time);

/// Runs only the row-softmax kernel on a given S (rows x cols, fp32) with the
/// problem's causal rule; returns P and the LSE. Used by the exercise tests.
void softmax_rows_gpu(const Problem& p, const std::vector<float>& s, std::vector<float>* prob,
                      std::vector<float>* lse);

}  // namespace attn::ch01
