#pragma once
/// \file online_softmax.hpp
/// \brief The online-softmax state and its merge operator, written once for
///        CPU models and CUDA kernels alike (`__host__ __device__`).
///
/// A row of scores \f$x_1..x_n\f$ is summarised by the pair
/// \f[ (m, \ell) = \Big(\max_j x_j,\; \sum_j e^{x_j - m}\Big) \f]
/// and two summaries of disjoint parts of the row merge as
/// \f[ (m_a,\ell_a) \oplus (m_b,\ell_b) =
///     \big(m,\; \ell_a e^{m_a - m} + \ell_b e^{m_b - m}\big),\quad m = \max(m_a, m_b). \f]
/// \f$\oplus\f$ is commutative and associative, and \f$(-\infty, 0)\f$ is its
/// identity, so any split of the row, merged in any order or as a tree, gives the
/// same \f$(m,\ell)\f$ as one pass over the whole row (chapter 02 proves it).
///
/// Carrying an unnormalised output \f$O = \sum_j e^{x_j - m} v_j\f$ alongside gives
/// the state \f$(m, \ell, O)\f$ that every FlashAttention kernel keeps; the same
/// two weights rescale \f$\ell\f$ and \f$O\f$.
///
/// **Empty rows.** A row whose every score is masked (\f$-\infty\f$) keeps the
/// identity \f$(-\infty, 0)\f$. Naively, \f$x - m = -\infty - (-\infty)\f$ is NaN;
/// here every shift goes through finite_max(), which replaces an \f$m\f$ of
/// \f$-\infty\f$ by 0, so the weights become \f$e^{-\infty} = 0\f$ instead. Finalising
/// an empty row gives output 0 and LSE \f$= -\infty\f$, never NaN.
///
/// **Base 2.** GPUs evaluate \f$2^x\f$ in one instruction (`ex2.approx`) while
/// \f$e^x\f$ costs a multiply more. With \f$\log_2 e\f$ folded into the softmax scale,
/// scores become \f$x' = x \log_2 e\f$ and \f$e^{x - m} = 2^{x' - m'}\f$: the `Base2`
/// states below hold \f$m' = m \log_2 e\f$ and the same \f$\ell\f$.

#include <cmath>

#include "common/hd.hpp"

namespace attn {

/// \f$\log_2 e\f$, folded into the softmax scale by the base-2 kernels.
constexpr double kLog2e = 1.4426950408889634074;
/// \f$\ln 2\f$, to turn a base-2 LSE back into a natural one.
constexpr double kLn2 = 0.69314718055994530942;

template <class T> ATTN_HD T neg_inf();
template <> ATTN_HD float neg_inf<float>() { return -INFINITY; }
template <> ATTN_HD double neg_inf<double>() { return -double(INFINITY); }

template <class T> ATTN_HD T max_of(T a, T b) { return a > b ? a : b; }

/// The shift used in every exponent: m itself, or 0 when m is -inf (an empty row),
/// so that exp(x - shift) is exp(-inf) = 0 rather than NaN.
template <class T> ATTN_HD T finite_max(T m) { return m == neg_inf<T>() ? T(0) : m; }

/// Natural base: scores are tau * q.k, weights are e^(x - m).
struct BaseE {
  static ATTN_HD float exp(float x) { return ::expf(x); }
  static ATTN_HD double exp(double x) { return ::exp(x); }
  /// LSE in natural log from (m, l) held in this base.
  template <class T> static ATTN_HD T lse(T m, T l) { return m + log_(l); }
  static ATTN_HD float log_(float x) { return ::logf(x); }
  static ATTN_HD double log_(double x) { return ::log(x); }
};

/// Base 2: scores are tau * log2(e) * q.k, weights are 2^(x' - m').
struct Base2 {
  static ATTN_HD float exp(float x) { return ::exp2f(x); }
  static ATTN_HD double exp(double x) { return ::exp2(x); }
  template <class T> static ATTN_HD T lse(T m, T l) { return (m + log2_(l)) * T(kLn2); }
  static ATTN_HD float log2_(float x) { return ::log2f(x); }
  static ATTN_HD double log2_(double x) { return ::log2(x); }
};

/// The weights that bring two states with maxima ma and mb onto their common max.
template <class T>
struct MergeWeights {
  T m;   ///< max(ma, mb)
  T wa;  ///< base^(ma - m)
  T wb;  ///< base^(mb - m)
};

template <class Base = BaseE, class T>
ATTN_HD MergeWeights<T> merge_weights(T ma, T mb) {
  const T m = max_of(ma, mb);
  const T shift = finite_max(m);
  return {m, Base::exp(ma - shift), Base::exp(mb - shift)};
}

/// The running (m, l) of one softmax row.
template <class T = float, class Base = BaseE>
struct SoftmaxState {
  T m;  ///< running maximum (in Base's units)
  T l;  ///< running sum of Base^(x - m)

