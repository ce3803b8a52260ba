#pragma once
/// \file kv_accuracy.hpp
/// \brief What an 8-bit or 4-bit KV cache costs in accuracy: the decode model (v2's
///        loops) on bf16, FP8, INT8 and INT4 pools, with per-channel, per-group and
///        Hadamard-rotated variants, against the fp64 reference of the bf16 values, on
///        three kinds of input.
///
/// Every variant decodes the same batch; only the stored K and V differ:
///
///     bf16                    the values themselves (the cache of the other rows of this chapter)
///     fp8 / int8 / int4,      codes with one scale per (page, KV head): the kernels' format
///       per page              (INT4 through its packed form, two codes per byte, and back)
///     int8, per channel (K)   one scale per (page, KV head, channel) for K (V per page):
///                             a channel whose entries are all large gets its own scale
///     int4, per 32 channels   one scale per (page, KV head, 32 channels) for K and V: 4x the
///                             scale bytes, each scale still over P x 32 values
///     int4, per token,        one scale per (token, KV head, 32 channels): 32 values a
///       32 channels           scale, one bit more per value (KIVI-like groups)
///     fp8/int8/int4 + Hadamard  K and Q rotated by the same orthogonal H / sqrt(d) along d before
///                             K is quantised ((H q) . (H k) = q . k): an outlier channel is spread
///                             over all d channels, so the page's amax and its step fall
///
/// Inputs: N(0, 1); outliers (1 entry in 256 of K and V scaled by 20); outlier channels
/// (channels 3 and 69 of Q and K scaled by 20, as the keys of trained models have them).

#include <cstdint>
#include <string>
#include <vector>

namespace attn::ch07 {

struct AccuracyRow {
  std::string inputs;                       ///< "normal", "outliers", "outlier channels"
  std::vector<std::string> variants;        ///< column names
  std::vector<double> rel_l2, max_abs;      ///< of O against the fp64 reference, per variant
  double ref_max = 0;                       ///< max |O| of the reference
};

struct AccuracyTable {
  std::string shape;  ///< the batch, described
  std::vector<AccuracyRow> rows;
  std::string text() const;
  std::string json() const;
  /// rel_l2 of `variant` on `inputs` (NaN when absent).
  double rel_l2(const std::string& inputs, const std::string& variant) const;
};

/// The table on a seeded batch (4 sequences of 1 to 2048 tokens, Hq = 8, Hkv = 2,
/// d = 128, P = 16): a few seconds of CPU.
AccuracyTable kv_accuracy_table(uint64_t seed);

}  // namespace attn::ch07
