// The C library's ABI (python/csrc/lineage_c.h) through C++, without a GPU: the version, the
// scratch sizes, and that every refused call returns a code and a message and never aborts.
// With a Hopper GPU present the device checks pass instead, and the test says so.
#include <cuda_runtime.h>
#include <doctest/doctest.h>

#include <cstring>
#include <string>

#include "lineage_c.h"

namespace {

bool have_device() {
  int n = 0;
  const bool ok = cudaGetDeviceCount(&n) == cudaSuccess && n > 0;
  cudaGetLastError();
  return ok;
}

}  // namespace

TEST_CASE("lineage C ABI: version and scratch sizes") {
  CHECK(attn_lineage_abi_version() == 2);
  char err[256];
  size_t small = 0, big = 0;
  REQUIRE(attn_lineage_fa3_backward_workspace(1, 1, 100, 64, &small, err, sizeof err) == ATTN_LINEAGE_OK);
  REQUIRE(attn_lineage_fa3_backward_workspace(2, 8, 1000, 128, &big, err, sizeof err) == ATTN_LINEAGE_OK);
  CHECK(small > 0);
  CHECK(big > small);
  CHECK(small % 256 == 0);
  // d = 128: 13 blocks of 80 rows for 1000 queries; two floats a row, d floats of dQ a row.
  const size_t rows = size_t(2) * 8 * 13 * 80;
  CHECK(big >= rows * 8 + rows * 128 * 4);
  CHECK(attn_lineage_fa3_backward_workspace(1, 1, 100, 256, &small, err, sizeof err) == ATTN_LINEAGE_BAD_ARGUMENT);
  CHECK(std::string(err).find("head dim 256") != std::string::npos);
  CHECK(attn_lineage_fa3_backward_workspace(0, 1, 100, 64, &small, err, sizeof err) == ATTN_LINEAGE_BAD_ARGUMENT);
  CHECK(attn_lineage_fa3_backward_workspace(1, 1, 100, 64, nullptr, err, sizeof err) == ATTN_LINEAGE_BAD_ARGUMENT);
}

TEST_CASE("lineage C ABI: refused calls return a code and a message") {
  char err[256];
  std::memset(err, 'x', sizeof err);
  if (have_device()) {
    MESSAGE("a CUDA device is present: the refusals without one are not exercised here");
    // Bad sizes are refused before any launch, on any GPU.
    const int code = attn_lineage_fa3_forward(0, nullptr, ATTN_LINEAGE_BF16, nullptr, nullptr, nullptr, nullptr,
                                              nullptr, 1, 3, 2, 128, 128, 64, 0.f, 0, err, sizeof err);
    CHECK(code != ATTN_LINEAGE_OK);
    CHECK(std::strlen(err) > 0);
    return;
  }
  CHECK(attn_lineage_device_ready(0, err, sizeof err) != ATTN_LINEAGE_OK);
  CHECK(std::strlen(err) > 0);
  CHECK(std::strlen(err) < sizeof err);
  CHECK(attn_lineage_fa3_forward(0, nullptr, ATTN_LINEAGE_BF16, nullptr, nullptr, nullptr, nullptr, nullptr, 1, 1, 1,
                                 128, 128, 64, 0.f, 0, err, sizeof err) != ATTN_LINEAGE_OK);
  CHECK(attn_lineage_fa3_backward(0, nullptr, ATTN_LINEAGE_BF16, nullptr, nullptr, nullptr, nullptr, nullptr, nullptr,
                                  nullptr, nullptr, nullptr, nullptr, 0, 1, 1, 1, 128, 128, 64, 0.f, 0, 0, err,
                                  sizeof err) != ATTN_LINEAGE_OK);
  size_t bytes = 0;
  CHECK(attn_lineage_paged_decode_workspace(0, 1, 8, 2, 128, 4, 16, &bytes, err, sizeof err) != ATTN_LINEAGE_OK);
  // A one-byte buffer gets an empty string, a null buffer nothing: never an overrun.
  char tiny[1] = {'x'};
  CHECK(attn_lineage_device_ready(0, tiny, 1) != ATTN_LINEAGE_OK);
  CHECK(tiny[0] == '\0');
  CHECK(attn_lineage_device_ready(0, nullptr, 0) != ATTN_LINEAGE_OK);
}
