// The merge operator (+) of online softmax, proved by tests over seeded random rows and
// random partitions: each property the chapter's derivation uses, in the order the
// README's proof takes them. The operator under test is common's merge(); the chapter
// only adds merge_by_hand() for exercise ch02.1.
//
// Error bound used for fp32 (first order, u = 2^-24, expf within 1 ulp): one merge of
// states whose maxima are delta apart multiplies the smaller side by e^-delta, where the
// rounding of the exponent costs delta u, expf 2u, the product u and the sum u; the larger
// side is multiplied by e^0 = 1 exactly. So a state built by k levels of merging has
//
//     |l_hat - l| <= k (4 + Delta) u l,   |O_hat - O| <= k (4 + Delta) u sum_j e^(x_j - m) |v_j|
//
// with Delta the largest gap between merged maxima. Two groupings of the same states
// differ by at most twice that.
#include <doctest/doctest.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <limits>
#include <vector>

#include "chapters/02_online_softmax/scores.hpp"
#include "chapters/02_online_softmax/softmax_model.hpp"
#include "common/inputs.hpp"
#include "common/online_softmax.hpp"

using namespace attn;
using namespace attn::ch02;

namespace {

constexpr double kU = 0x1p-24;  // unit roundoff of fp32
constexpr int kDv = 3;          // width of the values carried in (m, l, O)
constexpr double kInf = std::numeric_limits<double>::infinity();

template <class T>
using State = AttnState<kDv, T>;

/// A row of scores x_j with values v_j (kDv each), exactly representable in fp32.
struct Row {
  std::vector<float> x;
  std::vector<std::array<float, kDv>> v;
  int size() const { return int(x.size()); }
};

/// n scores: N(offset, scale^2), a `masked` share of them -inf.
Row random_row(Rng& rng, int n, double scale, double offset, double masked) {
  Row r;
  for (int j = 0; j < n; ++j) {
    r.x.push_back(rng.uniform() < masked ? -INFINITY : float(offset + scale * rng.normal()));
    r.v.push_back({float(rng.normal()), float(rng.normal()), float(rng.normal())});
  }
  return r;
}

Row random_row(Rng& rng) {
  const int n = rng.range(1, 300);
  const double scale = 0.5 + 4.5 * rng.uniform(), offset = -50 + 170 * rng.uniform();
  return random_row(rng, n, scale, offset, rng.uniform() < 0.3 ? 0.3 : 0.0);
}

/// The summary of x[lo, hi), built by pushing one score at a time.
template <class T>
State<T> summarise(const Row& r, int lo, int hi) {
  State<T> s = State<T>::identity();
  for (int j = lo; j < hi; ++j) {
    T v[kDv];
    for (int c = 0; c < kDv; ++c) v[c] = T(r.v[j][c]);
    s.push(T(r.x[j]), v);
  }
  return s;
}

/// The exact summary of x[lo, hi) in fp64, two passes, plus sum e^(x - m) |v| per column.
struct Exact {
  double m = -kInf, l = 0;
  std::array<double, kDv> o{}, o_abs{};
  double lse() const { return l > 0 ? m + std::log(l) : -kInf; }
};

Exact exact(const Row& r, int lo, int hi) {
  Exact e;
  for (int j = lo; j < hi; ++j) e.m = std::max(e.m, double(r.x[j]));
  if (e.m == -kInf) return e;
  for (int j = lo; j < hi; ++j) {
    const double w = std::exp(double(r.x[j]) - e.m);
    e.l += w;
    for (int c = 0; c < kDv; ++c) {
      e.o[c] += w * r.v[j][c];
      e.o_abs[c] += w * std::abs(double(r.v[j][c]));
    }
  }
  return e;
}

/// k - 1 random cut points in [0, n]: k blocks, some of them possibly empty.
std::vector<int> random_cuts(Rng& rng, int n, int k) {
  std::vector<int> cuts = {0, n};
  for (int c = 1; c < k; ++c) cuts.push_back(rng.range(0, n));
  std::sort(cuts.begin(), cuts.end());
  return cuts;
}

template <class T>
State<T> fold(const std::vector<State<T>>& blocks, const std::vector<int>& order) {
  State<T> acc = State<T>::identity();
  for (int b : order) acc = merge(acc, blocks[b]);
  return acc;
}

/// Adjacent pairs merged level by level, as a reduction tree.
template <class T>
State<T> tree(std::vector<State<T>> level) {
  while (level.size() > 1) {
    std::vector<State<T>> next;
    for (std::size_t k = 0; k + 1 < level.size(); k += 2) next.push_back(merge(level[k], level[k + 1]));
    if (level.size() % 2) next.push_back(level.back());
    level = next;
  }
  return level.empty() ? State<T>::identity() : level[0];
}

int ceil_log2(int n) {
  int d = 0;
  while ((1 << d) < n) ++d;
  return d;
}

/// The gap between the largest and the smallest finite score of a row (bounds every delta).
double spread(const Row& r) {
  double lo = kInf, hi = -kInf;
  for (float x : r.x)
    if (std::isfinite(x)) lo = std::min(lo, double(x)), hi = std::max(hi, double(x));
  return hi >= lo ? hi - lo : 0.0;
}

template <class T>
bool same_bits(const State<T>& a, const State<T>& b) {
  if (!(a.s.m == b.s.m) || !(a.s.l == b.s.l)) return false;
  for (int c = 0; c < kDv; ++c)
    if (!(a.o[c] == b.o[c])) return false;
  return true;
}

template <class T>
bool has_nan(const State<T>& a) {
  bool nan = std::isnan(a.s.m) || std::isnan(a.s.l);
  for (int c = 0; c < kDv; ++c) nan = nan || std::isnan(a.o[c]);
  return nan;
}

/// |got - want| within rel * scale (scale = l, or the column's absolute weighted sum).
template <class T>
void check_close(const State<T>& got, const Exact& want, double rel) {
  CHECK(double(got.s.m) == want.m);
  CHECK(std::abs(double(got.s.l) - want.l) <= rel * want.l);
  for (int c = 0; c < kDv; ++c) CHECK(std::abs(double(got.o[c]) - want.o[c]) <= rel * want.o_abs[c] + 1e-300);
}

}  // namespace

