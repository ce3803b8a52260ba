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
      }
      if (e.checked == 1 || err > e.max_abs) {
        e.max_abs = err;
        e.worst = base + c;
        e.worst_out = o;
        e.worst_ref = r;
      }
    }
  }
  e.rel_l2 = ref2 > 0 ? std::sqrt(diff2 / ref2) : std::sqrt(diff2);
  if (e.nan) e.rel_l2 = std::numeric_limits<double>::infinity();
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

Verdict accept(const ErrorStats& kernel, const ErrorStats& naive, DType stored, std::size_t unwritten) {
  Verdict v;
  // The floor: one unit roundoff of the stored type, and never less than 64 fp32 ulps
  // (4e-6 relative). An fp32 result such as the LSE pays a few ulps for approximate
  // exp2/log2, for another summation order, and for tensor-core accumulation, which
  // is not round-to-nearest; the naive fp32 yardstick pays none of these and can be
  // nearly exact (measured: mma.sync scores put an LSE of 6.9 off by 1.8e-5 at Nk = 8K).
  const double u = std::max(dtype_unit_roundoff(stored), 64.0 * dtype_unit_roundoff(DType::f32));
  const double floor = u * std::max(1.0, naive.ref_max_abs);
  v.tolerance = 2.0 * naive.max_abs + floor;
  std::ostringstream why;
  if (unwritten > 0) {
    why << unwritten << " output elements are NaN/inf (unwritten or overflowed)";
  } else if (kernel.nan > 0) {
    why << kernel.nan << " checked elements are NaN/inf or miss an expected -inf";
  } else if (!(kernel.max_abs <= v.tolerance)) {
    why << "max abs error " << kernel.max_abs << " > tolerance " << v.tolerance
        << " (2 x naive " << naive.max_abs << " + floor " << floor << ")";
  }
  v.reason = why.str();
  v.pass = v.reason.empty();
  return v;
}

void poison(std::vector<float>& x) {
  std::fill(x.begin(), x.end(), std::numeric_limits<float>::quiet_NaN());
}

template <class R>
std::string describe_mismatches(const float* out, const CheckedRows<R>& ref, double tolerance,
                                int limit) {
  std::ostringstream s;
  int shown = 0;
  for (std::size_t k = 0; k < ref.rows.size() && shown < limit; ++k) {
    for (int c = 0; c < ref.width && shown < limit; ++c) {
      const double r = double(ref.values[k * ref.width + c]);
      const double o = double(out[ref.rows[k] * ref.width + c]);
      const bool bad = std::isnan(o) || (std::isinf(r) || std::isinf(o) ? r != o
                                                                         : std::abs(o - r) > tolerance);
      if (!bad) continue;
      s << (shown ? "; " : "") << "row " << ref.rows[k] << " col " << c << ": got " << o
        << ", want " << r;
      ++shown;
    }
  }
  return s.str();
}

template std::string describe_mismatches<double>(const float*, const CheckedRows<double>&, double, int);

}  // namespace attn
