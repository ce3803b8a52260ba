#pragma once
/// \file timing.cuh
/// \brief Event timing: warm-up, an L2 flush before every repeat, the median of >= 20.

#include <functional>

namespace attn {

struct Timing {
  double median_ms = 0, min_ms = 0, max_ms = 0;
  int repeats = 0;
};

struct TimingOptions {
  int warmup = 3;
  int repeats = 20;      ///< never fewer than 20 for a reported number
  bool flush_l2 = true;  ///< write a buffer twice the L2's size between repeats
};

/// Times `launch` (which enqueues work on the default stream) with CUDA events.
/// The flush is outside the timed region.
Timing time_gpu(const std::function<void()>& launch, TimingOptions opt = {});

}  // namespace attn
