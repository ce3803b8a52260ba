// Pinned host <-> device copy rates for the swap model (see swap_gpu.hpp).
#include "swap_gpu.hpp"

#include <cuda_runtime.h>

#include <algorithm>
#include <vector>

#include "common/cuda/check.cuh"

namespace attn::ch07 {

CopyRates measure_pinned_copy(std::size_t block_bytes, int blocks) {
  CopyRates r;
  r.block_bytes = block_bytes;
  r.blocks = blocks;
  const std::size_t n = block_bytes * std::size_t(blocks);
  void* host = nullptr;
  void* dev = nullptr;
  CUDA_CHECK(cudaMallocHost(&host, n));  // pinned: the DMA engines read it directly
  CUDA_CHECK(cudaMalloc(&dev, n));
  CUDA_CHECK(cudaMemset(dev, 0, n));
  std::fill_n(static_cast<char*>(host), n, 1);
  cudaStream_t st;
  CUDA_CHECK(cudaStreamCreate(&st));
  cudaEvent_t a, b;
  CUDA_CHECK(cudaEventCreate(&a));
  CUDA_CHECK(cudaEventCreate(&b));
  for (int dir = 0; dir < 2; ++dir) {
    std::vector<float> ms;
    constexpr int kRepeats = 20;  // timed samples, the project's minimum; one warm-up before them
    for (int rep = 0; rep < kRepeats + 1; ++rep) {
      CUDA_CHECK(cudaEventRecord(a, st));
      for (int i = 0; i < blocks; ++i) {
        char* h = static_cast<char*>(host) + std::size_t(i) * block_bytes;
        char* d = static_cast<char*>(dev) + std::size_t(i) * block_bytes;
        if (dir == 0) CUDA_CHECK(cudaMemcpyAsync(h, d, block_bytes, cudaMemcpyDeviceToHost, st));
        else CUDA_CHECK(cudaMemcpyAsync(d, h, block_bytes, cudaMemcpyHostToDevice, st));
      }
      CUDA_CHECK(cudaEventRecord(b, st));
      CUDA_CHECK(cudaEventSynchronize(b));
      float t = 0;
      CUDA_CHECK(cudaEventElapsedTime(&t, a, b));
      if (rep > 0) ms.push_back(t);  // the first is the warm-up
    }
    std::sort(ms.begin(), ms.end());
    const double gbps = double(n) / (ms[ms.size() / 2] * 1e-3) / 1e9;
    (dir == 0 ? r.d2h_gbps : r.h2d_gbps) = gbps;
  }
  CUDA_CHECK(cudaEventDestroy(a));
  CUDA_CHECK(cudaEventDestroy(b));
  CUDA_CHECK(cudaStreamDestroy(st));
  CUDA_CHECK(cudaFree(dev));
  CUDA_CHECK(cudaFreeHost(host));
  return r;
}

}  // namespace attn::ch07
