// The learnable sink in the fp64 reference (ScoreMod::sink) and in the online-softmax
// state (SoftmaxState::with_sink): one more term in the denominator, none in the output.
#include <doctest/doctest.h>

#include <cmath>

#include "common/online_softmax.hpp"
#include "common/reference.hpp"
#include "support/shapes.hpp"

using namespace attn;
using testing_support::shape;

namespace {

struct SinkOnly : ScoreMod {
  double logit;
  explicit SinkOnly(double x) : logit(x) {}
  std::string name() const override { return "sink"; }
  double sink(const Problem&, int, int) const override { return logit; }
};

/// O and LSE of one row written out: P_j = e^{s_j} / (e^{sink} + sum_k e^{s_k}).
void by_hand(const Problem& p, const AttnInputs& in, int i, double sink, std::vector<double>& o, double& lse) {
  const double tau = p.softmax_scale();
  std::vector<double> s(p.nk);
  double den = std::exp(sink);
  for (int j = 0; j < p.nk; ++j) {
    double acc = 0;
    for (int c = 0; c < p.d; ++c) acc += double(in.q[std::size_t(i) * p.d + c]) * in.k[std::size_t(j) * p.d + c];
    s[j] = tau * acc;
    den += std::exp(s[j]);
  }
  o.assign(p.dv, 0.0);
  for (int j = 0; j < p.nk; ++j)
    for (int c = 0; c < p.dv; ++c) o[c] += std::exp(s[j]) / den * in.v[std::size_t(j) * p.dv + c];
  lse = std::log(den);
}

}  // namespace

TEST_CASE("reference with a sink logit: the sink enters the denominator and the LSE, not the output") {
  const Problem p = shape().n(5, 7).d(4);
  const AttnInputs in = make_inputs(p, Dist::integers, 3);
  const SinkOnly mod(1.25);
  const RefForward r = reference_forward(p, in, CheckPlan::full(p), &mod);
  const RefForward plain = reference_forward(p, in, CheckPlan::full(p));
  for (int i = 0; i < p.nq; ++i) {
    std::vector<double> o;
    double lse;
    by_hand(p, in, i, 1.25, o, lse);
    CHECK(r.lse.values[i] == doctest::Approx(lse).epsilon(1e-12));
    CHECK(r.lse.values[i] > plain.lse.values[i]);
    for (int c = 0; c < p.dv; ++c) CHECK(r.o.row(i)[c] == doctest::Approx(o[c]).epsilon(1e-12));
  }
  const NaiveForward n = naive_forward_same_precision(p, in, CheckPlan::full(p), &mod);
  for (int i = 0; i < p.nq; ++i) CHECK(n.lse.values[i] == doctest::Approx(r.lse.values[i]).epsilon(1e-5));
}

TEST_CASE("SoftmaxState::with_sink: pushing scores onto the sink's state gives the sink-augmented softmax") {
  const double xs[] = {0.5, -1.0, 2.0};
  SoftmaxState<double> st = SoftmaxState<double>::with_sink(0.75);
  for (double x : xs) st.push(x);
  const double den = std::exp(0.75) + std::exp(0.5) + std::exp(-1.0) + std::exp(2.0);
  CHECK(st.lse() == doctest::Approx(std::log(den)).epsilon(1e-14));
  CHECK(st.prob(2.0) == doctest::Approx(std::exp(2.0) / den).epsilon(1e-14));
  // An empty row with a sink: no key, so P = 0 everywhere, and LSE is the sink itself.
  const SoftmaxState<double> empty = SoftmaxState<double>::with_sink(0.75);
  CHECK(empty.lse() == doctest::Approx(0.75));
  // Merging is unchanged: the sink's state is one more part of the row.
  SoftmaxState<double, Base2> a = SoftmaxState<double, Base2>::with_sink(1.0), b = SoftmaxState<double, Base2>::identity();
  b.push(3.0);
  const SoftmaxState<double, Base2> m = merge(a, b);
  CHECK(m.lse() == doctest::Approx(std::log(std::exp2(1.0) + std::exp2(3.0))).epsilon(1e-14));
}

TEST_CASE("reference backward with a sink matches finite differences of the forward") {
  const Problem p = shape().n(6, 9).d(4);
  const AttnInputs in = make_inputs(p, Dist::normal, 5, true);
  const SinkOnly mod(0.5);
  const RefBackward g = reference_backward(p, in, BackwardPlan::full(p), &mod);
  auto loss = [&](const AttnInputs& x) {
    const RefForward f = reference_forward(p, x, CheckPlan::full(p), &mod);
    double l = 0;
    for (std::size_t k = 0; k < f.o.values.size(); ++k) l += f.o.values[k] * x.dout[k];
    return l;
  };
  const double eps = 1e-6;
  for (int e : {0, 7, 13, 23}) {
    AttnInputs a = in, b = in;
    a.q[e] += float(eps), b.q[e] -= float(eps);
    const double fd = (loss(a) - loss(b)) / (double(a.q[e]) - double(b.q[e]));
    CHECK(g.dq.values[e] == doctest::Approx(fd).epsilon(1e-4));
  }
}
