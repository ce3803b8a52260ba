#pragma once
/// \file check.cuh
/// \brief Every CUDA runtime call is checked, and so is every launch.
///
///     CUDA_CHECK(cudaMalloc(&p, bytes));
///     kernel<<<grid, block>>>(...);
///     CUDA_CHECK_LAUNCH("kernel");   // launch error; with ATTN_SYNC=1 also the kernel's own
///
/// Set ATTN_SYNC=1 in the environment to synchronise after every launch, so an
/// illegal access is reported at the kernel that made it.

#include <cuda_runtime.h>

#include <stdexcept>
#include <string>

namespace attn {

struct CudaError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

void cuda_fail(cudaError_t e, const char* what, const char* file, int line);

inline void cuda_check(cudaError_t e, const char* what, const char* file, int line) {
  if (e != cudaSuccess) cuda_fail(e, what, file, line);
}

void check_launch(const char* what, const char* file, int line);

}  // namespace attn

#define CUDA_CHECK(call) ::attn::cuda_check((call), #call, __FILE__, __LINE__)
#define CUDA_CHECK_LAUNCH(name) ::attn::check_launch((name), __FILE__, __LINE__)
