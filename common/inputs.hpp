#pragma once
/// \file inputs.hpp
/// \brief Seeded inputs: the same seed gives the same tensors on every machine.
///
/// Random attention inputs hide bugs when they are too kind. Besides plain
/// normal values the project uses mean-shifted inputs (every score shares a large
/// offset, so a missing max-subtraction or a wrong rescale shows up as a large
/// relative error) and inputs with outliers (a few large entries, as real
/// activations have). Integers in [-2, 2] make small problems exactly checkable.

#include <cstdint>
#include <string>
#include <vector>

#include "common/problem.hpp"

namespace attn {

enum class Dist {
  normal,        ///< N(0, 1)
  mean_shifted,  ///< N(0, 1) + 2 in Q and K: scores get a large common offset
  outliers,      ///< N(0, 1) with 1 entry in 256 scaled by 20
  integers,      ///< uniform over {-2, -1, 0, 1, 2}
};

const char* dist_name(Dist d);
bool parse_dist(const std::string& s, Dist* out);

/// SplitMix64: tiny, fast, and identical on every platform (unlike std:: distributions).
class Rng {
 public:
  explicit Rng(uint64_t seed) : state_(seed) {}
  uint64_t next_u64();
  /// Uniform in [0, 1).
  double uniform();
  /// Standard normal (Box-Muller).
  double normal();
  /// Uniform integer in [lo, hi].
  int range(int lo, int hi);
  /// The generator's counter: it advances by one fixed step per next_u64(), so Rng(state + k * step)
  /// starts k draws later (how fill() splits one stream over threads and checks that it did).
  uint64_t state() const { return state_; }

 private:
  uint64_t state_;
  bool has_spare_ = false;
  double spare_ = 0;
};

/// Fills `x` with `n` values of distribution `dist`, rounded to `dtype`.
/// `stream` separates tensors drawn from one seed (Q, K, V, dO use 1, 2, 3, 4).
void fill(std::vector<float>& x, std::size_t n, Dist dist, uint64_t seed, uint64_t stream,
          DType dtype, double shift = 2.0);

/// The four tensors of a forward + backward problem, already in the problem's dtype.
struct AttnInputs {
  std::vector<float> q, k, v, dout;
};

/// Q, K, V (and dO when `with_dout`) for `p`. Mean shifting applies to Q and K.
AttnInputs make_inputs(const Problem& p, Dist dist, uint64_t seed, bool with_dout = false);

}  // namespace attn
