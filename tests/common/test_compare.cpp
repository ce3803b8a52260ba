// The acceptance rule of DEVELOPERS.md.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
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

namespace {

/// Scatters compactly stored rows (the order `ref` lists them) back to a full tensor of n elements.
std::vector<float> scatter(const std::vector<float>& compact, const CheckedRows<double>& ref, std::size_t n) {
  std::vector<float> full(n, 0.f);
  for (std::size_t k = 0; k < ref.rows.size(); ++k)
    for (int c = 0; c < ref.width; ++c) full[ref.rows[k] * ref.width + c] = compact[k * ref.width + c];
  return full;
}

/// The fp64 reference rounded once to the dtype: the best any kernel can store.
std::vector<float> rounded(const CheckedRows<double>& ref, DType t, std::size_t n) {
  std::vector<float> v(ref.values.size());
  for (std::size_t i = 0; i < v.size(); ++i) v[i] = round_to(t, float(ref.values[i]));
  return scatter(v, ref, n);
}

/// Keys [lo, hi) dropped: a split-K decode that forgot one split.
struct DropKeys : ScoreMod {
  int lo, hi;
  DropKeys(int l, int h) : lo(l), hi(h) {}
  std::string name() const override { return "drop"; }
  bool keep(const Problem&, int, int, int, int j) const override { return j < lo || j >= hi; }
};

}  // namespace

TEST_CASE("the floor scales with each row's own magnitude, not max(1, .)") {
  // Two rows: one of magnitude 1, one of magnitude 0.005 (a long decode row). The yardstick
  // is exact; the floor is u * s_r.
  CheckedRows<double> ref;
  ref.width = 2;
  ref.rows = {0, 1};
  ref.values = {1.0, -0.5, 0.005, -0.004};
  std::vector<float> exact(ref.values.begin(), ref.values.end());
  const ErrorStats naive = compare_rows(exact.data(), ref);
  const double u = dtype_unit_roundoff(DType::bf16);  // 2^-8
  std::vector<float> out = exact;
  out[2] = float(0.005 + 0.5 * u * 0.005);  // half the small row's floor: passes
  Verdict v = accept(compare_rows(out.data(), ref), naive, DType::bf16);
  CHECK(v.pass);
  CHECK(v.row_tolerance.size() == 2);
  CHECK(v.row_tolerance[0] == doctest::Approx(u * 1.0));
  CHECK(v.row_tolerance[1] == doctest::Approx(u * 0.005));
  CHECK(v.margin == doctest::Approx(0.5).epsilon(1e-3));
  out[2] = float(0.005 + 0.01 * 0.005 + 3 * u * 0.005);  // 3 floors off in the small row: the old
  v = accept(compare_rows(out.data(), ref), naive, DType::bf16);  // rule allowed 2^-8 * max(1, 1)
  CHECK_FALSE(v.pass);
  CHECK(v.reason.find("checked row 1") != std::string::npos);
  CHECK(describe_mismatches(out.data(), ref, v).find("row 1 col 0") != std::string::npos);
  // The LSE is measured in log space: its floor is u * max(1, |LSE|).
  CheckedRows<double> lse;
  lse.width = 1;
  lse.rows = {0};
  lse.values = {0.01};
  std::vector<float> l = {0.01f};
  const ErrorStats ln = compare_rows(l.data(), lse);
  l[0] = 0.01f + 3e-6f;
  CHECK(accept(compare_rows(l.data(), lse), ln, DType::f32, 0, Magnitude::log).pass);
  CHECK_FALSE(accept(compare_rows(l.data(), lse), ln, DType::f32, 0, Magnitude::row).pass);
}

