#pragma once
/// \file shapes.hpp
/// \brief The problem shapes the tests are written in, one named field at a time.
///
///     shape().n(100).d(64).causal()                       // B=1 H=1 N=100 d=64, causal
///     shape().batch(2).heads(4, 2).n(130, 67).d(32)       // GQA, Nq > Nk
///     shape().heads(2).n(70, 90).d(32).dtype(DType::f16)  // Hq = Hkv = 2
///
/// A field that is not named keeps its default: one batch, one head (and one KV
/// head), not causal, bf16, the default softmax scale. The lengths and the head
/// dimension have no default (they start at 0, which `attn::validate` rejects):
/// every shape names `n(...)` and `d(...)`.
/// A `Shape` converts to `attn::Problem` wherever one is expected.
#include "common/problem.hpp"

namespace testing_support {

class Shape {
 public:
  Shape() { p_.nq = p_.nk = p_.d = p_.dv = 0; }

  /// B batches.
  Shape& batch(int b) {
    p_.batch = b;
    return *this;
  }
  /// Hq query heads and as many KV heads (multi-head attention).
  Shape& heads(int hq) { return heads(hq, hq); }
  /// Hq query heads reading Hkv KV heads (GQA when 1 < Hkv < Hq, MQA when Hkv = 1).
  Shape& heads(int hq, int hkv) {
    p_.heads = hq;
    p_.kv_heads = hkv;
    return *this;
  }
  /// A square problem: Nq = Nk = n.
  Shape& n(int len) { return n(len, len); }
  /// Nq query rows and Nk keys.
  Shape& n(int nq, int nk) {
    p_.nq = nq;
    p_.nk = nk;
    return *this;
  }
  /// The head dimension of Q, K, V and O (d = dv).
  Shape& d(int dim) {
    p_.d = p_.dv = dim;
    return *this;
  }
  /// A V/O head dimension other than d (call after d()).
  Shape& dv(int dim) {
    p_.dv = dim;
    return *this;
  }
  /// Bottom-right aligned causal mask (or not, for `causal(false)`).
  Shape& causal(bool on = true) {
    p_.causal = on;
    return *this;
  }
  /// The stored type of Q, K, V and O.
  Shape& dtype(attn::DType t) {
    p_.dtype = t;
    return *this;
  }
  /// The softmax scale tau (0: 1/sqrt(d)).
  Shape& scale(double tau) {
    p_.scale = tau;
    return *this;
  }

  const attn::Problem& problem() const { return p_; }
  operator attn::Problem() const { return p_; }  // NOLINT: implicit on purpose

 private:
  attn::Problem p_;
};

/// Starts a shape: name its fields with the setters of `Shape`.
inline Shape shape() { return Shape{}; }

}  // namespace testing_support
