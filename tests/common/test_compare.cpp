// The acceptance rule of DEVELOPERS.md.
#include <doctest/doctest.h>

#include <cmath>
#include <limits>

#include "common/check.hpp"
#include "common/compare.hpp"

using namespace attn;

TEST_CASE("errors: max abs, relative L2, NaN and -inf handling") {
  CheckedRows<double> ref;
  ref.width = 2;
  ref.rows = {0, 2};
  ref.values = {1.0, 2.0, -1.0, 0.5};
  std::vector<float> out = {1.f, 2.5f, 99.f, 99.f, -1.f, 0.5f};  // row 1 is not checked
  ErrorStats e = compare_rows(out.data(), ref);
  CHECK(e.max_abs == doctest::Approx(0.5));
  CHECK(e.worst == 1);
  CHECK(e.rel_l2 == doctest::Approx(0.5 / std::sqrt(1 + 4 + 1 + 0.25)));
  CHECK(e.nan == 0);
  out[0] = std::numeric_limits<float>::quiet_NaN();
  e = compare_rows(out.data(), ref);
  CHECK(e.nan == 1);
  CHECK(std::isinf(e.max_abs));

  CheckedRows<double> lse;
  lse.width = 1;
  lse.rows = {0, 1};
  lse.values = {-std::numeric_limits<double>::infinity(), 2.0};
  std::vector<float> l = {-std::numeric_limits<float>::infinity(), 2.f};
  CHECK(compare_rows(l.data(), lse).max_abs == 0);
  l[0] = 0.f;  // an empty row's LSE must be -inf
  CHECK(compare_rows(l.data(), lse).nan == 1);
}

TEST_CASE("the rule: within 2x the naive error plus the floor passes, beyond fails") {
  ErrorStats naive;
  naive.max_abs = 1e-3;
  naive.ref_max_abs = 1.0;
  ErrorStats k;
  k.max_abs = 2e-3;
  CHECK(accept(k, naive, DType::f32).pass);
  k.max_abs = 2e-3 + 3e-6;  // the fp32 floor is 64 * 2^-24 ~ 3.8e-6
  CHECK(accept(k, naive, DType::f32).pass);
  k.max_abs = 2e-3 + 5e-6;
  CHECK_FALSE(accept(k, naive, DType::f32).pass);
  CHECK(accept(k, naive, DType::bf16).pass);  // bf16's floor is 2^-8
  // The floor scales with the magnitude of the reference.
  naive.ref_max_abs = 100.0;
  k.max_abs = 2e-3 + 3e-4;
  CHECK(accept(k, naive, DType::f32).pass);
  k.max_abs = 2e-3 + 5e-4;
  CHECK_FALSE(accept(k, naive, DType::f32).pass);
}

TEST_CASE("NaN never passes, and unwritten (poisoned) elements fail") {
  ErrorStats naive;
  naive.max_abs = 1.0;
  ErrorStats k;
  k.max_abs = std::numeric_limits<double>::quiet_NaN();
  CHECK_FALSE(accept(k, naive, DType::bf16).pass);
  k.max_abs = 0;
  k.nan = 1;
  CHECK_FALSE(accept(k, naive, DType::bf16).pass);
  k.nan = 0;
  CHECK(accept(k, naive, DType::bf16, 0).pass);
  CHECK_FALSE(accept(k, naive, DType::bf16, 3).pass);

  std::vector<float> out(10, 0.f);
  poison(out);
  CHECK(count_unwritten(out.data(), out.size()) == 10);
  out.assign(10, 1.f);
  out[4] = -std::numeric_limits<float>::infinity();
  CHECK(count_unwritten(out.data(), out.size()) == 1);
  CHECK(count_unwritten(out.data(), out.size(), /*allow_neg_inf=*/true) == 0);
}

TEST_CASE("the oracle passes the reference itself and fails a perturbed or partial output") {
  Problem p;
  p.nq = 37;
  p.nk = 53;
  p.d = p.dv = 16;
  p.heads = 2;
  p.causal = true;
  p.dtype = DType::bf16;
  const AttnInputs in = make_inputs(p, Dist::mean_shifted, 4);
  const ForwardOracle oracle(p, in, CheckPlan::full(p));
  // The naive same-precision result, scattered back to full tensors, passes.
  std::vector<float> o(p.o_elems()), lse(p.lse_elems());
  const NaiveForward& n = oracle.naive();
  for (std::size_t k = 0; k < n.o.rows.size(); ++k) {
    for (int c = 0; c < p.dv; ++c) o[n.o.rows[k] * p.dv + c] = n.o.values[k * p.dv + c];
    lse[n.lse.rows[k]] = n.lse.values[k];
  }
  CHECK(oracle.judge(o, &lse).pass());
  // A small systematic error fails.
  std::vector<float> bad = o;
  for (float& x : bad) x *= 1.05f;
  CHECK_FALSE(oracle.judge(bad, &lse).pass());
  // One unwritten element fails, even outside the checked rows' values.
  bad = o;
  bad[p.o_elems() - 1] = std::numeric_limits<float>::quiet_NaN();
  const CheckResult r = oracle.judge(bad, &lse);
  CHECK_FALSE(r.pass());
  CHECK(r.failures().find("O:") != std::string::npos);
  // A wrong size fails instead of reading out of bounds.
  bad.resize(5);
  CHECK_FALSE(oracle.judge(bad).pass());
}
