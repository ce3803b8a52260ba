#pragma once
/// \file compare.hpp
/// \brief Error metrics and the acceptance rule shared by every chapter.
///
/// **The rule.** A kernel's output passes when
///
///     max_abs_err(kernel) <= 2 * max_abs_err(naive, same precision) + floor
///     floor = max(u(dtype), 64 u(fp32)) * max(1, max |reference|)
///
/// where both errors are measured against the fp64 reference on the same rows,
/// "naive, same precision" is naive_forward_same_precision() (or the backward one),
/// and u is the unit roundoff of the stored type (2^-24 fp32, 2^-11 fp16, 2^-8 bf16);
/// for fp32 outputs (the LSE) the floor is 64 fp32 ulps (4e-6 relative), the cost of
/// approximate exp2/log2, another summation order and tensor-core accumulation.
/// NaN never passes, and every element of the output, checked row or not, must be
/// written: outputs are poisoned with NaN before each run.
/// "Exact" attention is exact in exact arithmetic only; tiled and naive orders
/// round differently, so no check in this project asks for bitwise equality.

#include <cstddef>
#include <string>
#include <vector>

#include "common/dtype.hpp"
#include "common/reference.hpp"

namespace attn {

struct ErrorStats {
  double max_abs = 0;      ///< max |out - ref| over the checked elements
  double rel_l2 = 0;       ///< ||out - ref||_2 / ||ref||_2
  double ref_max_abs = 0;  ///< max |ref| (scales the floor)
  std::size_t checked = 0;
  std::size_t nan = 0;     ///< NaN (or unexpected inf) among the checked elements
  std::size_t worst = 0;   ///< flat index of the largest error
  double worst_out = 0, worst_ref = 0;
};

/// Compares the rows `ref` covers of the full tensor `out` (row-major, ref.width wide).
/// A reference of -inf (an empty row's LSE) must be matched exactly.
template <class R>
ErrorStats compare_rows(const float* out, const CheckedRows<R>& ref);

/// The number of NaNs in a whole tensor (the poison check); with `allow_neg_inf`
/// false, any inf counts too.
std::size_t count_unwritten(const float* out, std::size_t n, bool allow_neg_inf = false);

struct Verdict {
  bool pass = false;
  double tolerance = 0;  ///< the max-abs error the rule allows
  std::string reason;    ///< why it failed, empty on success
};

/// The acceptance rule above. `unwritten` is count_unwritten() over the whole output.
Verdict accept(const ErrorStats& kernel, const ErrorStats& naive, DType stored,
               std::size_t unwritten = 0);

/// Fills a host tensor with NaN, so that elements nobody writes fail the check.
void poison(std::vector<float>& x);

/// "first mismatches" text for a failing tensor: up to `limit` elements beyond tolerance.
template <class R>
std::string describe_mismatches(const float* out, const CheckedRows<R>& ref, double tolerance,
                                int limit = 5);

}  // namespace attn
