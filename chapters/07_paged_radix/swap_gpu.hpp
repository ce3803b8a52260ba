#pragma once
/// \file swap_gpu.hpp
/// \brief The copy rate that prices a swap: pinned host memory <-> device, one page of
///        one layer per copy, as a swapping scheduler moves them. Defined only when the
///        chapter is built with CUDA.

#include <cstddef>

namespace attn::ch07 {

struct CopyRates {
  double d2h_gbps = 0, h2d_gbps = 0;  ///< median over repeats of `blocks` copies of `block_bytes`
  std::size_t block_bytes = 0;
  int blocks = 0;
};

/// `blocks` cudaMemcpyAsync calls of `block_bytes` each, between a pinned host buffer
/// and a device buffer, in each direction; warm-up, then the median of 20 repeats.
CopyRates measure_pinned_copy(std::size_t block_bytes, int blocks);

}  // namespace attn::ch07
