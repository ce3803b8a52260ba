// The shared (m, l) state: the basics every chapter relies on. Chapter 02's tests
// prove the merge's algebra at length.
#include <doctest/doctest.h>

#include <cmath>
#include <vector>

#include "common/online_softmax.hpp"

using namespace attn;

TEST_CASE("pushing scores one by one gives max and sum of exp") {
  const std::vector<double> x = {0.5, -1.0, 3.0, 2.0};
  auto s = SoftmaxState<double>::identity();
  for (double v : x) s.push(v);
  CHECK(s.m == 3.0);
  double l = 0;
  for (double v : x) l += std::exp(v - 3.0);
  CHECK(s.l == doctest::Approx(l).epsilon(1e-15));
  CHECK(s.lse() == doctest::Approx(3.0 + std::log(l)).epsilon(1e-15));
}

TEST_CASE("identity and empty rows never produce NaN") {
  const auto id = SoftmaxState<float>::identity();
  CHECK(std::isinf(id.m));
  CHECK(id.m < 0);
  CHECK(id.l == 0.f);
  auto s = id;
  s.push(-INFINITY);  // a masked score
  s.push(-INFINITY);
  CHECK(s.l == 0.f);
  CHECK_FALSE(std::isnan(s.l));
  CHECK(std::isinf(s.lse()));
  CHECK(s.prob(-INFINITY) == 0.f);
  const auto merged = merge(s, id);
  CHECK_FALSE(std::isnan(merged.l));
  CHECK(merged.l == 0.f);
  // Merging the identity into a real state changes nothing.
  auto r = SoftmaxState<float>::identity();
  r.push(1.f);
  r.push(2.f);
  const auto r2 = merge(r, id);
  CHECK(r2.m == r.m);
  CHECK(r2.l == r.l);
}

TEST_CASE("(m, l, O) state: push then out() equals the softmax-weighted sum") {
  const float x[3] = {1.f, 2.f, -0.5f};
  const float v[3][2] = {{1.f, 0.f}, {0.f, 1.f}, {2.f, 2.f}};
  auto st = AttnState<2>::identity();
  for (int j = 0; j < 3; ++j) st.push(x[j], v[j]);
  double l = 0, o0 = 0, o1 = 0;
  for (int j = 0; j < 3; ++j) {
    const double w = std::exp(double(x[j]));
    l += w;
    o0 += w * v[j][0];
    o1 += w * v[j][1];
  }
  CHECK(st.out(0) == doctest::Approx(o0 / l).epsilon(1e-6));
  CHECK(st.out(1) == doctest::Approx(o1 / l).epsilon(1e-6));
  auto empty = AttnState<2>::identity();
  CHECK(empty.out(0) == 0.f);
}

TEST_CASE("base 2 with log2(e) folded into the scores equals base e") {
  auto e = SoftmaxState<double, BaseE>::identity();
  auto two = SoftmaxState<double, Base2>::identity();
  for (double x : {0.3, -2.0, 5.5, 1.25}) {
    e.push(x);
    two.push(x * kLog2e);
  }
  CHECK(two.l == doctest::Approx(e.l).epsilon(1e-14));
  CHECK(two.lse() == doctest::Approx(e.lse()).epsilon(1e-14));
}