TEST_CASE("merge: any split of a row, merged in any order, gives the softmax and the weighted sum of the whole row") {
  int trials = 0, empty_blocks = 0;
  for (uint64_t seed = 0; seed < 300; ++seed) {
    CAPTURE(seed);
    Rng rng(seed);
    const Row r = random_row(rng);
    const int k = rng.range(1, 12);
    const std::vector<int> cuts = random_cuts(rng, r.size(), k);
    std::vector<State<double>> b64;
    std::vector<State<float>> b32;
    for (int b = 0; b < k; ++b) {
      b64.push_back(summarise<double>(r, cuts[b], cuts[b + 1]));
      b32.push_back(summarise<float>(r, cuts[b], cuts[b + 1]));
      empty_blocks += cuts[b] == cuts[b + 1];
    }
    std::vector<int> order(k);
    for (int b = 0; b < k; ++b) order[b] = b;
    for (int b = k - 1; b > 0; --b) std::swap(order[b], order[rng.range(0, b)]);  // Fisher-Yates
    const Exact want = exact(r, 0, r.size());
    const State<double> got = fold(b64, order);

    // fp64: the identity of exact arithmetic, to rounding.
    check_close(got, want, 1e-13);
    if (want.l > 0) {
      CHECK(got.s.lse() == doctest::Approx(want.lse()).epsilon(1e-13));
      for (int c = 0; c < kDv; ++c)
        CHECK(std::abs(got.out(c) - want.o[c] / want.l) <= 1e-13 * want.o_abs[c] / want.l);
    } else {  // every score masked
      CHECK(got.s.lse() == -kInf);
      for (int c = 0; c < kDv; ++c) CHECK(got.out(c) == 0.0);
    }
    for (int j = 0; j < r.size(); ++j) {
      const double p = want.l > 0 && std::isfinite(r.x[j]) ? std::exp(r.x[j] - want.m) / want.l : 0.0;
      CHECK(std::abs(got.s.prob(r.x[j]) - p) <= 1e-13);
    }

    // fp32: within the bound, at the depth of the deepest score (pushes in its block, then merges).
    int depth = 0;
    for (int pos = 0; pos < k; ++pos) depth = std::max(depth, (cuts[order[pos] + 1] - cuts[order[pos]]) + (k - pos));
    check_close(fold(b32, order), want, depth * (4 + spread(r)) * kU * 1.01);
    ++trials;
  }
  CHECK(trials == 300);
  CHECK(empty_blocks > 0);  // the partitions did include empty blocks
}

