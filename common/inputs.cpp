#include "common/inputs.hpp"

#include <cmath>

namespace attn {

const char* dist_name(Dist d) {
  switch (d) {
    case Dist::normal: return "normal";
    case Dist::mean_shifted: return "mean-shifted";
    case Dist::outliers: return "outliers";
    case Dist::integers: return "integers";
  }
  return "?";
}

bool parse_dist(const std::string& s, Dist* out) {
  if (s == "normal") { *out = Dist::normal; return true; }
  if (s == "mean-shifted" || s == "shifted") { *out = Dist::mean_shifted; return true; }
  if (s == "outliers") { *out = Dist::outliers; return true; }
  if (s == "integers") { *out = Dist::integers; return true; }
  return false;
}

uint64_t Rng::next_u64() {
  uint64_t z = (state_ += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

double Rng::uniform() { return double(next_u64() >> 11) * 0x1.0p-53; }

double Rng::normal() {
  if (has_spare_) {
    has_spare_ = false;
    return spare_;
  }
  double u1 = uniform();
  while (u1 <= 0) u1 = uniform();
  const double u2 = uniform();
  const double r = std::sqrt(-2.0 * std::log(u1));
  const double t = 6.283185307179586 * u2;
  spare_ = r * std::sin(t);
  has_spare_ = true;
  return r * std::cos(t);
}

int Rng::range(int lo, int hi) { return lo + int(next_u64() % uint64_t(hi - lo + 1)); }

void fill(std::vector<float>& x, std::size_t n, Dist dist, uint64_t seed, uint64_t stream,
          DType dtype, double shift) {
  x.resize(n);
  Rng rng(seed * 0x100000001b3ull + stream * 0x9e3779b97f4a7c15ull + 1);
  for (std::size_t i = 0; i < n; ++i) {
    double v = 0;
    switch (dist) {
      case Dist::normal: v = rng.normal(); break;
      case Dist::mean_shifted: v = rng.normal() + shift; break;
      case Dist::outliers: v = rng.normal(); if (rng.next_u64() % 256 == 0) v *= 20.0; break;
      case Dist::integers: v = rng.range(-2, 2); break;
    }
    x[i] = round_to(dtype, float(v));
  }
}

AttnInputs make_inputs(const Problem& p, Dist dist, uint64_t seed, bool with_dout) {
  AttnInputs in;
  // Mean shifting moves Q and K only: V and dO stay centred.
  const Dist vd = dist == Dist::mean_shifted ? Dist::normal : dist;
  fill(in.q, p.q_elems(), dist, seed, 1, p.dtype);
  fill(in.k, p.k_elems(), dist, seed, 2, p.dtype);
  fill(in.v, p.v_elems(), vd, seed, 3, p.dtype);
  if (with_dout) fill(in.dout, p.o_elems(), vd, seed, 4, p.dtype);
  return in;
}

}  // namespace attn
