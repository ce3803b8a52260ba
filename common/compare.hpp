#pragma once
/// \file compare.hpp
/// \brief Error metrics and the acceptance rule shared by every chapter.
///
/// **The rule.** Both the kernel and the same-precision naive computation ("naive") are
/// compared with the fp64 reference on the same checked rows. For checked row r let
///
///     s_r   = the row's magnitude: max_c |ref[r][c]| (O, P); for the LSE (a log-space
///             value) max(1, max_r' |ref_r'|), the tensor's; for gradients the whole
///             tensor's (below)
///     e_r   = max_c |out[r][c] - ref[r][c]|    (kernel),   n = max_r n_r the same for naive
///     u     = max(u(dtype), 64 u(fp32))        (2^-8 bf16, 2^-11 fp16, 3.8e-6 fp32)
///
/// The kernel passes when every checked row is within its tolerance, and the whole
/// tensor within a relative-L2 bound:
///
///     e_r <= tol_r = 2 * n + u * s_r                                   for every r
///     ||out - ref||_2 <= 2 * ||naive - ref||_2 + u * sqrt(sum_r width * s_r^2)
///
/// The floor u * s_r is one unit roundoff of the stored type at the row's own size: the
/// error of rounding that row's largest element once. It scales per row, not per
/// tensor, because rows of one tensor differ by orders of magnitude (a causal row 0
/// reads one value row, |O| ~ 1; a row of a 64K decode averages 64K of them,
/// |O| ~ 0.006): a floor set by the largest row, or by max(1, .) as this rule once had,
/// lets a small row carry an error as large as itself (at decode length 64K the old
/// floor 2^-8 let through a dropped 1-of-32 key split, error 0.0047; the tolerance is
/// now a few 1e-4 against a correct result's 1.2e-4: tests/common/test_compare.cpp).
/// The yardstick term is the naive computation's worst error over the checked rows, not
/// row r's own: a kernel that rounds in another order (tiles, FP8 with per-block scales,
/// MLA's absorbed weights) has a random error per row, and on an H100 correct kernels
/// put single rows at up to 2.9x the naive error of the same row (FP8 with outliers, the
/// absorbed MLA decode) while their worst row stayed within 2x the naive's worst. The LSE
/// takes the tensor's magnitude: its error is a relative error of the row sum, made in
/// the arithmetic of the row's scores, whose size the LSE itself (max - log of a sum)
/// does not show (measured: 1.1e-5 on an LSE of 1.59, an fp32 row sum of 1e-5 relative).
/// The L2 bound catches an error spread thinly over many elements, which a max bound
/// can miss.
///
/// **Gradients** (dQ, dK, dV: Magnitude::tensor) are judged as one row, the whole tensor,
/// s = max |ref| over it. A gradient row is a sum of terms that cancel; its rounding error
/// follows those terms, not the row's own size, and per row the CPU models' correct dQ
/// rows were off by up to 55x the yardstick's error in the same row (while within the
/// tensor's rule). Through a score modifier (softcap) the kernel computes the modifier's
/// derivative in its own arithmetic, with an absolute error that does not shrink where
/// the modifier saturates, so s is then at least max |dQ| (|dK|) with that derivative
/// taken as 1 (RefBackward::dq_unmodified_max). A gradient whose checked reference is
/// exactly zero (every checked row sees no key) has no magnitude of its own: s is then 1,
/// the inputs' scale, which covers the fp32 noise (up to 1.6e-6 on an H100) a kernel
/// leaves where the exact answer is 0.
///
/// NaN never passes. A yardstick with an inf or NaN (it overflowed) is a FAILURE of
/// the check, not an infinite tolerance. Every element of the output, checked row or
/// not, must be written: outputs are poisoned with NaN before each run.
/// "Exact" attention is exact in exact arithmetic only; tiled and naive orders
/// round differently, so no check in this project asks for bitwise equality.
///
/// ErrorStats made by hand without per-row data (no `row_err`) are judged as one row with
/// s = ref_max_abs.

#include <cstddef>
#include <string>
#include <vector>

#include "common/dtype.hpp"
#include "common/reference.hpp"

namespace attn {

struct ErrorStats {
  double max_abs = 0;      ///< max |out - ref| over the checked elements
  double rel_l2 = 0;       ///< ||out - ref||_2 / ||ref||_2
  double ref_max_abs = 0;  ///< max |ref| over the finite checked elements
  double l2 = 0;           ///< ||out - ref||_2 over the finite checked elements
  std::size_t checked = 0;
  /// Per checked row, in the order of CheckedRows::rows: max |out - ref| and max |ref|.
  std::vector<double> row_err, row_ref_max;
  /// A magnitude for the floor of a Magnitude::tensor check when max |ref| understates it
  /// (gradients through a score modifier: RefBackward::dq_unmodified_max); 0 when none.
  double floor_scale = 0;
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

/// How a tensor's magnitude is measured (the rule above):
/// - `row`: each row by its own max |ref| (O, P);
/// - `log`: each row by max(1, |ref|) (the LSE: an error in it is a relative error of the
///   softmax denominator, so the floor is never below u in absolute terms);
/// - `tensor`: the tensor as one row, by max(max |ref|, ErrorStats::floor_scale of the
///   yardstick) (dQ, dK, dV).
enum class Magnitude { row, log, tensor };

struct Verdict {
  bool pass = false;
  double tolerance = 0;      ///< the largest per-row tolerance tol_r (comparable to max_abs)
  double margin = 0;         ///< max_r e_r / tol_r: the share of its allowance the worst row uses
  double l2_tolerance = 0;   ///< the L2 bound
  std::vector<double> row_tolerance;  ///< tol_r per checked row (empty for hand-made stats)
  std::string reason;        ///< why it failed, empty on success
  /// The tolerance of checked row k (the single tolerance for hand-made stats).
  double tolerance_of(std::size_t k) const { return k < row_tolerance.size() ? row_tolerance[k] : tolerance; }
};

/// The acceptance rule above. `unwritten` is count_unwritten() over the whole output.
Verdict accept(const ErrorStats& kernel, const ErrorStats& naive, DType stored,
               std::size_t unwritten = 0, Magnitude magnitude = Magnitude::row);

/// Fills a host tensor with NaN, so that elements nobody writes fail the check.
void poison(std::vector<float>& x);

/// "first mismatches" text for a failing tensor: up to `limit` elements beyond tolerance.
template <class R>
std::string describe_mismatches(const float* out, const CheckedRows<R>& ref, double tolerance,
                                int limit = 5);
/// The same with each row's own tolerance (Verdict::tolerance_of).
template <class R>
std::string describe_mismatches(const float* out, const CheckedRows<R>& ref, const Verdict& v,
                                int limit = 5);

}  // namespace attn
