// The fp64 reference against hand-computed cases, finite differences and itself.
#include <doctest/doctest.h>

#include <cmath>
#include <limits>

#include "common/reference.hpp"

using namespace attn;

namespace {

Problem tiny(int nq, int nk, int d) {
  Problem p;
  p.nq = nq;
  p.nk = nk;
  p.d = p.dv = d;
  p.dtype = DType::f32;
  return p;
}

double loss(const Problem& p, const AttnInputs& in, const ScoreMod* mod = nullptr) {
  // L = sum dO o O: its gradient is exactly the backward's dQ, dK, dV.
  const RefForward f = reference_forward(p, in, CheckPlan::full(p), mod);
  double l = 0;
  for (std::size_t k = 0; k < f.o.rows.size(); ++k)
    for (int c = 0; c < p.dv; ++c) l += f.o.values[k * p.dv + c] * in.dout[f.o.rows[k] * p.dv + c];
  return l;
}

/// Central differences of loss() against the reference backward, on every element.
void check_gradients(const Problem& p, AttnInputs in, const ScoreMod* mod = nullptr) {
  const RefBackward g = reference_backward(p, in, BackwardPlan::full(p), mod);
  const double h = 1.0 / 1024;  // exactly representable: q +- h stays exact in fp32 for |q| < 16
  auto fd = [&](std::vector<float>& x, std::size_t i) {
    const float keep = x[i];
    x[i] = keep + float(h);
    const double up = loss(p, in, mod);
    x[i] = keep - float(h);
    const double down = loss(p, in, mod);
    x[i] = keep;
    return (up - down) / (2 * h);
  };
  for (std::size_t i = 0; i < in.q.size(); ++i) CHECK(g.dq.values[i] == doctest::Approx(fd(in.q, i)).epsilon(1e-4));
  for (std::size_t i = 0; i < in.k.size(); ++i) CHECK(g.dk.values[i] == doctest::Approx(fd(in.k, i)).epsilon(1e-4));
  for (std::size_t i = 0; i < in.v.size(); ++i) CHECK(g.dv.values[i] == doctest::Approx(fd(in.v, i)).epsilon(1e-4));
}

/// A softcap score modifier, c * tanh(s / c), standing in for chapter 06's hooks.
struct Softcap : ScoreMod {
  double c;
  explicit Softcap(double cap) : c(cap) {}
  std::string name() const override { return "softcap"; }
  double apply(const Problem&, int, int, int, int, double s) const override { return c * std::tanh(s / c); }
  double grad(const Problem&, int, int, int, int, double s) const override {
    const double t = std::tanh(s / c);
    return 1 - t * t;
  }
};

/// Keys more than `w` positions behind the query are hidden.
struct Window : ScoreMod {
  int w;
  explicit Window(int width) : w(width) {}
  std::string name() const override { return "window"; }
  bool keep(const Problem&, int, int, int i, int j) const override { return j >= i - w; }
};

}  // namespace

TEST_CASE("one query, two keys, by hand") {
  Problem p = tiny(1, 2, 1);
  p.scale = 1.0;
  AttnInputs in{{1.f}, {0.f, 1.f}, {1.f, 3.f}, {}};
  const RefForward r = reference_forward(p, in, CheckPlan::full(p));
  const double e = std::exp(1.0);
  CHECK(r.o.values[0] == doctest::Approx((1 + 3 * e) / (1 + e)).epsilon(1e-15));
  CHECK(r.lse.values[0] == doctest::Approx(std::log(1 + e)).epsilon(1e-15));
}

TEST_CASE("the default scale is 1/sqrt(d)") {
  Problem p = tiny(1, 2, 4);
  AttnInputs in{{1, 1, 1, 1}, {0, 0, 0, 0, 1, 1, 1, 1}, {0, 0, 0, 0, 1, 1, 1, 1}, {}};
  const RefForward r = reference_forward(p, in, CheckPlan::full(p));
  const double w = std::exp(4.0 / 2.0);  // q.k = 4, tau = 1/2
  CHECK(r.o.values[0] == doctest::Approx(w / (1 + w)).epsilon(1e-15));
}

TEST_CASE("causal masking is aligned bottom-right, and empty rows are 0 with LSE -inf") {
  // Nq = 2, Nk = 3: row 0 sees keys 0..1, row 1 sees keys 0..2.
  Problem p = tiny(2, 3, 1);
  p.scale = 1.0;
  p.causal = true;
  AttnInputs in{{0, 0}, {0, 0, 0}, {1, 2, 6}, {}};
  RefForward r = reference_forward(p, in, CheckPlan::full(p));
  CHECK(r.o.values[0] == doctest::Approx(1.5));
  CHECK(r.o.values[1] == doctest::Approx(3.0));
  CHECK(r.lse.values[0] == doctest::Approx(std::log(2.0)));

  // Nq = 3, Nk = 1: rows 0 and 1 see no key at all.
  Problem q = tiny(3, 1, 1);
  q.scale = 1.0;
  q.causal = true;
  AttnInputs in2{{1, 1, 1}, {1}, {5}, {1, 1, 1}};
  r = reference_forward(q, in2, CheckPlan::full(q));
  CHECK(r.o.values[0] == 0.0);
  CHECK(r.o.values[1] == 0.0);
  CHECK(r.o.values[2] == doctest::Approx(5.0));
  CHECK(std::isinf(r.lse.values[0]));
  CHECK(r.lse.values[0] < 0);
  CHECK(q.visible_keys(0) == 0);
  CHECK(q.visible_keys(2) == 1);
  // The backward of empty rows is zero, not NaN.
  const RefBackward g = reference_backward(q, in2, BackwardPlan::full(q));
  CHECK(g.dq.values[0] == 0.0);
  CHECK(g.dq.values[1] == 0.0);
  CHECK_FALSE(std::isnan(g.dk.values[0]));
}

