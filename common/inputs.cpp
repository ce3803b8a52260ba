#include "common/inputs.hpp"

#include <algorithm>
#include <atomic>
#include <cmath>

#include "common/parallel.hpp"

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

namespace {

constexpr uint64_t kStep = 0x9e3779b97f4a7c15ull;  // Rng's counter step (next_u64)

/// next_u64() draws that `count` consecutive elements take, starting at an even index, when no
/// Box-Muller draw is rejected: a normal pair takes two, an outlier test one per element.
uint64_t draws_of(Dist dist, std::size_t count) {
  const uint64_t pairs = (count + 1) / 2;
  switch (dist) {
    case Dist::normal:
    case Dist::mean_shifted: return 2 * pairs;
    case Dist::outliers: return 2 * pairs + count;
    case Dist::integers: return count;
  }
  return 0;
}

/// Elements [begin, end) of the stream that starts at counter `start`; returns the counter after.
uint64_t fill_range(float* x, std::size_t begin, std::size_t end, Dist dist, uint64_t start, DType dtype,
                    double shift) {
  Rng rng(start + draws_of(dist, begin) * kStep);
  for (std::size_t i = begin; i < end; ++i) {
    double v = 0;
    switch (dist) {
      case Dist::normal: v = rng.normal(); break;
      case Dist::mean_shifted: v = rng.normal() + shift; break;
      case Dist::outliers: v = rng.normal(); if (rng.next_u64() % 256 == 0) v *= 20.0; break;
      case Dist::integers: v = rng.range(-2, 2); break;
    }
    x[i] = round_to(dtype, float(v));
  }
  return rng.state();
}

}  // namespace

void fill(std::vector<float>& x, std::size_t n, Dist dist, uint64_t seed, uint64_t stream,
          DType dtype, double shift) {
  x.resize(n);
  const uint64_t start = seed * 0x100000001b3ull + stream * kStep + 1;
  // One stream, split into chunks of an even length that threads fill from the counter they
  // start at. The values are those of one serial pass, unless a Box-Muller draw was rejected
  // (u1 = 0, probability 2^-53 per draw), which shifts the rest of the stream: a chunk that ends
  // at another counter than expected says so, and the serial pass runs instead.
  constexpr std::size_t kChunk = std::size_t(1) << 20;
  const long chunks = long((n + kChunk - 1) / kChunk);
  if (chunks <= 1) {
    fill_range(x.data(), 0, n, dist, start, dtype, shift);
    return;
  }
  std::atomic<bool> exact{true};
  parallel_for(chunks, [&](long c) {
    const std::size_t b = std::size_t(c) * kChunk, e = std::min(n, b + kChunk);
    if (fill_range(x.data(), b, e, dist, start, dtype, shift) != start + (draws_of(dist, b) + draws_of(dist, e - b)) * kStep)
      exact = false;
  });
  if (!exact) fill_range(x.data(), 0, n, dist, start, dtype, shift);
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
