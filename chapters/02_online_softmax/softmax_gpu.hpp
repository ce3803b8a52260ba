#pragma once
/// \file softmax_gpu.hpp
/// \brief Chapter 02 on the GPU, behind a plain C++ interface (no CUDA types), so
///        main.cpp and the tests compile with or without the CUDA toolkit.
///
/// Four kernels, one file each under steps/:
///
///     v1  three_pass        safe softmax, 3 sweeps over HBM          (steps/v1_three_pass.cu)
///     v2  online            online (m, l), 2 sweeps over HBM         (steps/v2_online.cu)
///     v3  online_registers  online, the row in registers: 1 sweep    (steps/v3_online_registers.cu)
///     v4  fused             (m, l, O) with V, 1 sweep, no P          (steps/v4_fused_values.cu)

#include <memory>
#include <vector>

#include "common/problem.hpp"
#include "scores.hpp"
#include "softmax_model.hpp"

namespace attn::ch02 {

enum class Kernel { three_pass, online, online_registers, fused };

const char* kernel_name(Kernel k);
/// The CPU model (and traffic formula) each kernel follows.
Variant kernel_variant(Kernel k);
/// All four, in order.
std::vector<Kernel> all_kernels();

struct GpuResult {
  std::vector<float> p;    ///< P for v1-v3 (poisoned before the run), empty for v4
  std::vector<float> o;    ///< O for v4, empty otherwise
  std::vector<float> lse;  ///< every kernel
  double time_ms = 0;      ///< median of the timed repeats, L2 flushed before each (0 when not timed)
  bool streamed = false;   ///< v3 only: the row was longer than kRowInRegisters, so v2 ran
};

/// Device memory the chapter's buffers take: S, P, V, O and the LSE (all fp32).
inline double softmax_device_bytes(const Problem& p) {
  return 4.0 * (2.0 * double(p.s_elems()) + double(p.v_elems()) + double(p.o_elems()) + double(p.lse_elems()));
}

/// The inputs uploaded once, the outputs allocated once; run() poisons the outputs
/// with NaN, launches one kernel, downloads what it wrote and, when asked, times it.
class GpuSoftmax {
 public:
  GpuSoftmax(const Problem& p, const SoftmaxInputs& in);
  ~GpuSoftmax();
  GpuSoftmax(const GpuSoftmax&) = delete;
  GpuSoftmax& operator=(const GpuSoftmax&) = delete;

  GpuResult run(Kernel k, bool time);

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace attn::ch02
