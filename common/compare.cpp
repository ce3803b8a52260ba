#include "common/compare.hpp"

#include <algorithm>
#include <cmath>
#include <limits>
#include <sstream>

namespace attn {

template <class R>
ErrorStats compare_rows(const float* out, const CheckedRows<R>& ref) {
  ErrorStats e;
  double diff2 = 0, ref2 = 0;
  e.row_err.assign(ref.rows.size(), 0.0);
  e.row_ref_max.assign(ref.rows.size(), 0.0);
  for (std::size_t k = 0; k < ref.rows.size(); ++k) {
    const std::size_t base = ref.rows[k] * std::size_t(ref.width);
    for (int c = 0; c < ref.width; ++c) {
      const double r = double(ref.values[k * ref.width + c]);
      const double o = double(out[base + c]);
      ++e.checked;
      double err;
      if (std::isnan(o)) {
        ++e.nan;
        err = std::numeric_limits<double>::infinity();
      } else if (std::isinf(r) || std::isinf(o)) {
        const bool same = r == o;
        if (!same) ++e.nan;
        err = same ? 0.0 : std::numeric_limits<double>::infinity();
      } else {
        err = std::abs(o - r);
        diff2 += err * err;
        ref2 += r * r;
        e.ref_max_abs = std::max(e.ref_max_abs, std::abs(r));
        e.row_ref_max[k] = std::max(e.row_ref_max[k], std::abs(r));
      }
      if (!(err <= e.row_err[k])) e.row_err[k] = err;
      if (e.checked == 1 || err > e.max_abs) {
        e.max_abs = err;
        e.worst = base + c;
        e.worst_out = o;
        e.worst_ref = r;
      }
    }
  }
  e.l2 = std::sqrt(diff2);
  e.rel_l2 = ref2 > 0 ? std::sqrt(diff2 / ref2) : std::sqrt(diff2);
  if (e.nan) e.rel_l2 = e.l2 = std::numeric_limits<double>::infinity();
  return e;
}

template ErrorStats compare_rows<double>(const float*, const CheckedRows<double>&);
template ErrorStats compare_rows<float>(const float*, const CheckedRows<float>&);

std::size_t count_unwritten(const float* out, std::size_t n, bool allow_neg_inf) {
  std::size_t bad = 0;
  for (std::size_t i = 0; i < n; ++i) {
    const float x = out[i];
    if (std::isnan(x)) ++bad;
    else if (std::isinf(x) && !(allow_neg_inf && x < 0)) ++bad;
  }
  return bad;
}

Verdict accept(const ErrorStats& kernel, const ErrorStats& naive, DType stored, std::size_t unwritten,
               Magnitude magnitude) {
  Verdict v;
  // u: one unit roundoff of the stored type, and never less than 64 fp32 ulps (4e-6
  // relative). An fp32 result such as the LSE pays a few ulps for approximate exp2/log2,
  // for another summation order, and for tensor-core accumulation, which is not
  // round-to-nearest; the naive fp32 yardstick pays none of these and can be nearly exact
  // (measured: mma.sync scores put an LSE of 6.9 off by 1.8e-5 at Nk = 8K).
  const double u = std::max(dtype_unit_roundoff(stored), 64.0 * dtype_unit_roundoff(DType::f32));
  const auto scale = [&](double ref_max) { return magnitude == Magnitude::log ? std::max(1.0, ref_max) : ref_max; };
  // The LSE's magnitude is the tensor's (compare.hpp): every row takes the largest.
  double log_scale = 1.0;
  if (magnitude == Magnitude::log)
    for (const double m : kernel.row_ref_max) log_scale = std::max(log_scale, m);
  // Per row, unless the tensor is judged as a whole (gradients) or the stats carry no rows.
  const std::size_t rows = magnitude == Magnitude::tensor ? 0 : kernel.row_err.size();
  std::ostringstream why;
  const bool yardstick_finite = naive.nan == 0 && std::isfinite(naive.max_abs) && std::isfinite(naive.l2);
  std::size_t worst = 0;
  double worst_floor = 0, worst_naive = 0;
  if (rows == 0) {  // one "row": the whole tensor, of magnitude max |ref|
    double s = scale(std::max({naive.ref_max_abs, kernel.ref_max_abs, naive.floor_scale}));
    if (s == 0) s = 1.0;  // a reference of exact zeros: the inputs' scale (compare.hpp)
    worst_floor = u * s;
    worst_naive = naive.max_abs;
    v.tolerance = 2.0 * naive.max_abs + worst_floor;
    v.margin = v.tolerance > 0 ? kernel.max_abs / v.tolerance : (kernel.max_abs > 0 ? INFINITY : 0.0);
    if (kernel.checked > 0) v.l2_tolerance = 2.0 * naive.l2 + u * std::sqrt(double(kernel.checked)) * s;
  } else {
    // tol_r = 2 n + u s_r, n the naive's worst checked row (compare.hpp).
    const double n = naive.max_abs;
    v.row_tolerance.resize(rows);
    double sum_s2 = 0;
    const double width = kernel.checked / double(rows);
    for (std::size_t r = 0; r < rows; ++r) {
      const double s = magnitude == Magnitude::log ? log_scale : scale(kernel.row_ref_max[r]);
      sum_s2 += width * s * s;
      const double tol = 2.0 * n + u * s;
      v.row_tolerance[r] = tol;
      v.tolerance = std::max(v.tolerance, tol);
      const double ratio = tol > 0 ? kernel.row_err[r] / tol : (kernel.row_err[r] > 0 ? INFINITY : 0.0);
      if (r == 0 || !(ratio <= v.margin)) {
        v.margin = ratio;
        worst = r;
        worst_floor = u * s;
        worst_naive = n;
      }
    }
    v.l2_tolerance = 2.0 * naive.l2 + u * std::sqrt(sum_s2);
  }
  if (unwritten > 0) {
    why << unwritten << " output elements are NaN/inf (unwritten or overflowed)";
  } else if (kernel.nan > 0) {
    why << kernel.nan << " checked elements are NaN/inf or miss an expected -inf";
  } else if (!yardstick_finite) {
    why << "the same-precision yardstick overflowed (" << naive.nan
        << " NaN/inf elements): no tolerance can be set, so the check fails";
  } else if (!(v.margin <= 1.0)) {
    const double err = rows ? kernel.row_err[worst] : kernel.max_abs;
    const double tol = rows ? v.row_tolerance[worst] : v.tolerance;
    why << "max abs error " << err << " > tolerance " << tol;
    if (rows) why << " in checked row " << worst;
    why << " (2 x naive " << worst_naive << " + floor " << worst_floor << ")";
  } else if (kernel.checked > 0 && !(kernel.l2 <= v.l2_tolerance)) {
    why << "L2 error " << kernel.l2 << " > L2 tolerance " << v.l2_tolerance << " (2 x naive " << naive.l2
        << " + floor " << (v.l2_tolerance - 2.0 * naive.l2) << ")";
  }
  v.reason = why.str();
  v.pass = v.reason.empty();
  return v;
}

void poison(std::vector<float>& x) {
  std::fill(x.begin(), x.end(), std::numeric_limits<float>::quiet_NaN());
}

namespace {
template <class R, class Tol>
std::string mismatches(const float* out, const CheckedRows<R>& ref, Tol tol, int limit) {
  std::ostringstream s;
  int shown = 0;
  for (std::size_t k = 0; k < ref.rows.size() && shown < limit; ++k) {
    for (int c = 0; c < ref.width && shown < limit; ++c) {
      const double r = double(ref.values[k * ref.width + c]);
      const double o = double(out[ref.rows[k] * ref.width + c]);
      const bool bad = std::isnan(o) || (std::isinf(r) || std::isinf(o) ? r != o
                                                                         : std::abs(o - r) > tol(k));
      if (!bad) continue;
      s << (shown ? "; " : "") << "row " << ref.rows[k] << " col " << c << ": got " << o
        << ", want " << r;
      ++shown;
    }
  }
  return s.str();
}
}  // namespace

template <class R>
std::string describe_mismatches(const float* out, const CheckedRows<R>& ref, double tolerance,
                                int limit) {
  return mismatches(out, ref, [&](std::size_t) { return tolerance; }, limit);
}

template <class R>
std::string describe_mismatches(const float* out, const CheckedRows<R>& ref, const Verdict& v, int limit) {
  return mismatches(out, ref, [&](std::size_t k) { return v.tolerance_of(k); }, limit);
}

template std::string describe_mismatches<double>(const float*, const CheckedRows<double>&, double, int);
template std::string describe_mismatches<double>(const float*, const CheckedRows<double>&, const Verdict&, int);

}  // namespace attn
