#include "common/traffic.hpp"

#include <algorithm>
#include <cstdio>
#include <stdexcept>

#include "common/errors.hpp"

namespace attn {

GlobalTensor::GlobalTensor(Traffic& t, std::string name, std::size_t n, DType dtype, Role role)
    : t_(t), name_(std::move(name)), dtype_(dtype), role_(role), data_(n, 0.f) {
  if (role_ == Role::scratch) {
    t_.extra_bytes += double(n) * dtype_bytes(dtype_);
    t_.extra_peak = std::max(t_.extra_peak, t_.extra_bytes);
  }
}

GlobalTensor::GlobalTensor(Traffic& t, std::string name, const std::vector<float>& init, DType dtype, Role role)
    : t_(t), name_(std::move(name)), dtype_(dtype), role_(role), data_(init) {
  if (role_ == Role::scratch) {
    t_.extra_bytes += double(data_.size()) * dtype_bytes(dtype_);
    t_.extra_peak = std::max(t_.extra_peak, t_.extra_bytes);
  }
}

GlobalTensor::~GlobalTensor() {
  if (role_ == Role::scratch) t_.extra_bytes -= double(data_.size()) * dtype_bytes(dtype_);
}

void GlobalTensor::check_range(std::size_t offset, std::size_t n) const {
  if (offset + n > data_.size())
    throw std::out_of_range("model accessed " + name_ + " out of bounds: [" + std::to_string(offset) +
                            ", " + std::to_string(offset + n) + ") of " + std::to_string(data_.size()));
}

void GlobalTensor::load(std::size_t offset, std::size_t n, float* dst) const {
  check_range(offset, n);
  std::copy_n(data_.data() + offset, n, dst);
  t_.bytes_read += double(n) * dtype_bytes(dtype_);
}

void GlobalTensor::load_block(std::size_t offset, int rows, int cols, std::size_t ld, float* dst) const {
  for (int r = 0; r < rows; ++r) load(offset + std::size_t(r) * ld, cols, dst + std::size_t(r) * cols);
}

void GlobalTensor::store(std::size_t offset, std::size_t n, const float* src) {
  check_range(offset, n);
  for (std::size_t i = 0; i < n; ++i) data_[offset + i] = round_to(dtype_, src[i]);
  t_.bytes_written += double(n) * dtype_bytes(dtype_);
}

void GlobalTensor::store_block(std::size_t offset, int rows, int cols, std::size_t ld, const float* src) {
  for (int r = 0; r < rows; ++r) store(offset + std::size_t(r) * ld, cols, src + std::size_t(r) * cols);
}

float GlobalTensor::get(std::size_t i) const {
  float v;
  load(i, 1, &v);
  return v;
}

void GlobalTensor::set(std::size_t i, float v) { store(i, 1, &v); }

// ----------------------------------------------------------------------------- on chip

Tile OnChip::tile(const std::string& name, std::size_t elems, int bytes_per_elem) {
  const std::size_t bytes = elems * std::size_t(bytes_per_elem);
  if (used_ + bytes > budget_)
    throw SramOverflow("on-chip budget exceeded: tile " + name + " needs " + format_bytes(double(bytes)) +
                       " with " + format_bytes(double(used_)) + " of " + format_bytes(double(budget_)) +
                       " in use (raise --sram-bytes or shrink the tiles)");
  used_ += bytes;
  peak_ = std::max(peak_, used_);
  Tile t;
  t.owner_ = this;
  t.bytes_ = bytes;
  t.data_.assign(elems, 0.f);
  return t;
}

Tile::Tile(Tile&& o) noexcept : owner_(o.owner_), bytes_(o.bytes_), data_(std::move(o.data_)) {
  o.owner_ = nullptr;
  o.bytes_ = 0;
}

Tile& Tile::operator=(Tile&& o) noexcept {
  if (this != &o) {
    if (owner_) owner_->used_ -= bytes_;
    owner_ = o.owner_;
    bytes_ = o.bytes_;
    data_ = std::move(o.data_);
    o.owner_ = nullptr;
    o.bytes_ = 0;
  }
  return *this;
}

Tile::~Tile() {
  if (owner_) owner_->used_ -= bytes_;
}

void Tile::fill(float v) { std::fill(data_.begin(), data_.end(), v); }

std::string format_bytes(double bytes) {
  const char* units[] = {"B", "KB", "MB", "GB", "TB", "PB"};
  int u = 0;
  while (bytes >= 1000.0 && u < 5) {
    bytes /= 1000.0;
    ++u;
  }
  char buf[32];
  std::snprintf(buf, sizeof buf, u == 0 ? "%.0f %s" : "%.3g %s", bytes, units[u]);
  return buf;
}

}  // namespace attn