  /// The identity of the merge: (-inf, 0), the summary of an empty set of scores.
  static ATTN_HD SoftmaxState identity() { return {neg_inf<T>(), T(0)}; }
  /// A row with a learnable sink logit x (gpt-oss, FA4's learnable_sink): one more term
  /// e^x in the denominator and none in the output. The row simply starts from the state
  /// of that single score, (x, 1) instead of (-inf, 0); every push and merge is unchanged,
  /// and an all-masked row ends with output 0 and LSE = x. (x in Base's units.)
  static ATTN_HD SoftmaxState with_sink(T x) { return {x, T(1)}; }

  /// Adds one score x (a masked score is -inf and leaves the state unchanged).
  ATTN_HD void push(T x) {
    const T m_new = max_of(m, x);
    const T shift = finite_max(m_new);
    l = l * Base::exp(m - shift) + Base::exp(x - shift);
    m = m_new;
  }

  /// Natural-log LSE = m + log l; -inf for an empty row.
  ATTN_HD T lse() const { return l > T(0) ? Base::lse(m, l) : neg_inf<T>(); }
  /// exp(x - m) / l: the probability of a score x once the whole row has been seen.
  ATTN_HD T prob(T x) const { return l > T(0) ? Base::exp(x - finite_max(m)) / l : T(0); }
};

/// (m_a, l_a) (+) (m_b, l_b).
template <class T, class Base>
ATTN_HD SoftmaxState<T, Base> merge(const SoftmaxState<T, Base>& a, const SoftmaxState<T, Base>& b) {
  const MergeWeights<T> w = merge_weights<Base>(a.m, b.m);
  return {w.m, a.l * w.wa + b.l * w.wb};
}

/// (m, l, O) for one row with a compile-time output width D: what a kernel thread
/// or a flash-decoding split keeps. O is unnormalised until finalize().
template <int D, class T = float, class Base = BaseE>
struct AttnState {
  SoftmaxState<T, Base> s;
  T o[D];

  static ATTN_HD AttnState identity() {
    AttnState r;
    r.s = SoftmaxState<T, Base>::identity();
    for (int k = 0; k < D; ++k) r.o[k] = T(0);
    return r;
  }
  /// The state of a row with a learnable sink logit x: (x, 1, O = 0) (see SoftmaxState::with_sink).
  static ATTN_HD AttnState with_sink(T x) {
    AttnState r = identity();
    r.s = SoftmaxState<T, Base>::with_sink(x);
    return r;
  }

  /// Adds one (score, value row) pair.
  ATTN_HD void push(T x, const T* v) {
    const T m_new = max_of(s.m, x);
    const T shift = finite_max(m_new);
    const T alpha = Base::exp(s.m - shift);  // rescale of the old state
    const T p = Base::exp(x - shift);
    s.l = s.l * alpha + p;
    s.m = m_new;
    for (int k = 0; k < D; ++k) o[k] = o[k] * alpha + p * v[k];
  }

  /// O / l, or 0 for an empty row.
  ATTN_HD T out(int k) const { return s.l > T(0) ? o[k] / s.l : T(0); }
};

template <int D, class T, class Base>
ATTN_HD AttnState<D, T, Base> merge(const AttnState<D, T, Base>& a, const AttnState<D, T, Base>& b) {
  const MergeWeights<T> w = merge_weights<Base>(a.s.m, b.s.m);
  AttnState<D, T, Base> r;
  r.s = {w.m, a.s.l * w.wa + b.s.l * w.wb};
  for (int k = 0; k < D; ++k) r.o[k] = a.o[k] * w.wa + b.o[k] * w.wb;
  return r;
}

/// Runtime-width merge for CPU models: (sa, oa) (+) (sb, ob) -> (sa, oa), width dv.
template <class T, class Base>
ATTN_HD void merge_into(SoftmaxState<T, Base>& sa, T* oa, const SoftmaxState<T, Base>& sb,
                        const T* ob, int dv) {
  const MergeWeights<T> w = merge_weights<Base>(sa.m, sb.m);
  sa = {w.m, sa.l * w.wa + sb.l * w.wb};
  for (int k = 0; k < dv; ++k) oa[k] = oa[k] * w.wa + ob[k] * w.wb;
}

}  // namespace attn
