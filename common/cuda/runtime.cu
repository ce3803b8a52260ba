// CUDA-side implementations of check.cuh, buffer.cuh, timing.cuh and the device query.
#include <algorithm>
#include <cstdlib>
#include <iostream>
#include <string>
#include <vector>

#include "common/cuda/buffer.cuh"
#include "common/cuda/check.cuh"
#include "common/cuda/timing.cuh"
#include "common/device.hpp"
#include "common/parallel.hpp"

namespace attn {

void cuda_fail(cudaError_t e, const char* what, const char* file, int line) {
  std::string f = file;
  if (auto s = f.rfind('/'); s != std::string::npos) f = f.substr(s + 1);
  throw CudaError(f + ":" + std::to_string(line) + ": " + what + " failed: " + cudaGetErrorString(e));
}

void check_launch(const char* what, const char* file, int line) {
  cuda_check(cudaGetLastError(), what, file, line);
  static const bool sync = [] {
    const char* s = std::getenv("ATTN_SYNC");
    return s && *s && *s != '0';
  }();
  if (sync) cuda_check(cudaDeviceSynchronize(), what, file, line);
}

// ----------------------------------------------------------------------------- device query

bool cuda_built() { return true; }

std::optional<DeviceInfo> query_device(std::string* why_not) {
  int count = 0;
  const cudaError_t e = cudaGetDeviceCount(&count);
  if (e != cudaSuccess || count == 0) {
    // The runtime's words for a machine without a GPU mislead ("CUDA driver version is
    // insufficient for CUDA runtime version" is what it says when there is no driver at
    // all): say what they mean, and keep the runtime's own words for anything else.
    std::string reason = "none found";
    if (e == cudaErrorInsufficientDriver || e == cudaErrorNoDevice || (e == cudaSuccess && count == 0))
      reason = "no NVIDIA GPU or driver found";
    else if (e != cudaSuccess)
      reason = cudaGetErrorString(e);
    if (why_not) *why_not = "no CUDA device: " + reason;
    cudaGetLastError();  // clear the sticky error of a failed query
    return std::nullopt;
  }
  int dev = 0;
  CUDA_CHECK(cudaGetDevice(&dev));
  cudaDeviceProp prop{};
  CUDA_CHECK(cudaGetDeviceProperties(&prop, dev));
  DeviceInfo d;
  d.name = prop.name;
  d.cc_major = prop.major;
  d.cc_minor = prop.minor;
  d.sms = prop.multiProcessorCount;
  d.l2_bytes = std::size_t(prop.l2CacheSize);
  d.smem_per_block_optin = prop.sharedMemPerBlockOptin;
  CUDA_CHECK(cudaMemGetInfo(&d.free_mem, &d.total_mem));
  return d;
}

// ----------------------------------------------------------------------------- tensors

namespace {

/// fn(begin, end) over [0, n) in chunks of 1M elements, on every host thread (each element is
/// converted on its own: the same values as one loop). Small tensors stay on this thread.
template <class F>
void for_chunks(std::size_t n, F&& fn) {
  constexpr std::size_t kChunk = std::size_t(1) << 20;
  if (n <= kChunk) return fn(std::size_t(0), n);
  parallel_for(long((n + kChunk - 1) / kChunk),
               [&](long c) { fn(std::size_t(c) * kChunk, std::min(n, std::size_t(c + 1) * kChunk)); });
}

}  // namespace

DeviceTensor DeviceTensor::from_host(const std::vector<float>& h, DType dtype) {
  DeviceTensor t(dtype, h.size());
  if (h.empty()) return t;
  if (dtype == DType::f32) {
    CUDA_CHECK(cudaMemcpy(t.data(), h.data(), h.size() * 4, cudaMemcpyHostToDevice));
  } else {
    std::vector<uint16_t> bits(h.size());
    for_chunks(h.size(), [&](std::size_t b, std::size_t e) {
      for (std::size_t i = b; i < e; ++i)
        bits[i] = dtype == DType::bf16 ? float_to_bf16_bits(h[i]) : float_to_half_bits(h[i]);
    });
    CUDA_CHECK(cudaMemcpy(t.data(), bits.data(), bits.size() * 2, cudaMemcpyHostToDevice));
  }
  return t;
}

std::vector<float> DeviceTensor::to_host() const {
  std::vector<float> h(n_);
  if (!n_) return h;
  if (dtype_ == DType::f32) {
    CUDA_CHECK(cudaMemcpy(h.data(), data(), n_ * 4, cudaMemcpyDeviceToHost));
  } else {
    std::vector<uint16_t> bits(n_);
    CUDA_CHECK(cudaMemcpy(bits.data(), data(), n_ * 2, cudaMemcpyDeviceToHost));
    for_chunks(n_, [&](std::size_t b, std::size_t e) {
      for (std::size_t i = b; i < e; ++i)
        h[i] = dtype_ == DType::bf16 ? bf16_bits_to_float(bits[i]) : half_bits_to_float(bits[i]);
    });
  }
  return h;
}

// ----------------------------------------------------------------------------- timing

namespace {

/// Twice the L2's size (at least 64 MB): a flush buffer is that big.
std::size_t flush_bytes() {
  int dev = 0, l2 = 0;
  CUDA_CHECK(cudaGetDevice(&dev));
  CUDA_CHECK(cudaDeviceGetAttribute(&l2, cudaDevAttrL2CacheSize, dev));
  return std::max<std::size_t>(2 * std::size_t(l2), 64u << 20);
}

/// The scrap buffer written first; writing it evicts whatever the previous repeat left.
DeviceBuffer<unsigned char>& flush_buffer() {
  static DeviceBuffer<unsigned char> buf(flush_bytes());
  return buf;
}

/// The second buffer, read after the write: its clean lines push the write's dirty lines
/// out of L2 (written back now, outside the timer), so the timed kernel starts on an L2 of
/// clean lines that are none of its data. Zeros, written once.
DeviceBuffer<uint4>& flush_read_buffer() {
  static DeviceBuffer<uint4> buf = [] {
    DeviceBuffer<uint4> b(flush_bytes() / sizeof(uint4));
    CUDA_CHECK(cudaMemset(b.get(), 0, b.bytes()));
    return b;
  }();
  return buf;
}

/// Reads every 16 bytes of `x` once (a grid-stride loop). The sum is stored only when it is
/// impossible for zeros (never), so the loads cannot be removed and nothing is written.
__global__ void read_all(const uint4* __restrict__ x, std::size_t n, unsigned* sink) {
  unsigned acc = 0;
  for (std::size_t i = std::size_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += std::size_t(gridDim.x) * blockDim.x) {
    const uint4 v = x[i];
    acc ^= v.x ^ v.y ^ v.z ^ v.w;
  }
  if (acc == 0x9e3779b9u) *sink = acc;
}

/// TUTORIAL_L2_FLUSH=write selects the old flush (the write alone, which leaves L2 full of
/// dirty lines); anything else, or unset, the clean one.
bool flush_write_only() {
  static const bool w = [] {
    const char* e = std::getenv("TUTORIAL_L2_FLUSH");
    return e && std::string(e) == "write";
  }();
  return w;
}

}  // namespace

void l2_flush(int r) {
  auto& buf = flush_buffer();
  CUDA_CHECK(cudaMemsetAsync(buf.get(), r & 0xff, buf.bytes()));
  if (flush_write_only()) return;
  auto& rd = flush_read_buffer();
  constexpr int kThreads = 512, kBlocksPerSm = 4;  // enough loads in flight to stream at full bandwidth
  static const int blocks = [] {
    int dev = 0, sms = 0;
    CUDA_CHECK(cudaGetDevice(&dev));
    CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
    return kBlocksPerSm * sms;
  }();
  read_all<<<blocks, kThreads>>>(rd.get(), rd.size(), reinterpret_cast<unsigned*>(buf.get()));
  CUDA_CHECK_LAUNCH("read_all (L2 flush)");
}

Timing time_gpu(const std::function<void()>& launch, TimingOptions opt) {
  opt.repeats = std::max(opt.repeats, 1);
  for (int w = 0; w < opt.warmup; ++w) launch();
  CUDA_CHECK(cudaDeviceSynchronize());
  cudaEvent_t start, stop;
  CUDA_CHECK(cudaEventCreate(&start));
  CUDA_CHECK(cudaEventCreate(&stop));
  std::vector<double> ms;
  for (int r = 0; r < opt.repeats; ++r) {
    if (opt.flush_l2) l2_flush(r);
    CUDA_CHECK(cudaEventRecord(start));
    launch();
    CUDA_CHECK(cudaEventRecord(stop));
    CUDA_CHECK(cudaEventSynchronize(stop));
    float t = 0;
    CUDA_CHECK(cudaEventElapsedTime(&t, start, stop));
    ms.push_back(t);
  }
  CUDA_CHECK(cudaEventDestroy(start));
  CUDA_CHECK(cudaEventDestroy(stop));
  std::sort(ms.begin(), ms.end());
  Timing t;
  t.repeats = int(ms.size());
  t.min_ms = ms.front();
  t.max_ms = ms.back();
  t.median_ms = ms.size() % 2 ? ms[ms.size() / 2] : 0.5 * (ms[ms.size() / 2 - 1] + ms[ms.size() / 2]);
  return t;
}

}  // namespace attn
