#pragma once
/// \file fa1_gpu.hpp
/// \brief Chapter 03's kernels behind a plain C++ interface (no CUDA types), so that
///        main.cpp and the tests compile with or without the CUDA toolkit.
///
/// Forward (fa1.cu): one thread block per (batch, query head), Algorithm 1's loop
/// order, K_j / V_j / Q_i / S_ij in shared memory, (m, l, O) in fp32 global scratch.
/// Backward (fa1_backward.cu): a D = rowsum(dO o O) kernel, then one thread block per
/// (batch, KV head) with K/V blocks outside, dK_j / dV_j in registers and dQ read,
/// updated and written back in global memory, without atomics.
/// Both compute with plain fp32 FMA on CUDA cores (the README says why).

#include <string>
#include <vector>

#include "common/inputs.hpp"
#include "common/problem.hpp"

namespace attn::ch03 {

/// Empty when the kernels can run `p`; otherwise why not (fp16/bf16 only, d = dv in
/// {32, 64, 128}). The CPU models run every problem.
inline std::string kernel_unsupported(const Problem& p) {
  if (p.dtype == DType::f32) return "the FA1 kernels take fp16 or bf16 inputs (fp32 runs on the CPU model only)";
  if (p.d != p.dv) return "the FA1 kernels need d = dv";
  if (p.d != 32 && p.d != 64 && p.d != 128) return "the FA1 kernels are built for d = 32, 64, 128";
  return {};
}

struct GpuForward {
  std::vector<float> o, lse;  ///< downloaded results (poisoned before the run)
  double time_ms = 0;         ///< median of the timed repeats (0 when not timed)
};

struct GpuBackward {
  std::vector<float> dq, dk, dv;  ///< downloaded results (poisoned before the run)
  double time_ms = 0;             ///< the D pass and the main kernel together
  double dot_ms = 0;              ///< the D pass alone
};

/// Device bytes the forward (and, with `backward`, the backward) allocates: inputs,
/// outputs and the O(N) scratch.
double fa1_device_bytes(const Problem& p, bool backward);

/// Runs the forward once for the check, then, when `time` is set, times it (median of
/// 20 with an L2 flush before each; `warmup` untimed runs first).
GpuForward fa1_forward_gpu(const Problem& p, const AttnInputs& in, bool time, int warmup = 3);

/// Runs the forward (for O and LSE), then the backward once for the check, then times
/// the backward when `time` is set. Needs in.dout.
GpuBackward fa1_backward_gpu(const Problem& p, const AttnInputs& in, bool time, int warmup = 3);

}  // namespace attn::ch03