TEST_CASE("GQA: a query head reads the KV head of its group") {
  Problem p = tiny(5, 7, 4);
  p.heads = 4;
  p.kv_heads = 2;
  const AttnInputs in = make_inputs(p, Dist::normal, 3);
  // The same problem with K, V repeated per query head (plain multi-head attention).
  Problem m = p;
  m.kv_heads = 4;
  AttnInputs rep = in;
  rep.k.clear();
  rep.v.clear();
  for (int h = 0; h < 4; ++h) {
    const std::size_t off = p.k_off(0, p.kv_head_of(h));
    rep.k.insert(rep.k.end(), in.k.begin() + off, in.k.begin() + off + 7 * 4);
    rep.v.insert(rep.v.end(), in.v.begin() + off, in.v.begin() + off + 7 * 4);
  }
  const RefForward a = reference_forward(p, in, CheckPlan::full(p));
  const RefForward b = reference_forward(m, rep, CheckPlan::full(m));
  REQUIRE(a.o.values.size() == b.o.values.size());
  for (std::size_t i = 0; i < a.o.values.size(); ++i) CHECK(a.o.values[i] == doctest::Approx(b.o.values[i]));
}

TEST_CASE("backward equals finite differences of the forward") {
  Problem p = tiny(4, 6, 3);
  p.heads = 2;
  p.kv_heads = 1;  // GQA: dK, dV sum over the group
  AttnInputs in = make_inputs(p, Dist::normal, 11, true);
  check_gradients(p, in);
  p.causal = true;
  p.nq = 6;
  p.nk = 4;  // rows 0 and 1 are empty
  in = make_inputs(p, Dist::normal, 12, true);
  check_gradients(p, in);
}

TEST_CASE("the score-modifier hook: softcap and a window mask, forward and backward") {
  Problem p = tiny(5, 5, 3);
  AttnInputs in = make_inputs(p, Dist::normal, 5, true);
  const Softcap cap(0.7);
  check_gradients(p, in, &cap);
  // A window mask through keep() equals masking by hand.
  const Window w(1);
  const RefForward r = reference_forward(p, in, CheckPlan::full(p), &w);
  const double tau = p.softmax_scale();
  for (int i = 0; i < p.nq; ++i) {
    double l = 0, o0 = 0;
    for (int j = std::max(0, i - 1); j < p.nk; ++j) {
      double s = 0;
      for (int c = 0; c < 3; ++c) s += double(in.q[i * 3 + c]) * in.k[j * 3 + c];
      const double e = std::exp(tau * s);
      l += e;
      o0 += e * in.v[j * 3];
    }
    CHECK(r.o.values[i * 3] == doctest::Approx(o0 / l).epsilon(1e-12));
  }
  check_gradients(p, in, &w);
}

TEST_CASE("sampled plans compute exactly the rows the full plan does") {
  Problem p = tiny(300, 200, 16);
  p.batch = 2;
  p.heads = 3;
  const AttnInputs in = make_inputs(p, Dist::mean_shifted, 9);
  const CheckPlan s = CheckPlan::sampled(p, 1e6);
  CHECK_FALSE(s.covers_everything(p));
  CHECK(s.rows.front() == 0);
  CHECK(s.rows.back() == p.nq - 1);
  const RefForward part = reference_forward(p, in, s);
  const RefForward all = reference_forward(p, in, CheckPlan::full(p));
  for (std::size_t k = 0; k < part.o.rows.size(); ++k) {
    const std::size_t row = part.o.rows[k];
    for (int c = 0; c < p.dv; ++c) CHECK(part.o.values[k * p.dv + c] == all.o.values[row * p.dv + c]);
  }
  CHECK(CheckPlan::sampled(tiny(8, 8, 4)).covers_everything(tiny(8, 8, 4)));
}

TEST_CASE("the same-precision naive computation: tiny error in fp32, larger in bf16") {
  Problem p = tiny(64, 80, 32);
  p.causal = true;
  for (DType t : {DType::f32, DType::bf16}) {
    p.dtype = t;
    const AttnInputs in = make_inputs(p, Dist::normal, 2, true);
    const CheckPlan plan = CheckPlan::full(p);
    const RefForward r = reference_forward(p, in, plan);
    const NaiveForward n = naive_forward_same_precision(p, in, plan);
    double err = 0;
    for (std::size_t i = 0; i < r.o.values.size(); ++i) err = std::max(err, std::abs(r.o.values[i] - n.o.values[i]));
    if (t == DType::f32) CHECK(err < 1e-5);
    else {
      CHECK(err > 1e-4);  // P and O rounded to bf16 show up
      CHECK(err < 5e-2);
    }
    const RefBackward rb = reference_backward(p, in, BackwardPlan::full(p));
    const NaiveBackward nb = naive_backward_same_precision(p, in, BackwardPlan::full(p));
    double berr = 0;
    for (std::size_t i = 0; i < rb.dq.values.size(); ++i)
      berr = std::max(berr, std::abs(rb.dq.values[i] - nb.dq.values[i]));
    CHECK(berr < (t == DType::f32 ? 1e-5 : 5e-2));
  }
}
