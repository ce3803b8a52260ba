#pragma once
/// \file hadamard.hpp
/// \brief The fast Walsh-Hadamard transform: x <- H x / sqrt(d), H the d x d
///        Sylvester-Hadamard matrix, d a power of two.
///
/// H / sqrt(d) is orthogonal and symmetric, so rotating both operands of a dot product
/// by it keeps the product, (q H)(k H)^T = q k^T, while spreading one large entry of q
/// over all d entries. Chapter 05 rotates Q and K before its FP8 quantisation, chapter
/// 07 rotates the cached keys (and the query) before the 8-bit KV formats.
///
///     h = 1:  (x0 x1)(x2 x3)(x4 x5)(x6 x7)      pairs h apart, in blocks of 2h:
///     h = 2:  (x0 x2)(x1 x3)(x4 x6)(x5 x7)      (a, b) <- (a + b, a - b)
///     h = 4:  (x0 x4)(x1 x5)(x2 x6)(x3 x7)
///
/// log2(d) levels of d/2 butterflies: d log2(d) additions instead of the d^2 of the
/// matrix product. The butterfly is a parameter so that chapter 05's exercise ch05.2
/// (write the butterfly) runs through this same loop.

#include <cmath>

namespace attn {

/// One butterfly of the transform: (a, b) <- (a + b, a - b).
struct HadamardButterfly {
  void operator()(float& a, float& b) const {
    const float x = a, y = b;
    a = x + y;
    b = x - y;
  }
};

/// x <- H x / sqrt(d) in place; d must be a power of two (the caller checks).
template <class Butterfly = HadamardButterfly>
void walsh_hadamard(float* x, int d, Butterfly butterfly = {}) {
  for (int h = 1; h < d; h *= 2)
    for (int i = 0; i < d; i += 2 * h)
      for (int k = i; k < i + h; ++k) butterfly(x[k], x[k + h]);
  const float r = float(1.0 / std::sqrt(double(d)));
  for (int k = 0; k < d; ++k) x[k] *= r;
}

}  // namespace attn