TEST_CASE("the relative-L2 bound fails an error spread thinly over every element") {
  // 64 rows of magnitude 1; the yardstick's error is one element of 1e-3; the kernel moves
  // every element by 0.9e-3: each row is within 2 x 1e-3 + floor, the L2 norm is not.
  CheckedRows<double> ref;
  ref.width = 4;
  for (int r = 0; r < 64; ++r) {
    ref.rows.push_back(r);
    for (int c = 0; c < 4; ++c) ref.values.push_back(c == 0 ? 1.0 : 0.25);
  }
  std::vector<float> naive_out(ref.values.begin(), ref.values.end()), out = naive_out;
  naive_out[0] += 1e-3f;
  for (float& x : out) x += 0.9e-3f;
  const ErrorStats naive = compare_rows(naive_out.data(), ref);
  const Verdict v = accept(compare_rows(out.data(), ref), naive, DType::f32);
  CHECK(v.margin < 1.0);
  CHECK_FALSE(v.pass);
  CHECK(v.reason.find("L2 error") != std::string::npos);
}

TEST_CASE("a yardstick that overflowed fails the check instead of allowing anything") {
  CheckedRows<double> ref;
  ref.width = 2;
  ref.rows = {0};
  ref.values = {1.0, 2.0};
  std::vector<float> out = {1.f, 2.f};
  std::vector<float> overflowed = {std::numeric_limits<float>::infinity(), 2.f};
  const ErrorStats naive = compare_rows(overflowed.data(), ref);
  CHECK(naive.nan == 1);
  const Verdict v = accept(compare_rows(out.data(), ref), naive, DType::bf16);
  CHECK_FALSE(v.pass);
  CHECK(v.reason.find("yardstick overflowed") != std::string::npos);
  overflowed[0] = std::numeric_limits<float>::quiet_NaN();
  CHECK_FALSE(accept(compare_rows(out.data(), ref), compare_rows(overflowed.data(), ref), DType::bf16).pass);
  // Hand-made stats: an infinite yardstick error fails too.
  ErrorStats inf_naive;
  inf_naive.max_abs = std::numeric_limits<double>::infinity();
  CHECK_FALSE(accept(ErrorStats{}, inf_naive, DType::bf16).pass);
}

TEST_CASE("decode at Nk = 64K: one dropped split of 32 fails, the correct output passes with margin") {
  // The case where the floor max(1, .) * 2^-8 was about 0.7x a typical |O|: one query row
  // per head, 64K keys, normal inputs, bf16. A split-K decode that drops 1 of its 32 key
  // splits (2048 keys) must fail; the naive computation and the fp64 result rounded to bf16
  // (the best a kernel can store) must pass.
  Problem p;
  p.batch = 2;
  p.heads = 4;
  p.kv_heads = 4;
  p.nq = 1;
  p.nk = 65536;
  p.d = p.dv = 128;
  p.dtype = DType::bf16;
  const AttnInputs in = make_inputs(p, Dist::normal, 3);
  const ForwardOracle oracle(p, in, CheckPlan::full(p));
  const CheckedRows<double>& ref = oracle.reference().o;
  const std::vector<float> naive = scatter(oracle.naive().o.values, ref, p.o_elems());
  const CheckResult own = oracle.judge(naive);
  CHECK(own.pass());
  const std::vector<float> best = rounded(ref, p.dtype, p.o_elems());
  const CheckResult b = oracle.judge(best);
  REQUIRE(b.pass());
  const TensorCheck& t = b.tensors[0];
  // The margin: the tolerance is within 10x of the error of a correct result.
  CHECK(t.verdict.tolerance <= 10.0 * t.err.max_abs);
  const int split = p.nk / 32;
  for (int s : {0, 17, 31}) {
    const DropKeys drop(s * split, (s + 1) * split);
    const RefForward faulty = reference_forward(p, in, CheckPlan::full(p), &drop);
    const CheckResult f = oracle.judge(rounded(faulty.o, p.dtype, p.o_elems()));
    CHECK_FALSE(f.pass());
    CHECK(f.tensors[0].err.max_abs > 3.0 * f.tensors[0].verdict.tolerance);
    if (s == 17)
      std::printf("decode Nk = 64K: mean |O| %.3g; tolerance %.3g; errors: naive %.3g, rounded fp64 %.3g, "
                  "dropped split %.3g\n",
                  [&] {
                    double a = 0;
                    for (double x : ref.values) a += std::abs(x);
                    return a / double(ref.values.size());
                  }(),
                  t.verdict.tolerance, own.tensors[0].err.max_abs, t.err.max_abs, f.tensors[0].err.max_abs);
  }
}
