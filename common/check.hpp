#pragma once
/// \file check.hpp
/// \brief One object per problem that knows the right answer: it computes the fp64
///        reference and the same-precision naive yardstick once, then judges any
///        number of implementations against them with the rule in compare.hpp.

#include <optional>
#include <cstddef>
#include <string>
#include <vector>

#include "common/compare.hpp"
#include "common/reference.hpp"

namespace attn {

/// The verdict on one output tensor.
struct TensorCheck {
  std::string name;  ///< "O", "LSE", "dQ", ...
  ErrorStats err;
  ErrorStats naive;  ///< the yardstick's error on the same rows
  Verdict verdict;
  std::string mismatches;  ///< the first few offending elements when it failed
};

/// The verdict on one implementation: all its tensors.
struct CheckResult {
  std::vector<TensorCheck> tensors;
  bool pass() const;
  /// Worst max-abs error and worst relative L2 error over the tensors (the report's columns).
  double max_abs() const;
  double rel_l2() const;
  /// One line per failing tensor.
  std::string failures() const;
};

/// The verdict on one whole output tensor: size, NaN/poison over every element, and
/// the acceptance rule on the rows `ref` covers, against the yardstick's error `naive`.
/// `allow_neg_inf` marks the LSE: -inf allowed (empty rows), magnitude measured in log space
/// (Magnitude::log); otherwise `magnitude` says how (Magnitude::tensor for gradients).
TensorCheck judge_tensor(const std::string& name, const std::vector<float>& out, std::size_t expected_elems,
                         const CheckedRows<double>& ref, const ErrorStats& naive, DType stored, bool allow_neg_inf,
                         Magnitude magnitude = Magnitude::row);

/// The error of values stored compactly, one row after another in the order `ref`
/// lists its rows (how the yardstick stores what it computes).
ErrorStats compact_error(const std::vector<float>& values, const CheckedRows<double>& ref);
inline ErrorStats compact_error(const CheckedRows<float>& mine, const CheckedRows<double>& ref) {
  return compact_error(mine.values, ref);
}

class ForwardOracle {
 public:
  ForwardOracle(const Problem& p, const AttnInputs& in, CheckPlan plan, const ScoreMod* mod = nullptr);
  /// Judges O (full tensor, p.o_elems()) and, when given, the LSE (p.lse_elems()).
  CheckResult judge(const std::vector<float>& o, const std::vector<float>* lse = nullptr) const;
  const CheckPlan& plan() const { return plan_; }
  const RefForward& reference() const { return ref_; }
  const NaiveForward& naive() const { return naive_; }

 private:
  Problem p_;
  CheckPlan plan_;
  RefForward ref_;
  NaiveForward naive_;
  ErrorStats naive_o_, naive_lse_;
};

class BackwardOracle {
 public:
  BackwardOracle(const Problem& p, const AttnInputs& in, BackwardPlan plan,
                 const ScoreMod* mod = nullptr);
  CheckResult judge(const std::vector<float>& dq, const std::vector<float>& dk,
                    const std::vector<float>& dv) const;
  const BackwardPlan& plan() const { return plan_; }
  const RefBackward& reference() const { return ref_; }

 private:
  Problem p_;
  BackwardPlan plan_;
  RefBackward ref_;
  NaiveBackward naive_;
  ErrorStats naive_dq_, naive_dk_, naive_dv_;
};

}  // namespace attn
