// Chapter 02's inputs and oracle: rows of scores, the fp64 reference, the fp32 yardstick.
#include "scores.hpp"

#include <algorithm>
#include <cmath>
#include <limits>
#include <string>

#include "common/compare.hpp"
#include "common/parallel.hpp"

namespace attn::ch02 {
namespace {

constexpr double kNegInfD = -std::numeric_limits<double>::infinity();
constexpr float kNegInfF = -std::numeric_limits<float>::infinity();

/// The checked rows of a plan as global row indices, in the order the plan lists them.
std::vector<std::size_t> plan_rows(const Problem& p, const CheckPlan& plan) {
  std::vector<std::size_t> rows;
  for (auto [b, h] : plan.heads)
    for (int i : plan.rows) rows.push_back((std::size_t(b) * p.heads + h) * p.nq + i);
  return rows;
}

}  // namespace

SoftmaxInputs make_softmax_inputs(const Problem& p, Dist dist, uint64_t seed, double shift) {
  SoftmaxInputs in;
  const std::size_t rows = row_count(p), nk = std::size_t(p.nk);
  in.s.resize(rows * nk);
  // One stream per row (streams 16, 17, ...; the common tensors use 1-4).
  constexpr long kRowsPerItem = 64;
  const long items = long((rows + kRowsPerItem - 1) / kRowsPerItem);
  parallel_for(items, [&](long item) {
    std::vector<float> row;
    const std::size_t r0 = std::size_t(item) * kRowsPerItem, r1 = std::min(rows, r0 + kRowsPerItem);
    for (std::size_t r = r0; r < r1; ++r) {
      fill(row, nk, dist, seed, 16 + r, DType::f32, shift);
      std::copy(row.begin(), row.end(), in.s.begin() + std::ptrdiff_t(r * nk));
    }
  });
  fill(in.v, p.v_elems(), dist == Dist::mean_shifted ? Dist::normal : dist, seed, 3, DType::f32);
  return in;
}

SoftmaxOracle::SoftmaxOracle(const Problem& p, const SoftmaxInputs& in, CheckPlan plan)
    : p_(p), plan_(std::move(plan)) {
  const std::vector<std::size_t> rows = plan_rows(p_, plan_);
  const std::size_t nr = rows.size(), nk = std::size_t(p_.nk), dv = std::size_t(p_.dv);
  ref_p_.width = p_.nk;
  ref_o_.width = p_.dv;
  ref_lse_.width = 1;
  ref_p_.rows = ref_o_.rows = ref_lse_.rows = rows;
  ref_p_.values.assign(nr * nk, 0.0);
  ref_o_.values.assign(nr * dv, 0.0);
  ref_lse_.values.assign(nr, 0.0);
  std::vector<float> naive_p(nr * nk), naive_o(nr * dv), naive_lse(nr);
  const double tau = p_.softmax_scale();
  const float tau_f = float(tau);

  parallel_for(long(nr), [&](long k) {
    const std::size_t row = rows[k];
    const int i = int(row % std::size_t(p_.nq));
    const std::size_t bh = row / std::size_t(p_.nq);
    const int b = int(bh / std::size_t(p_.heads)), h = int(bh % std::size_t(p_.heads));
    const float* s = in.s.data() + row * nk;
    const float* v = in.v.data() + p_.v_off(b, p_.kv_head_of(h));
    const int last = last_visible(p_, i);

    // fp64: x_j = tau s_j, m = max x_j, l = sum e^(x_j - m), P_j = e^(x_j - m) / l, O = sum P_j v_j.
    double* P = &ref_p_.values[k * nk];
    double* O = &ref_o_.values[k * dv];
    double m = kNegInfD;
    for (int j = 0; j <= last; ++j) m = std::max(m, tau * double(s[j]));
    double l = 0;
    for (int j = 0; j <= last; ++j) l += std::exp(tau * double(s[j]) - m);
    for (int j = 0; j < p_.nk; ++j) P[j] = j <= last ? std::exp(tau * double(s[j]) - m) / l : 0.0;
    for (int j = 0; j <= last; ++j)
      for (std::size_t c = 0; c < dv; ++c) O[c] += P[j] * double(v[std::size_t(j) * dv + c]);
    ref_lse_.values[k] = last >= 0 ? m + std::log(l) : kNegInfD;

    // fp32, the plain way: three passes, sequential sums, the same masking.
    float* np = &naive_p[k * nk];
    float* no = &naive_o[k * dv];
    float mf = kNegInfF;
    for (int j = 0; j <= last; ++j) mf = std::max(mf, tau_f * s[j]);
    float lf = 0.f;
    for (int j = 0; j <= last; ++j) lf += std::exp(tau_f * s[j] - mf);
    for (int j = 0; j < p_.nk; ++j) np[j] = j <= last ? std::exp(tau_f * s[j] - mf) / lf : 0.f;
    std::fill(no, no + dv, 0.f);
    for (int j = 0; j <= last; ++j)
      for (std::size_t c = 0; c < dv; ++c) no[c] += np[j] * v[std::size_t(j) * dv + c];
    naive_lse[k] = last >= 0 ? mf + std::log(lf) : kNegInfF;
  });

  naive_p_ = compact_error(naive_p, ref_p_);
  naive_o_ = compact_error(naive_o, ref_o_);
  naive_lse_ = compact_error(naive_lse, ref_lse_);
  for (double x : ref_lse_.values)
    if (std::isfinite(x)) max_lse_ = std::max(max_lse_, x);
}

CheckResult SoftmaxOracle::judge_softmax(const std::vector<float>& prob, const std::vector<float>& lse) const {
  CheckResult r;
  r.tensors.push_back(judge_tensor("P", prob, p_.s_elems(), ref_p_, naive_p_, DType::f32, false));
  r.tensors.push_back(judge_tensor("LSE", lse, p_.lse_elems(), ref_lse_, naive_lse_, DType::f32, true));
  return r;
}

CheckResult SoftmaxOracle::judge_fused(const std::vector<float>& o, const std::vector<float>& lse) const {
  CheckResult r;
  r.tensors.push_back(judge_tensor("O", o, p_.o_elems(), ref_o_, naive_o_, DType::f32, false));
  r.tensors.push_back(judge_tensor("LSE", lse, p_.lse_elems(), ref_lse_, naive_lse_, DType::f32, true));
  return r;
}

}  // namespace attn::ch02
