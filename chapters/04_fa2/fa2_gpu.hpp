#pragma once
/// \file fa2_gpu.hpp
/// \brief Chapter 04 on the GPU behind a plain C++ interface (no CUDA types).

#include <memory>
#include <string>
#include <vector>

#include "common/inputs.hpp"
#include "common/problem.hpp"

namespace attn::ch04 {

/// The forward steps by number: the main path v1-v6 (steps/vN_*.cu) and the final kernel
/// (steps/final.cu, number kFinal, `--step final`); the lab's v7-v9 (steps/lab/, LAB.md),
/// built with TUTORIAL_LAB=ON.
constexpr int kFinal = 10;
constexpr int kLastLabStep = 9;
constexpr int kMainSteps[] = {1, 2, 3, 4, 5, 6, kFinal};
constexpr int kLabSteps[] = {7, 8, 9};
/// True for a lab step.
constexpr bool step_in_lab(int step) { return step >= 7 && step <= kLastLabStep; }
/// Whether this build holds the step (a lab step only with TUTORIAL_LAB=ON).
constexpr bool step_built(int step) { return !step_in_lab(step) || TUTORIAL_LAB; }
/// "v2 mma.sync", ..., "final forward".
const char* step_name(int step);
/// Empty when the step runs this problem, else why not (dtype, head dim).
std::string step_unsupported(int step, const Problem& p);

struct GpuForward {
  std::vector<float> o, lse;
  double time_ms = 0;  ///< median of the timed repeats; 0 when not timed
};
GpuForward fa2_forward_gpu(const Problem& p, const AttnInputs& in, int step, bool time);

/// One problem on the device for several steps' runs: Q, K and V uploaded once, O and LSE
/// allocated once, so that the rows of a report do not pay for them again (at the papers'
/// shapes each row would move 200 MB of inputs through the host). Every run poisons O and
/// LSE first. fa2_forward_gpu() is one run of a fresh runner.
class ForwardRunner {
 public:
  ForwardRunner(const Problem& p, const AttnInputs& in);
  ~ForwardRunner();
  ForwardRunner(const ForwardRunner&) = delete;
  ForwardRunner& operator=(const ForwardRunner&) = delete;
  /// As fa2_forward_gpu().
  GpuForward run(int step, bool time);

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

struct GpuBackward {
  std::vector<float> dq, dk, dv;
  double time_ms = 0;  ///< backward only (the forward's O and LSE are inputs)
};
/// Empty when the backward runs this problem, else why not.
std::string backward_unsupported(const Problem& p);
/// Runs the final forward for O and LSE, then the backward (checked once, timed
/// when asked). `deterministic` replaces dQ's atomics with a separate dQ kernel.
GpuBackward fa2_backward_gpu(const Problem& p, const AttnInputs& in, bool deterministic, bool time);

/// Device bytes the forward (and, with `backward`, the backward) allocates.
double fa2_device_bytes(const Problem& p, bool backward);

}  // namespace attn::ch04
