#pragma once
/// \file decode_gpu.hpp
/// \brief Chapter 07's decode kernels behind a plain C++ interface (no CUDA types),
///        so main.cpp and the tests compile with or without the CUDA toolkit. The
///        class is defined only when the chapter is built with CUDA.

#include <memory>
#include <vector>

#include "decode.hpp"

namespace attn::ch07 {

/// Where the kernel finds K and V.
enum class KvLayout {
  paged,       ///< the page pool, through the block table
  contiguous,  ///< the same values gathered into [B][Hkv][L_max][d]: the cost of indirection
};
const char* layout_name(KvLayout l);

/// Which decode step runs.
/// (v11, a stage refilled without a proxy fence, raced and was removed; v13 is its fenced form.)
/// final_bf16 and final_8bit are the chapter's final kernels (steps/final_bf16.cu, steps/final_8bit.cu).
enum class DecodeKernel { v1, v2, v3, v4, v5, v6, v7, v8, v9, v10, v12, v13, v14, final_bf16, final_8bit };  ///< v4, v5: paged K/V only; v6-v10, v13, final_8bit: 8-bit pages only; v12, v14, final_bf16: bf16 pages only
const char* kernel_name(DecodeKernel k);
/// v8, v10 and v13 are the chapter's lab (steps/lab/, LAB.md): built only when the chapter is
/// configured with -DTUTORIAL_LAB=ON (TUTORIAL_LAB), and run by `decode --lab`.
inline bool kernel_is_final(DecodeKernel k) { return k == DecodeKernel::final_bf16 || k == DecodeKernel::final_8bit; }
inline bool kernel_in_lab(DecodeKernel k) {
  return k == DecodeKernel::v8 || k == DecodeKernel::v10 || k == DecodeKernel::v13;
}
/// Whether kernel `k` is built for pools stored as `t`: INT4 pages (two codes per byte) run
/// v1, v2 and v3 only, whose warps unpack the codes to f16 in registers (decode_tile.cuh).
inline bool kernel_reads(KvDtype t, DecodeKernel k) {
  return t != KvDtype::int4 || k == DecodeKernel::v1 || k == DecodeKernel::v2 || k == DecodeKernel::v3;
}
/// v7-v10 and v13 (TMA page copies, mbarriers) and v14 (programmatic dependent launch) are
/// built for sm_90a alone: on another GPU their rows are skipped, in one line.
bool kernel_needs_hopper(DecodeKernel k);

struct GpuDecodeOutput {
  std::vector<float> o, lse;  ///< [batch][heads][d] and [batch][heads]
};

/// One decode batch on the GPU: uploads Q, the lengths and the block tables, and
/// fills the K/V pool on the device from kv_value() (or uploads `kv.pools` when
/// set). The contiguous copy is made on first use. An 8-bit batch (b.kv_dtype) is
/// quantised on the device, one scale per (page, KV head) from the page's amax, as
/// pool_scales() computes it on the host; it runs paged only.
class GpuDecoder {
 public:
  GpuDecoder(const DecodeBatch& batch, const std::vector<float>& q, const KvContents& kv);
  ~GpuDecoder();
  GpuDecoder(const GpuDecoder&) = delete;
  GpuDecoder& operator=(const GpuDecoder&) = delete;

  /// One step with O and the LSE poisoned (NaN) first: `splits == 1` runs v1, more runs v2.
  GpuDecodeOutput run(int splits, KvLayout layout);
  /// One step of the given kernel (v2-v7 with `splits` splits; v1 ignores it).
  GpuDecodeOutput run(DecodeKernel k, int splits, KvLayout layout);
  /// Median time of the step in ms: warm-up, L2 flushed before each of >= 20 repeats.
  double time_ms(int splits, KvLayout layout);
  double time_ms(DecodeKernel k, int splits, KvLayout layout);
  /// `steps` steps of one kernel launched back to back, nothing between them (as a model's
  /// layers follow each other): the last step's output, O and the LSE poisoned first.
  GpuDecodeOutput run_chain(DecodeKernel k, int splits, KvLayout layout, int steps);
  /// Median time per step of such a chain (the L2 flushed before each repeat of the chain,
  /// not between its steps): what a step costs when a kernel runs before it (v14 overlaps it).
  double time_chain_ms(DecodeKernel k, int splits, KvLayout layout, int steps);
  /// The K and V scales the device computed (8-bit batches; empty for bf16).
  KvScales scales() const;
  /// The device's SM count (what choose_splits() needs).
  int sms() const;
  /// Device bytes the batch needs, with or without the contiguous copy.
  static double device_bytes(const DecodeBatch& b, int max_splits, bool contiguous);

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace attn::ch07