TEST_CASE("merge is commutative, bit for bit") {
  for (uint64_t seed = 0; seed < 200; ++seed) {
    Rng rng(1000 + seed);
    const Row r = random_row(rng);
    const int cut = rng.range(0, r.size());
    for (bool equal_max : {false, true}) {
      State<float> a = summarise<float>(r, 0, cut), b = summarise<float>(r, cut, r.size());
      if (equal_max && std::isfinite(a.s.m) && std::isfinite(b.s.m)) b.s.m = a.s.m;  // the tie m_a = m_b
      CHECK(same_bits(merge(a, b), merge(b, a)));
      const State<double> a64 = summarise<double>(r, 0, cut), b64 = summarise<double>(r, cut, r.size());
      CHECK(same_bits(merge(a64, b64), merge(b64, a64)));
    }
  }
}

TEST_CASE("merge is associative: exactly in fp64, within the stated bound in fp32") {
  double worst_ratio = 0;
  int differ = 0;
  for (uint64_t seed = 0; seed < 500; ++seed) {
    CAPTURE(seed);
    Rng rng(2000 + seed);
    const Row r = random_row(rng);
    const std::vector<int> c = random_cuts(rng, r.size(), 3);
    const State<double> a64 = summarise<double>(r, c[0], c[1]), b64 = summarise<double>(r, c[1], c[2]),
                        c64 = summarise<double>(r, c[2], c[3]);
    const State<double> left64 = merge(merge(a64, b64), c64), right64 = merge(a64, merge(b64, c64));
    CHECK(left64.s.m == right64.s.m);
    CHECK(std::abs(left64.s.l - right64.s.l) <= 1e-14 * left64.s.l);

    const State<float> a = summarise<float>(r, c[0], c[1]), b = summarise<float>(r, c[1], c[2]),
                       cc = summarise<float>(r, c[2], c[3]);
    const State<float> left = merge(merge(a, b), cc), right = merge(a, merge(b, cc));
    CHECK(left.s.m == right.s.m);
    // Both groupings are two merges deep: each within 2 (4 + Delta) u of the exact merge of a, b, c.
    double lo = kInf, hi = -kInf;
    for (const State<float>* s : {&a, &b, &cc})
      if (std::isfinite(s->s.m)) lo = std::min(lo, double(s->s.m)), hi = std::max(hi, double(s->s.m));
    const double delta = hi >= lo ? hi - lo : 0.0;
    const double bound = 2 * 2 * (4 + delta) * kU * 1.01;
    const double l = double(left.s.l);
    CHECK(std::abs(double(left.s.l) - double(right.s.l)) <= bound * l);
    for (int k = 0; k < kDv; ++k) {
      // The columns' absolute weighted sums, from the inputs: sum |O_s| e^(m_s - m).
      double scale = 0;
      for (const State<float>* s : {&a, &b, &cc})
        if (std::isfinite(s->s.m)) scale += std::abs(double(s->o[k])) * std::exp(double(s->s.m) - double(left.s.m));
      CHECK(std::abs(double(left.o[k]) - double(right.o[k])) <= bound * scale + 1e-30);
    }
    if (l > 0) {
      const double ratio = std::abs(double(left.s.l) - double(right.s.l)) / (bound * l);
      worst_ratio = std::max(worst_ratio, ratio);
      differ += left.s.l != right.s.l;
    }
  }
  CHECK(differ > 0);          // fp32 grouping really does change the rounding...
  CHECK(worst_ratio <= 1.0);  // ...and always inside the bound
  MESSAGE("fp32 groupings differed in " << differ << " of 500 triples; worst difference " << worst_ratio
                                         << " of the bound");
}

