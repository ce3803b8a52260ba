#pragma once
/// \file timing.cuh
/// \brief Event timing: warm-up, an L2 flush before every repeat, the median of >= 20.
///
/// The flush leaves L2 *clean*: it writes a scrap buffer twice the L2's size (whatever the
/// previous repeat left is evicted), then reads a second buffer of the same size, whose clean
/// lines push the write's dirty ones out before the timer starts. After the write alone the
/// timed kernel would start on an L2 full of dirty lines, and each line it misses on would cost
/// a write-back beside its own reads: about 8 us on every short measurement (chapter 07's
/// probe, chapters/07_paged_radix/scripts/flush_probe.py). bench/peer_timer.py flushes the
/// peers' L2 the same way. `TUTORIAL_L2_FLUSH=write` selects the write alone (the flush before
/// 2026-12-01 evening), for before/after comparisons.

#include <functional>

namespace attn {

struct Timing {
  double median_ms = 0, min_ms = 0, max_ms = 0;
  int repeats = 0;
};

struct TimingOptions {
  int warmup = 3;
  int repeats = 20;      ///< never fewer than 20 for a reported number
  bool flush_l2 = true;  ///< l2_flush() between repeats
};

/// The L2 flush before a timed repeat `r` (asynchronous, on the default stream): a write of
/// the scrap buffer (bytes r & 0xff), then a read of the second buffer, unless
/// TUTORIAL_L2_FLUSH=write.
void l2_flush(int r);

/// Times `launch` (which enqueues work on the default stream) with CUDA events.
/// The flush is outside the timed region.
Timing time_gpu(const std::function<void()>& launch, TimingOptions opt = {});

}  // namespace attn
