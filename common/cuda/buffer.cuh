#pragma once
/// \file buffer.cuh
/// \brief Device memory with an owner: typed buffers and dtype-tagged tensors that
///        upload from and download to the host's float vectors.

#include <cstddef>
#include <utility>
#include <vector>

#include "common/cuda/check.cuh"
#include "common/dtype.hpp"

namespace attn {

/// cudaMalloc'd storage for n elements of T, freed on destruction. Move-only.
template <class T>
class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  explicit DeviceBuffer(std::size_t n) : n_(n) {
    if (n) CUDA_CHECK(cudaMalloc(&p_, n * sizeof(T)));
  }
  ~DeviceBuffer() {
    if (p_) cudaFree(p_);
  }
  DeviceBuffer(DeviceBuffer&& o) noexcept : p_(std::exchange(o.p_, nullptr)), n_(std::exchange(o.n_, 0)) {}
  DeviceBuffer& operator=(DeviceBuffer&& o) noexcept {
    std::swap(p_, o.p_);
    std::swap(n_, o.n_);
    return *this;
  }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;

  T* get() const { return p_; }
  std::size_t size() const { return n_; }
  std::size_t bytes() const { return n_ * sizeof(T); }
  /// Fills with 0xFF bytes: NaN for every float type, so unwritten outputs fail.
  void poison() { CUDA_CHECK(cudaMemset(p_, 0xFF, bytes())); }
  void zero() { CUDA_CHECK(cudaMemset(p_, 0, bytes())); }
  void upload(const std::vector<T>& h) {
    CUDA_CHECK(cudaMemcpy(p_, h.data(), std::min(h.size(), n_) * sizeof(T), cudaMemcpyHostToDevice));
  }
  std::vector<T> download() const {
    std::vector<T> h(n_);
    CUDA_CHECK(cudaMemcpy(h.data(), p_, bytes(), cudaMemcpyDeviceToHost));
    return h;
  }

 private:
  T* p_ = nullptr;
  std::size_t n_ = 0;
};

/// A tensor stored as `dtype` on the device; the host side is always float.
class DeviceTensor {
 public:
  DeviceTensor() = default;
  DeviceTensor(DType dtype, std::size_t n) : dtype_(dtype), buf_(n * std::size_t(dtype_bytes(dtype))), n_(n) {}
  /// Uploads host floats, converting to `dtype` (round to nearest even).
  static DeviceTensor from_host(const std::vector<float>& h, DType dtype);
  /// Downloads and widens to float.
  std::vector<float> to_host() const;
  void poison() { buf_.poison(); }
  void zero() { buf_.zero(); }

  template <class T> T* as() const { return reinterpret_cast<T*>(buf_.get()); }
  void* data() const { return buf_.get(); }
  DType dtype() const { return dtype_; }
  std::size_t size() const { return n_; }
  std::size_t bytes() const { return buf_.size(); }

 private:
  DType dtype_ = DType::f32;
  DeviceBuffer<unsigned char> buf_;
  std::size_t n_ = 0;
};

}  // namespace attn
