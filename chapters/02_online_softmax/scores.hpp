#pragma once
/// \file scores.hpp
/// \brief Chapter 02's problem: rows of scores, the seeded inputs, and the oracle that
///        judges every algorithm against an fp64 reference.
///
/// Chapter 01 computed \f$S = \tau QK^\top\f$ and then ran a softmax over each row of S.
/// This chapter studies that softmax alone, so it takes the scores as given:
///
///     S   : [batch][heads   ][nq][nk]   fp32 scores, one row of nk per query
///     V   : [batch][kv_heads][nk][dv]   fp32 values (the fused one-pass variant only)
///     P   : [batch][heads   ][nq][nk]   P_ij = exp(tau S_ij - m_i) / l_i
///     O   : [batch][heads   ][nq][dv]   O_i = sum_j P_ij V_j   (fused variant; P is never stored)
///     LSE : [batch][heads   ][nq]       log sum_j exp(tau S_ij);  -inf for an empty row
///
/// A row is what one query of an attention problem sees, so every Problem field keeps
/// its meaning: `--n`/`--nk` set the row length, batch x heads x nq is the number of
/// rows, the causal mask hides the same keys (bottom-right aligned when nq != nk, so
/// the first nq - nk rows of a causal problem with nq > nk are empty), and query head
/// h reads KV head h / (heads / kv_heads) of V. The scale \f$\tau\f$ is 1 unless `--scale`.

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <vector>

#include "common/check.hpp"
#include "common/index.hpp"
#include "common/inputs.hpp"
#include "common/problem.hpp"

namespace attn::ch02 {

/// The chapter's inputs, in fp32.
struct SoftmaxInputs {
  std::vector<float> s;  ///< scores S, p.s_elems()
  std::vector<float> v;  ///< values V, p.v_elems()
};

/// Offset of mean-shifted scores unless `--shift` says otherwise: every score moves by
/// +100, above \f$\ln(\mathrm{FLT\_MAX}) \approx 88.72\f$, where \f$e^x\f$ overflows fp32.
/// A softmax that forgets to subtract the row maximum fails on these; one that
/// subtracts it cannot tell them from unshifted scores.
constexpr double kDefaultShift = 100.0;

/// \f$\ln(\mathrm{FLT\_MAX})\f$: the largest x whose \f$e^x\f$ is finite in fp32.
constexpr double kLogFltMax = 88.72283905206835;

/// Seeded S and V for `p`. Each row of S is drawn from its own stream, so rows can be
/// generated in parallel and the same seed gives the same scores on every machine.
/// Mean shifting (by `shift`) moves the scores only; V stays centred.
SoftmaxInputs make_softmax_inputs(const Problem& p, Dist dist, uint64_t seed, double shift = kDefaultShift);

/// Number of rows of scores: batch x heads x nq.
inline std::size_t row_count(const Problem& p) { return p.lse_elems(); }

/// The last key that query row i (0 <= i < nq) sees: nk - 1, or i + nk - nq under the
/// bottom-right causal mask. Negative for an empty row.
inline int last_visible(const Problem& p, int i) {
  return p.causal ? std::min(i + causal_diag(p.nq, p.nk), p.nk - 1) : p.nk - 1;
}

/// The fp64 reference and the same-precision yardstick for the rows of a CheckPlan,
/// and the acceptance rule of compare.hpp applied to P, O and the LSE.
///
/// The yardstick is the plain way to compute the same rows in fp32: the safe softmax
/// of three passes with a sequential sum, then \f$O = PV\f$ by a sequential dot product.
/// A variant passes by the rule of compare.hpp, as every chapter's kernels must: per
/// row, its error at most twice the yardstick's plus \f$u\f$ times the row's own
/// \f$\max|\mathrm{ref}|\f$ (the LSE: \f$\max(1, |\mathrm{ref}|)\f$), and the same in L2.
class SoftmaxOracle {
 public:
  SoftmaxOracle(const Problem& p, const SoftmaxInputs& in, CheckPlan plan);
  /// Judges P (p.s_elems() values) and the LSE (p.lse_elems()) of a softmax variant.
  CheckResult judge_softmax(const std::vector<float>& prob, const std::vector<float>& lse) const;
  /// Judges O (p.o_elems()) and the LSE of the fused variant.
  CheckResult judge_fused(const std::vector<float>& o, const std::vector<float>& lse) const;

  const CheckPlan& plan() const { return plan_; }
  /// The reference P, O and LSE of the checked rows.
  const CheckedRows<double>& ref_p() const { return ref_p_; }
  const CheckedRows<double>& ref_o() const { return ref_o_; }
  const CheckedRows<double>& ref_lse() const { return ref_lse_; }
  /// The largest finite LSE of the checked rows. When it exceeds kLogFltMax, a softmax
  /// that sums \f$e^x\f$ without subtracting the maximum overflows fp32.
  double max_lse() const { return max_lse_; }

 private:
  Problem p_;
  CheckPlan plan_;
  CheckedRows<double> ref_p_, ref_o_, ref_lse_;
  ErrorStats naive_p_, naive_o_, naive_lse_;
  double max_lse_ = 0;
};

}  // namespace attn::ch02
