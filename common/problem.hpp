#pragma once
/// \file problem.hpp
/// \brief The attention problem every chapter solves, and the FLOP convention.
///
/// \f[ O = \mathrm{softmax}\!\left(\tau\, Q K^\top + \text{mask}\right) V,
///     \qquad \mathrm{LSE}_i = \log \sum_j e^{\tau\, q_i \cdot k_j} \f]
///
/// Layout, everywhere in the project (host vectors, CPU models, kernels):
///
///     Q, O, dO, dQ : [batch][heads   ][nq][d]    contiguous, d fastest
///     K, V, dK, dV : [batch][kv_heads][nk][d]
///     LSE          : [batch][heads   ][nq]
///
/// Grouped-query attention: query head `h` reads KV head `h / (heads / kv_heads)`.
/// Causal masking is aligned to the bottom-right corner when nq != nk, as
/// FlashAttention >= 2.1 does: query row i may see key column j iff
/// `j <= i + (nk - nq)`. A query row that sees no key is *empty*: its output is 0
/// and its LSE is -inf.

#include <cstddef>
#include <cstdint>
#include <string>

#include "common/dtype.hpp"

namespace attn {

struct Problem {
  int batch = 1;
  int heads = 1;     ///< query heads Hq
  int kv_heads = 1;  ///< key/value heads Hkv; heads % kv_heads == 0
  int nq = 128;      ///< query length
  int nk = 128;      ///< key/value length
  int d = 64;        ///< head dimension of Q and K
  int dv = 64;       ///< head dimension of V and O
  double scale = 0;  ///< softmax scale tau; 0 means 1/sqrt(d)
  bool causal = false;
  DType dtype = DType::bf16;

  /// tau, with the default 1/sqrt(d) filled in.
  double softmax_scale() const;
  int group() const { return heads / kv_heads; }
  int kv_head_of(int h) const { return h / group(); }

  /// Bottom-right aligned causal mask: true when query i may attend to key j.
  bool visible(int i, int j) const { return !causal || j <= i + (nk - nq); }
  /// Number of keys query row i sees (0 for an empty row).
  int visible_keys(int i) const;

  // Element counts of each tensor.
  std::size_t q_elems() const { return std::size_t(batch) * heads * nq * d; }
  std::size_t k_elems() const { return std::size_t(batch) * kv_heads * nk * d; }
  std::size_t v_elems() const { return std::size_t(batch) * kv_heads * nk * dv; }
  std::size_t o_elems() const { return std::size_t(batch) * heads * nq * dv; }
  std::size_t lse_elems() const { return std::size_t(batch) * heads * nq; }
  /// Elements of one score matrix S or P for all (batch, head).
  std::size_t s_elems() const { return std::size_t(batch) * heads * nq * nk; }

  // Offsets of the start of one (batch, head) slice.
  std::size_t q_off(int b, int h) const { return (std::size_t(b) * heads + h) * nq * d; }
  std::size_t o_off(int b, int h) const { return (std::size_t(b) * heads + h) * nq * dv; }
  std::size_t k_off(int b, int hk) const { return (std::size_t(b) * kv_heads + hk) * nk * d; }
  std::size_t v_off(int b, int hk) const { return (std::size_t(b) * kv_heads + hk) * nk * dv; }
  std::size_t lse_off(int b, int h) const { return (std::size_t(b) * heads + h) * nq; }

  /// Bytes of the ideal traffic: every input read once, every output written once.
  double ideal_fwd_bytes() const;
  double ideal_bwd_bytes() const;

  /// One-line description, e.g. "B=2 Hq=8 Hkv=2 Nq=1000 Nk=1000 d=64 bf16 causal".
  std::string describe() const;
};

/// Forward FLOPs as FlashAttention counts them: 4 * B * Hq * Nq * Nk * d
/// (two matmuls of 2 * Nq * Nk * d each), halved for causal square problems.
/// For causal Nq != Nk the exact count of visible pairs is used instead.
double flops_forward(const Problem& p);
/// Backward FLOPs: 2.5x the forward (five matmuls instead of two).
inline double flops_backward(const Problem& p) { return 2.5 * flops_forward(p); }

/// Throws UsageError (see cli.hpp) naming the first invalid field.
void validate(const Problem& p);

}  // namespace attn
