#pragma once
/// \file reference.hpp
/// \brief The fp64 reference every kernel is judged against (Eigen), and the
///        same-precision naive computation that sets each kernel's tolerance.
///
/// Forward, for one (batch, head) and query row i:
/// \f[ s_{ij} = \tau\, q_i \cdot k_j,\quad x_{ij} = \mathrm{mod}(s_{ij})\ \text{or}\ -\infty
///     \text{ if masked},\quad P_{ij} = \frac{e^{x_{ij}}}{\sum_j e^{x_{ij}}},\quad
///     O_i = \sum_j P_{ij} v_j,\quad \mathrm{LSE}_i = \log\sum_j e^{x_{ij}} \f]
/// Backward, with \f$D_i = dO_i \cdot O_i\f$:
/// \f[ dV = P^\top dO,\quad dP = dO\,V^\top,\quad dX = P \circ (dP - D),\quad
///     dS = dX \circ \mathrm{mod}'(s),\quad dQ = \tau\, dS\,K,\quad dK = \tau\, dS^\top Q \f]
///
/// Large problems cannot be checked in fp64 on every row in reasonable time, so a
/// CheckPlan chooses which heads and rows the reference computes; rows are
/// independent in the forward pass, and a KV group (one KV head and the query
/// heads that share it) is independent in the backward pass. Every output element
/// is still checked for NaN (the poison test), checked rows or not.

#include <cstddef>
#include <limits>
#include <string>
#include <utility>
#include <vector>

#include "common/inputs.hpp"
#include "common/problem.hpp"

namespace attn {

/// The hook for masks and score modifiers beyond the problem's causal mask
/// (sliding window, ALiBi, softcap, ...). The reference asks keep() first; a kept
/// score s = tau * q.k becomes apply(s), and the backward multiplies by grad(s).
struct ScoreMod {
  virtual ~ScoreMod() = default;
  virtual std::string name() const = 0;
  /// False masks the pair out (on top of the problem's own causal mask).
  virtual bool keep(const Problem&, int /*b*/, int /*h*/, int /*i*/, int /*j*/) const { return true; }
  /// The modified score; identity by default.
  virtual double apply(const Problem&, int /*b*/, int /*h*/, int /*i*/, int /*j*/, double s) const {
    return s;
  }
  /// d apply / d s; 1 by default.
  virtual double grad(const Problem&, int /*b*/, int /*h*/, int /*i*/, int /*j*/, double /*s*/) const {
    return 1.0;
  }
  /// A learnable sink logit of head (b, h): one more term e^sink in every row's softmax
  /// denominator, with no value row (gpt-oss, FA4's learnable_sink). The LSE includes it;
  /// P and O do not. -inf (the default) means no sink.
  virtual double sink(const Problem&, int /*b*/, int /*h*/) const { return -std::numeric_limits<double>::infinity(); }
};

/// Rows of a [rows][width] tensor that a check covers, with their values.
template <class T>
struct CheckedRows {
  int width = 0;
  std::vector<std::size_t> rows;  ///< global row indices into the tensor
  std::vector<T> values;          ///< rows.size() * width
  const T* row(std::size_t k) const { return values.data() + k * width; }
};

/// Which query heads and rows the forward check computes.
struct CheckPlan {
  std::vector<std::pair<int, int>> heads;  ///< (batch, query head)
  std::vector<int> rows;                   ///< query rows of each head, ascending

  /// Every head and every row.
  static CheckPlan full(const Problem& p);
  /// Every (batch, head) pair, on rows 0, 1, the last two rows and evenly spaced ones
  /// between: as many as about `budget_flops` of fp64 work allows, never fewer than 8 a
  /// head (or all, when N < 8). Deterministic. Returns full() when that already fits.
  static CheckPlan sampled(const Problem& p, double budget_flops = 4e9);
  bool covers_everything(const Problem& p) const;
  std::string describe(const Problem& p) const;
};

/// Which KV groups the backward check computes (dK/dV of a KV head need all its rows).
struct BackwardPlan {
  std::vector<std::pair<int, int>> kv_groups;  ///< (batch, kv head)
  static BackwardPlan full(const Problem& p);
  /// The first and last KV groups and at least one between (evenly spaced, more as about
  /// `budget_flops` of fp64 work allows). Deterministic. Returns full() when that fits.
  static BackwardPlan sampled(const Problem& p, double budget_flops = 8e9);
  bool covers_everything(const Problem& p) const;
  std::string describe(const Problem& p) const;
};

struct RefForward {
  CheckedRows<double> o;    ///< width dv
  CheckedRows<double> lse;  ///< width 1; -inf for empty rows
};

struct RefBackward {
  CheckedRows<double> dq, dk, dv;
  /// With a score modifier: max |dQ| and max |dK| over the checked groups with the modifier's
  /// derivative taken as 1 (0 without one). A kernel computes that derivative in its own
  /// arithmetic (softcap: 1 - tanh^2 from an approximate tanh), with an error that is absolute,
  /// not relative to the derivative, so where the modifier saturates the gradients' floor
  /// scales with these magnitudes, not with the (then tiny) gradients themselves.
  double dq_unmodified_max = 0, dk_unmodified_max = 0;
};

/// fp64 forward on the plan's rows.
RefForward reference_forward(const Problem& p, const AttnInputs& in, const CheckPlan& plan,
                             const ScoreMod* mod = nullptr);

/// fp64 backward on the plan's KV groups (needs in.dout).
RefBackward reference_backward(const Problem& p, const AttnInputs& in, const BackwardPlan& plan,
                               const ScoreMod* mod = nullptr);

/// The same rows computed the plain way in the problem's precision: fp32 dot
/// products and softmax, P rounded to the dtype before P V, O rounded to the dtype.
/// Its error against the fp64 reference is the yardstick for every kernel.
struct NaiveForward {
  CheckedRows<float> o, lse;
};
NaiveForward naive_forward_same_precision(const Problem& p, const AttnInputs& in,
                                          const CheckPlan& plan, const ScoreMod* mod = nullptr);

/// Materialising backward in the problem's precision: fp32 accumulation, P and dS
/// rounded to the dtype before they enter a product, outputs rounded to the dtype.
struct NaiveBackward {
  CheckedRows<float> dq, dk, dv;
};
NaiveBackward naive_backward_same_precision(const Problem& p, const AttnInputs& in,
                                            const BackwardPlan& plan, const ScoreMod* mod = nullptr);

}  // namespace attn
