#pragma once
/// \file report.hpp
/// \brief The report every chapter prints: a table with one row per implementation,
///        or the same as one JSON object with `--json`.
///
///     {"chapter": "...", "problem": {...},
///      "results": [{"impl", "device", "max_abs_err", "rel_l2_err", "hbm_read_bytes",
///                   "hbm_write_bytes", "flops", "extra_bytes", "time_ms", "tflops",
///                   "gbps", ...}]}
///
/// A field that was not measured is null, never a made-up number. A row that was not
/// compared with fp64 has `"pass": null`, prints "unchecked", and carries no speed; when it
/// was run and timed all the same, its JSON says `"ran_unchecked": true`.

#include <optional>
#include <ostream>
#include <string>
#include <vector>

#include "common/check.hpp"
#include "common/problem.hpp"
#include "common/traffic.hpp"

namespace attn {

/// Which ceiling a row is measured against.
enum class Bound { none, compute, memory };

struct ResultRow {
  std::string impl;
  std::string device;  ///< "cpu" (a counted model) or "cuda"
  std::optional<double> max_abs_err, rel_l2_err;
  /// Counted by a CPU model as it runs; for a GPU row, the output of the kernel's traffic
  /// formula (what its loop structure reads and writes), not a measurement.
  std::optional<double> hbm_read_bytes, hbm_write_bytes;
  std::optional<double> flops;                            ///< by the FlashAttention convention
  std::optional<double> extra_bytes;                      ///< global memory beyond inputs and outputs
  std::optional<double> time_ms;                          ///< median of the timed repeats
  /// A separate pass the kernel needs before it runs (chapter 05's FP8: quantise, Hadamard,
  /// V^T), timed the same way; time_ms leaves it out. JSON "prep_ms", only where set.
  std::optional<double> prep_ms;
  std::optional<double> tflops, gbps;
  Bound bound = Bound::none;
  std::optional<double> ceiling_share;  ///< tflops / GEMM ceiling, or gbps / read ceiling
  std::optional<bool> pass;             ///< the acceptance rule; unset when not checked ("unchecked")
  /// The share of its tolerance the worst checked row used, over the row's tensors
  /// (Verdict::margin: <= 1 passes); JSON "check_margin".
  std::optional<double> check_margin;
  std::string note;                     ///< short remark shown after the table

  /// Whether the row's speed (time, TFLOP/s, GB/s, share) is printed: only once its output
  /// was compared with fp64. An unchecked row prints "unchecked" and no speed, in the
  /// table and in the JSON (null), so no speed is ever shown for a result nobody checked.
  bool speed_shown() const { return pass.has_value(); }

  /// Fills the error columns and `pass` from a check.
  void set_check(const CheckResult& c);
  /// Fills traffic, extra memory and (when not already set) FLOPs from a counted model.
  void set_traffic(const Traffic& t);
  /// Fills time, TFLOP/s and GB/s from a time and this row's flops/bytes.
  void set_time(double ms);
};

struct Ceilings {
  std::optional<double> read_gbps;     ///< measured read bandwidth
  std::optional<double> gemm_tflops;   ///< measured dense GEMM rate for the problem's dtype
  std::string gemm_what;               ///< e.g. "cuBLAS bf16 8192^3"
};

struct Report {
  std::string chapter;  ///< e.g. "ch01_naive"
  std::string title;
  Problem problem;
  std::string inputs;   ///< distribution and seed
  std::string mode;     ///< "CPU models only (...)" or "CPU + GPU (...)"
  std::string device;   ///< GPU name, or empty
  std::string check_plan;
  Ceilings ceilings;
  std::vector<ResultRow> rows;
  std::vector<std::string> notes;  ///< extra lines under the table
  std::string previous;            ///< the comparison with the previous chapter

  /// Shares of the ceiling for every row that has a rate and a bound.
  void apply_ceilings();
  bool all_passed() const;
  void print_text(std::ostream& os) const;
  void print_json(std::ostream& os) const;
  /// print_json or print_text; returns the exit code: 0, or kExitCheckFailed if a row failed.
  int emit(std::ostream& os, bool json) const;
};

/// One number through a printf format, for report lines: fmt("%.2f", x).
std::string fmt(const char* printf_format, double x);

/// Today's date, YYYY-MM-DD (for measured tables).
std::string today();

/// Minimal JSON string escaping.
std::string json_escape(const std::string& s);

}  // namespace attn