TEST_CASE("(-inf, 0) is the identity of merge") {
  const State<float> id = State<float>::identity();
  CHECK(std::isinf(id.s.m));
  CHECK(id.s.m < 0);
  CHECK(id.s.l == 0.f);
  CHECK(same_bits(merge(id, id), id));
  CHECK_FALSE(has_nan(merge(id, id)));
  for (uint64_t seed = 0; seed < 100; ++seed) {
    Rng rng(3000 + seed);
    const Row r = random_row(rng);
    const State<float> a = summarise<float>(r, 0, r.size());
    CHECK(same_bits(merge(a, id), a));
    CHECK(same_bits(merge(id, a), a));
    const State<double> a64 = summarise<double>(r, 0, r.size());
    CHECK(same_bits(merge(a64, State<double>::identity()), a64));
    CHECK(same_bits(merge(State<double>::identity(), a64), a64));
  }
}

TEST_CASE("tree reduction equals the sequential scan") {
  for (uint64_t seed = 0; seed < 200; ++seed) {
    CAPTURE(seed);
    Rng rng(4000 + seed);
    const Row r = random_row(rng);
    const int k = rng.range(1, 64);
    const std::vector<int> cuts = random_cuts(rng, r.size(), k);
    std::vector<State<double>> b64;
    std::vector<State<float>> b32;
    int longest = 0;
    for (int b = 0; b < k; ++b) {
      b64.push_back(summarise<double>(r, cuts[b], cuts[b + 1]));
      b32.push_back(summarise<float>(r, cuts[b], cuts[b + 1]));
      longest = std::max(longest, cuts[b + 1] - cuts[b]);
    }
    std::vector<int> in_order(k);
    for (int b = 0; b < k; ++b) in_order[b] = b;
    const State<double> scan64 = fold(b64, in_order), tree64 = tree(b64);
    CHECK(tree64.s.m == scan64.s.m);
    CHECK(std::abs(tree64.s.l - scan64.s.l) <= 1e-13 * scan64.s.l);
    const State<float> scan32 = fold(b32, in_order), tree32 = tree(b32);
    CHECK(tree32.s.m == scan32.s.m);
    const double bound = ((longest + k) + (longest + ceil_log2(k))) * (4 + spread(r)) * kU * 1.01;
    CHECK(std::abs(double(tree32.s.l) - double(scan32.s.l)) <= bound * exact(r, 0, r.size()).l);
  }
}

TEST_CASE("the 32-lane butterfly of the kernels gives every lane the same state, equal to the scan") {
  // What warp_merge (row_ops.cuh) computes, lane by lane: at each step lane i merges
  // with lane i ^ offset, the lower lane's state first.
  for (uint64_t seed = 0; seed < 100; ++seed) {
    Rng rng(5000 + seed);
    const Row r = random_row(rng, 32 * rng.range(1, 8), 3.0, 100 * rng.uniform(), 0.2);
    const int per_lane = r.size() / 32;
    std::vector<SoftmaxState<float>> lanes(32);
    for (int t = 0; t < 32; ++t) {
      lanes[t] = SoftmaxState<float>::identity();
      for (int j = t; j < r.size(); j += 32) lanes[t].push(r.x[j]);  // thread t owns every 32nd score
    }
    for (int offset = 16; offset > 0; offset /= 2) {
      std::vector<SoftmaxState<float>> next(32);
      for (int t = 0; t < 32; ++t) {
        const int u = t ^ offset;
        next[t] = merge(lanes[std::min(t, u)], lanes[std::max(t, u)]);
      }
      lanes = next;
    }
    for (int t = 1; t < 32; ++t) {
      CHECK(lanes[t].m == lanes[0].m);
      CHECK(lanes[t].l == lanes[0].l);
    }
    const Exact want = exact(r, 0, r.size());
    CHECK(double(lanes[0].m) == want.m);
    CHECK(std::abs(double(lanes[0].l) - want.l) <= (per_lane + 5) * (4 + spread(r)) * kU * 1.01 * want.l);
  }
}

