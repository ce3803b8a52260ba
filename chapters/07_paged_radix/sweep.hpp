#pragma once
/// \file sweep.hpp
/// \brief The decode bandwidth sweep behind the README's table: its configurations,
///        and its report as text and as the JSON that bench/ch07_decode.py reads.
///
/// The measuring happens in main.cpp (it needs the GPU); the formatting lives here
/// so that a CPU test can pin the JSON's fields.

#include <string>
#include <vector>

#include "kv_quant.hpp"

namespace attn::ch07 {

/// One shape of the sweep.
struct SweepShape {
  int batch, len, heads, kv_heads, page_size;
  KvDtype kv = KvDtype::bf16;
};
/// The README's shapes: long contexts at batch 1 and 8, GQA 32/8 and MHA, a short
/// high-batch case, and the page sizes 1 to 64 on one long sequence (set "all", the
/// default, every cache bf16). Set "b1": one GQA 32/8 sequence of 32K, 64K and 128K
/// tokens. Set "quant": batch 8 at 32K and one sequence of 64K (GQA 32/8), each in
/// bf16, FP8, INT8 and INT4 (INT4: v1-v3 only). Any other name: an empty list.
std::vector<SweepShape> sweep_shapes(const std::string& set = "all");
bool sweep_set_known(const std::string& set);

/// One kernel on one shape.
struct SweepRun {
  std::string kernel;  ///< "v1", "v2" or "v3"
  std::string layout;  ///< "paged" or "contiguous"
  int splits = 1;
  bool chosen = false;  ///< the kernel choose_splits() picks for the shape
  double time_ms = 0, kv_gbps = 0, max_abs_err = 0;
  bool pass = false;
  std::string failures;
  double tokens_per_s = 0;  ///< cached tokens read per second (every sequence's L / time)
  int chain = 0;            ///< steps launched back to back for chain_ms (0: not measured; --chain)
  double chain_ms = 0, chain_gbps = 0;  ///< the time per step in such a chain, and its KV GB/s
};

struct SweepResult {
  SweepShape shape{};
  int d = 128;
  double kv_bytes = 0;
  long tokens = 0;  ///< cached tokens of the step
  int plan_splits = 1;
  std::string plan_why, check_plan;
  std::vector<SweepRun> runs;
};

struct SweepReport {
  std::string device, date;
  double read_gbps = 0;
  int d = 128;
  std::vector<SweepResult> results;

  bool all_pass() const;
  /// {"chapter", "subcommand": "decode-sweep", "device_name", "date", "read_gbps", "d",
  ///  "configs": [{"batch", "len", "heads", "kv_heads", "d", "page_size", "kv_dtype",
  ///               "kv_bytes", "tokens", "plan_splits", "plan_why", "check_plan",
  ///               "results": [{"kernel", "layout", "splits", "chosen", "time_ms",
  ///                            "kv_gbps", "ceiling_share", "tokens_per_s", "max_abs_err", "pass"
  ///                            [, "chain", "chain_ms", "chain_gbps"]}]}]}
  /// (kv_dtype, tokens and tokens_per_s were added with the 8-bit cache, the chain fields with
  /// v14, only where a chain was timed; the rest is unchanged)
  std::string json() const;
  std::string text() const;
};

}  // namespace attn::ch07
