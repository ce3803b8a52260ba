// doctest's main for the GPU test binaries: without a CUDA device every run
// exits with 77, which ctest reports as "skipped" (never as passed).
#define DOCTEST_CONFIG_IMPLEMENT
#include <doctest/doctest.h>

#include <cstring>
#include <iostream>
#include <string>

#include "common/device.hpp"

int main(int argc, char** argv) {
  bool listing = false;
  for (int a = 1; a < argc; ++a)
    if (std::strstr(argv[a], "list-test") || std::strstr(argv[a], "-ltc") || std::strstr(argv[a], "help"))
      listing = true;
  if (!listing) {
    std::string why;
    if (!attn::query_device(&why)) {
      std::cout << "SKIPPED: " << why << "\n";
      return 77;
    }
  }
  doctest::Context ctx(argc, argv);
  return ctx.run();
}