TEST_CASE("empty and fully masked blocks give no NaN and change nothing") {
  Rng rng(6000);
  const Row masked = random_row(rng, 50, 1.0, 0.0, 1.0);  // every score -inf
  const State<float> m32 = summarise<float>(masked, 0, masked.size());
  CHECK_FALSE(has_nan(m32));
  CHECK(same_bits(m32, State<float>::identity()));
  CHECK(m32.s.lse() == -INFINITY);
  CHECK(m32.s.prob(-INFINITY) == 0.f);
  for (int c = 0; c < kDv; ++c) CHECK(m32.out(c) == 0.f);
  const State<float> empty = summarise<float>(masked, 7, 7);
  CHECK(same_bits(empty, State<float>::identity()));

  for (uint64_t seed = 0; seed < 100; ++seed) {
    Rng r2(6100 + seed);
    const Row r = random_row(r2);
    const std::vector<int> cuts = random_cuts(r2, r.size(), 4);
    std::vector<State<float>> blocks;
    for (int b = 0; b < 4; ++b) blocks.push_back(summarise<float>(r, cuts[b], cuts[b + 1]));
    std::vector<int> order = {0, 1, 2, 3};
    const State<float> without = fold(blocks, order);
    // Empty and masked blocks anywhere in the fold: the result does not move by a bit.
    blocks.push_back(m32);
    blocks.push_back(empty);
    for (const std::vector<int>& o : {std::vector<int>{4, 0, 1, 2, 3, 5}, std::vector<int>{0, 4, 1, 5, 2, 3},
                                      std::vector<int>{0, 1, 2, 3, 5, 4}}) {
      const State<float> with = fold(blocks, o);
      CHECK_FALSE(has_nan(with));
      CHECK(same_bits(with, without));
    }
  }
}

TEST_CASE("the unsafe softmax overflows in fp32 above about 88, the safe and online ones stay finite") {
  CHECK(std::isfinite(std::exp(88.7f)));
  CHECK(std::isinf(std::exp(88.8f)));  // ln(FLT_MAX) = 88.72
  // One head, five rows of four scores: two below the threshold, three above it.
  Problem p;
  p.batch = p.heads = p.kv_heads = 1;
  p.nq = 5;
  p.nk = 4;
  p.d = p.dv = 32;
  p.scale = 1.0;
  p.dtype = DType::f32;
  SoftmaxInputs in;
  in.s = {0.5f, -1.f, 2.f, 1.f,  80.f, 79.f, 78.f, 70.f,  89.f, 0.f, 1.f, 2.f,  100.f, 99.f, 98.f, 97.f,
          200.f, 150.f, -3.f, 0.f};
  Rng rng(7000);
  for (int k = 0; k < p.nk * p.dv; ++k) in.v.push_back(float(rng.normal()));
  const SoftmaxOracle oracle(p, in, CheckPlan::full(p));

  const SoftmaxRun naive = softmax_model(p, in, Variant::naive, 96 * 1024);
  for (int row = 0; row < 5; ++row) {
    CAPTURE(row);
    bool finite = std::isfinite(naive.lse[row]);
    for (int j = 0; j < p.nk; ++j) finite = finite && std::isfinite(naive.p[row * p.nk + j]);
    CHECK(finite == (row < 2));  // rows 2-4 reach e^89 and beyond: inf, and inf / inf = NaN
  }
  for (Variant v : {Variant::safe3, Variant::online2, Variant::online_on_chip, Variant::fused}) {
    CAPTURE(variant_name(v));
    const SoftmaxRun run = softmax_model(p, in, v, 96 * 1024);
    for (float x : run.lse) CHECK(std::isfinite(x));
    const CheckResult c = v == Variant::fused ? oracle.judge_fused(run.o, run.lse) : oracle.judge_softmax(run.p, run.lse);
    CHECK_MESSAGE(c.pass(), c.failures());
  }
}

