#pragma once
// For the GPU tests of sm_90a-only kernels (a helper, no tests of its own): on another GPU the
// calling test ends with ctest's skip code.
#include <cstdlib>
#include <iostream>
#include <string>

#include "common/device.hpp"

namespace testing_support {

/// True on a Hopper GPU. A GPU test binary starts only where a device exists (gpu_main.cpp).
inline bool on_hopper() {
  const auto dev = attn::query_device();
  return dev && attn::hopper_device(*dev, "");
}

/// Ends this test case's process with ctest's skip code (77) unless the GPU is a Hopper one:
/// ctest runs each doctest case as its own process, so that case alone reports "skipped".
inline void require_hopper(const std::string& what) {
  const auto dev = attn::query_device();
  std::string why;
  if (dev && attn::hopper_device(*dev, what, &why)) return;
  std::cout << "SKIPPED: " << (dev ? why : what + ": no CUDA device") << std::endl;
  std::exit(77);
}

}  // namespace testing_support
