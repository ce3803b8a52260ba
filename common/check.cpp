#include "common/check.hpp"

#include <algorithm>
#include <sstream>

namespace attn {
TensorCheck judge_tensor(const std::string& name, const std::vector<float>& out, std::size_t expected_elems,
                         const CheckedRows<double>& ref, const ErrorStats& naive, DType stored, bool allow_neg_inf,
                         Magnitude magnitude) {
  TensorCheck t;
  t.name = name;
  t.naive = naive;
  if (out.size() != expected_elems) {
    t.verdict.pass = false;
    t.verdict.reason = name + " has " + std::to_string(out.size()) + " elements, expected " +
                       std::to_string(expected_elems);
    return t;
  }
  t.err = compare_rows(out.data(), ref);
  const std::size_t unwritten = count_unwritten(out.data(), out.size(), allow_neg_inf);
  t.verdict = accept(t.err, naive, stored, unwritten, allow_neg_inf ? Magnitude::log : magnitude);
  if (!t.verdict.pass) t.mismatches = describe_mismatches(out.data(), ref, t.verdict);
  return t;
}

ErrorStats compact_error(const std::vector<float>& values, const CheckedRows<double>& ref) {
  CheckedRows<double> dense = ref;
  for (std::size_t k = 0; k < dense.rows.size(); ++k) dense.rows[k] = k;
  return compare_rows(values.data(), dense);
}

bool CheckResult::pass() const {
  return !tensors.empty() &&
         std::all_of(tensors.begin(), tensors.end(), [](const TensorCheck& t) { return t.verdict.pass; });
}

double CheckResult::max_abs() const {
  double m = 0;
  for (const auto& t : tensors) m = std::max(m, t.err.max_abs);
  return m;
}

double CheckResult::rel_l2() const {
  double m = 0;
  for (const auto& t : tensors) m = std::max(m, t.err.rel_l2);
  return m;
}

std::string CheckResult::failures() const {
  std::ostringstream s;
  for (const auto& t : tensors)
    if (!t.verdict.pass) {
      s << t.name << ": " << t.verdict.reason;
      if (!t.mismatches.empty()) s << " [" << t.mismatches << "]";
      s << "\n";
    }
  return s.str();
}

ForwardOracle::ForwardOracle(const Problem& p, const AttnInputs& in, CheckPlan plan, const ScoreMod* mod)
    : p_(p), plan_(std::move(plan)) {
  ref_ = reference_forward(p_, in, plan_, mod);
  naive_ = naive_forward_same_precision(p_, in, plan_, mod);
  naive_o_ = compact_error(naive_.o, ref_.o);
  naive_lse_ = compact_error(naive_.lse, ref_.lse);
}

CheckResult ForwardOracle::judge(const std::vector<float>& o, const std::vector<float>* lse) const {
  CheckResult r;
  r.tensors.push_back(judge_tensor("O", o, p_.o_elems(), ref_.o, naive_o_, p_.dtype, false));
  if (lse)
    r.tensors.push_back(judge_tensor("LSE", *lse, p_.lse_elems(), ref_.lse, naive_lse_, DType::f32, true));
  return r;
}

BackwardOracle::BackwardOracle(const Problem& p, const AttnInputs& in, BackwardPlan plan,
                               const ScoreMod* mod)
    : p_(p), plan_(std::move(plan)) {
  ref_ = reference_backward(p_, in, plan_, mod);
  naive_ = naive_backward_same_precision(p_, in, plan_, mod);
  naive_dq_ = compact_error(naive_.dq, ref_.dq);
  naive_dk_ = compact_error(naive_.dk, ref_.dk);
  naive_dq_.floor_scale = ref_.dq_unmodified_max;  // 0 without a score modifier
  naive_dk_.floor_scale = ref_.dk_unmodified_max;
  naive_dv_ = compact_error(naive_.dv, ref_.dv);
}

CheckResult BackwardOracle::judge(const std::vector<float>& dq, const std::vector<float>& dk,
                                  const std::vector<float>& dv) const {
  CheckResult r;
  r.tensors.push_back(judge_tensor("dQ", dq, p_.q_elems(), ref_.dq, naive_dq_, p_.dtype, false, Magnitude::tensor));
  r.tensors.push_back(judge_tensor("dK", dk, p_.k_elems(), ref_.dk, naive_dk_, p_.dtype, false, Magnitude::tensor));
  r.tensors.push_back(judge_tensor("dV", dv, p_.v_elems(), ref_.dv, naive_dv_, p_.dtype, false, Magnitude::tensor));
  return r;
}

}  // namespace attn
