#pragma once
/// \file traffic.hpp
/// \brief The HBM-traffic model: CPU models of the kernels read and write "global"
///        tensors through counted views and keep their tiles in an "on-chip" budget.
///
/// A chapter's CPU model is written with its kernel's own loop structure. Every
/// access to a GlobalTensor is counted in bytes of the tensor's stored type; every
/// tile the model holds lives in an OnChip arena of `--sram-bytes` bytes, and
/// asking for more than the budget throws SramOverflow instead of silently
/// overflowing. So the counted numbers are the ones the kernel would move, and the
/// IO arguments of the papers (FA1 Theorem 2) can be checked on concrete runs.
///
///     Traffic t;                                  // the counters
///     GlobalTensor Q(t, "Q", in.q, DType::bf16);  // an input in HBM
///     OnChip sram(96 * 1024);
///     Tile Qi = sram.tile("Q_i", Br * d, 2);       // Br x d tile, 2 bytes per element
///     Q.load(row0 * d, Br * d, Qi.data());         // counts Br*d*2 bytes read

#include <cstddef>
#include <string>
#include <vector>

#include "common/dtype.hpp"

namespace attn {

/// What a model moved and computed.
struct Traffic {
  double bytes_read = 0;
  double bytes_written = 0;
  double flops = 0;         ///< counted multiply-adds x 2 (and the softmax's few)
  double extra_bytes = 0;   ///< global scratch currently allocated (beyond inputs/outputs)
  double extra_peak = 0;    ///< its peak: the model's "extra memory"

  void add_flops(double f) { flops += f; }
  double bytes() const { return bytes_read + bytes_written; }
};

/// Role of a global tensor; only scratch counts as extra memory.
enum class Role { input, output, scratch };

/// A tensor in global memory ("HBM"). Values are floats holding numbers exactly
/// representable in `dtype`; a store rounds to `dtype` as the kernel's store would.
class GlobalTensor {
 public:
  /// A tensor of `n` elements, zero-filled (outputs and scratch).
  GlobalTensor(Traffic& t, std::string name, std::size_t n, DType dtype, Role role);
  /// A tensor already in HBM, initialised from host data (not counted). An earlier
  /// kernel's scratch that this one keeps reading (P in a backward) passes Role::scratch.
  GlobalTensor(Traffic& t, std::string name, const std::vector<float>& init, DType dtype,
               Role role = Role::input);
  ~GlobalTensor();
  GlobalTensor(const GlobalTensor&) = delete;
  GlobalTensor& operator=(const GlobalTensor&) = delete;

  /// Reads n contiguous elements starting at `offset` into `dst` (counted).
  void load(std::size_t offset, std::size_t n, float* dst) const;
  /// Reads a rows x cols block whose rows are `ld` elements apart into a dense `dst`.
  void load_block(std::size_t offset, int rows, int cols, std::size_t ld, float* dst) const;
  /// Writes n contiguous elements (counted, rounded to dtype).
  void store(std::size_t offset, std::size_t n, const float* src);
  void store_block(std::size_t offset, int rows, int cols, std::size_t ld, const float* src);
  /// One element (counted).
  float get(std::size_t i) const;
  void set(std::size_t i, float v);

  /// Uncounted access for checking results after the model has run.
  const std::vector<float>& host() const { return data_; }
  std::size_t size() const { return data_.size(); }
  DType dtype() const { return dtype_; }
  const std::string& name() const { return name_; }

 private:
  void check_range(std::size_t offset, std::size_t n) const;
  Traffic& t_;
  std::string name_;
  DType dtype_;
  Role role_;
  std::vector<float> data_;
};

class OnChip;

/// A tile held on chip. Released back to its OnChip budget when destroyed.
class Tile {
 public:
  Tile() = default;
  Tile(Tile&& o) noexcept;
  Tile& operator=(Tile&& o) noexcept;
  ~Tile();
  float* data() { return data_.data(); }
  const float* data() const { return data_.data(); }
  float& operator[](std::size_t i) { return data_[i]; }
  float operator[](std::size_t i) const { return data_[i]; }
  std::size_t size() const { return data_.size(); }
  void fill(float v);

 private:
  friend class OnChip;
  OnChip* owner_ = nullptr;
  std::size_t bytes_ = 0;
  std::vector<float> data_;
};

/// The on-chip budget M of a model (shared memory + registers of one thread block).
class OnChip {
 public:
  explicit OnChip(std::size_t budget_bytes) : budget_(budget_bytes) {}
  /// A tile of `elems` elements of `bytes_per_elem` bytes each; throws SramOverflow
  /// naming the tile when the budget would be exceeded.
  Tile tile(const std::string& name, std::size_t elems, int bytes_per_elem = 4);
  std::size_t budget() const { return budget_; }
  std::size_t used() const { return used_; }
  std::size_t peak() const { return peak_; }

 private:
  friend class Tile;
  std::size_t budget_;
  std::size_t used_ = 0;
  std::size_t peak_ = 0;
};

/// "12.3 MB", "1.02 GB": decimal units, as bandwidths are quoted.
std::string format_bytes(double bytes);

}  // namespace attn
