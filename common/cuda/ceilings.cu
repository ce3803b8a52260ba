#include <cublas_v2.h>

#include <map>

#include "common/cuda/buffer.cuh"
#include "common/cuda/ceilings.cuh"
#include "common/cuda/timing.cuh"
#include "common/cuda/types.cuh"

namespace attn {
namespace {

/// Streams the buffer with 16-byte loads, four in flight per thread, and folds them
/// into one word per thread block so the compiler cannot drop the loads.
__global__ void read_stream_kernel(const uint4* __restrict__ x, std::size_t n, unsigned* __restrict__ sink) {
  unsigned acc = 0;
  const std::size_t stride = std::size_t(gridDim.x) * blockDim.x;
  std::size_t i = std::size_t(blockIdx.x) * blockDim.x + threadIdx.x;
  for (; i + 3 * stride < n; i += 4 * stride) {
    const uint4 a = __ldcs(x + i), b = __ldcs(x + i + stride), c = __ldcs(x + i + 2 * stride),
                d = __ldcs(x + i + 3 * stride);
    acc ^= a.x ^ a.y ^ a.z ^ a.w ^ b.x ^ b.y ^ b.z ^ b.w ^ c.x ^ c.y ^ c.z ^ c.w ^ d.x ^ d.y ^ d.z ^ d.w;
  }
  for (; i < n; i += stride) {
    const uint4 a = __ldcs(x + i);
    acc ^= a.x ^ a.y ^ a.z ^ a.w;
  }
  if (acc == 0x9e3779b9u) sink[blockIdx.x] = acc;  // practically never taken, but not provably
}

/// Random values in [-1, 1) so the GEMM is not timed on zeros.
template <class T>
__global__ void fill_random_kernel(T* x, std::size_t n, unsigned seed) {
  for (std::size_t i = std::size_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += std::size_t(gridDim.x) * blockDim.x) {
    unsigned h = unsigned(i) * 2654435761u ^ seed;
    h ^= h >> 15;
    h *= 2246822519u;
    h ^= h >> 13;
    x[i] = from_float<T>(float(h & 0xffff) / 32768.0f - 1.0f);
  }
}

void cublas_check(cublasStatus_t s, const char* what) {
  if (s != CUBLAS_STATUS_SUCCESS) throw CudaError(std::string(what) + " failed: cuBLAS status " + std::to_string(int(s)));
}

}  // namespace

double measure_read_gbps() {
  static double cached = 0;
  if (cached > 0) return cached;
  const std::size_t bytes = std::size_t(2) << 30;
  DeviceBuffer<uint4> x(bytes / sizeof(uint4));
  CUDA_CHECK(cudaMemset(x.get(), 0x5a, x.bytes()));
  int dev = 0, sms = 0;
  CUDA_CHECK(cudaGetDevice(&dev));
  CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
  const int blocks = sms * 4;
  DeviceBuffer<unsigned> sink(blocks);
  const Timing t = time_gpu([&] {
    read_stream_kernel<<<blocks, 512>>>(x.get(), x.size(), sink.get());
    CUDA_CHECK_LAUNCH("read_stream_kernel");
  });
  cached = double(bytes) / (t.median_ms * 1e-3) / 1e9;
  return cached;
}

double measure_gemm_tflops(DType dt) {
  static std::map<DType, double> cache;
  if (auto it = cache.find(dt); it != cache.end()) return it->second;
  const int n = 8192;
  const std::size_t elems = std::size_t(n) * n;
  cublasHandle_t h;
  cublas_check(cublasCreate(&h), "cublasCreate");
  double tflops = 0;
  dispatch_dtype(dt, [&](auto tag) {
    using T = decltype(tag);
    DeviceBuffer<T> a(elems), b(elems), c(elems);
    fill_random_kernel<<<1024, 256>>>(a.get(), elems, 1u);
    fill_random_kernel<<<1024, 256>>>(b.get(), elems, 2u);
    CUDA_CHECK_LAUNCH("fill_random_kernel");
    const float alpha = 1.f, beta = 0.f;
    const cudaDataType_t ty = dt == DType::f32 ? CUDA_R_32F : dt == DType::f16 ? CUDA_R_16F : CUDA_R_16BF;
    const cublasComputeType_t ct = dt == DType::f32 ? CUBLAS_COMPUTE_32F_PEDANTIC : CUBLAS_COMPUTE_32F;
    const Timing t = time_gpu([&] {
      cublas_check(cublasGemmEx(h, CUBLAS_OP_N, CUBLAS_OP_N, n, n, n, &alpha, a.get(), ty, n, b.get(), ty, n,
                                &beta, c.get(), ty, n, ct, CUBLAS_GEMM_DEFAULT),
                   "cublasGemmEx");
    });
    tflops = 2.0 * n * double(n) * n / (t.median_ms * 1e-3) / 1e12;
  });
  cublasDestroy(h);
  cache[dt] = tflops;
  return tflops;
}

Ceilings measure_ceilings(DType t) {
  Ceilings c;
  c.read_gbps = measure_read_gbps();
  c.gemm_tflops = measure_gemm_tflops(t);
  c.gemm_what = std::string("cuBLAS ") + dtype_name(t) + " GEMM 8192^3";
  return c;
}

}  // namespace attn