TEST_CASE("the exp2 form with log2(e) folded into the scale matches the exp form") {
  // The two forms of one softmax term: e^(x - m), and 2^(x' - m') with x' = x log2(e).
  // fp64 shows the identity; fp32 shows what folding costs: x' = fl(x fl(log2 e)) is rounded
  // by up to |x'| u, so with |x| <= X each exponent moves by up to about 6 X u (base 2,
  // counting the rounding of log2 e, of x', of m' and of x' - m'), the base-e exponent
  // x - m by up to 2 X u, and each exponential adds 2u: every term, and so l, differs by at
  // most (8 X + 4) u relatively, P = term / l by (16 X + 8) u, the LSE by (10 X + 4) u.
  // (Sums are taken in fp64 here, so that only the exponent form is compared.)
  double worst[3] = {0, 0, 0};
  const double extent[3] = {1, 10, 100};
  for (int e = 0; e < 3; ++e) {
    const double X = extent[e];
    for (uint64_t seed = 0; seed < 50; ++seed) {
      CAPTURE(X);
      CAPTURE(seed);
      Rng rng(8000 + seed);
      const Row r = random_row(rng, rng.range(1, 200), X / 2, 0.0, 0.0);
      std::vector<float> x;
      for (float s : r.x) x.push_back(std::max(-float(X), std::min(float(X), s)));  // |x| <= X

      // fp64, through the shared states: base 2 fed x log2(e) equals base e fed x.
      auto be = SoftmaxState<double, BaseE>::identity();
      auto b2 = SoftmaxState<double, Base2>::identity();
      for (float s : x) {
        be.push(double(s));
        b2.push(double(s) * kLog2e);
      }
      CHECK(b2.l == doctest::Approx(be.l).epsilon(1e-13));
      CHECK(b2.lse() == doctest::Approx(be.lse()).epsilon(1e-13));

      // fp32 terms, summed in fp64.
      const float c = float(kLog2e);
      float m = -INFINITY, m2 = -INFINITY;
      for (float s : x) m = std::max(m, s), m2 = std::max(m2, s * c);
      std::vector<float> te, t2;
      double le = 0, l2 = 0;
      for (float s : x) {
        te.push_back(BaseE::exp(s - m));       // e^(x - m)
        t2.push_back(Base2::exp(s * c - m2));  // 2^(x' - m'), one rounded multiply per score
        le += te.back();
        l2 += t2.back();
      }
      // Terms below FLT_MIN are subnormal: they keep an absolute error of one step, 2^-149.
      const double tiny = 2 * double(std::numeric_limits<float>::denorm_min()) / std::min(le, l2);
      for (std::size_t j = 0; j < x.size(); ++j) {
        const double pe = te[j] / le, p2 = t2[j] / l2;
        CHECK(std::abs(p2 - pe) <= (16 * X + 8) * kU * pe + tiny);
        if (te[j] >= std::numeric_limits<float>::min()) worst[e] = std::max(worst[e], std::abs(p2 - pe) / pe);
      }
      const double lse_e = double(m) + std::log(le), lse_2 = (double(m2) + std::log2(l2)) * kLn2;
      CHECK(std::abs(lse_2 - lse_e) <= (10 * X + 4) * kU * std::max(1.0, std::abs(lse_e)));
    }
  }
  // The rounding of the fold grows with |x|: why this chapter's kernels keep m in natural units.
  CHECK(worst[2] > 10 * worst[0]);
  MESSAGE("fp32 exp2 form vs exp form, worst relative difference in P: |x| <= 1: " << worst[0]
          << ", <= 10: " << worst[1] << ", <= 100: " << worst[2]);
}

TEST_CASE("exercise ch02.1: merge_by_hand agrees with common's merge") {
  using S = SoftmaxState<double>;
  const S id = S::identity();
  const S both_empty = merge_by_hand(id, id);
  CHECK(std::isinf(both_empty.m));
  CHECK(both_empty.l == 0.0);
  for (uint64_t seed = 0; seed < 200; ++seed) {
    CAPTURE(seed);
    Rng rng(9000 + seed);
    const Row r = random_row(rng);
    const int cut = rng.range(0, r.size());
    const S a = summarise<double>(r, 0, cut).s, b = summarise<double>(r, cut, r.size()).s;
    for (const auto& [x, y] : {std::pair<S, S>{a, b}, {b, a}, {a, id}, {id, b}, {a, a}}) {
      const S want = merge(x, y), got = merge_by_hand(x, y);
      CHECK_FALSE(std::isnan(got.l));
      CHECK(got.m == want.m);
      CHECK(std::abs(got.l - want.l) <= 1e-15 * want.l);
    }
    // and on a whole row: the merge of the two halves is the row's (m, l)
    const Exact e = exact(r, 0, r.size());
    const S whole = merge_by_hand(a, b);
    CHECK(whole.m == e.m);
    CHECK(std::abs(whole.l - e.l) <= 1e-12 * e.l);
  }
}
