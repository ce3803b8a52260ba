// Chapter 01's kernels against the fp64 reference (skipped without a device).
#include <doctest/doctest.h>

#include <cmath>

#include "chapters/01_naive/naive_gpu.hpp"
#include "common/check.hpp"
#include "support/shapes.hpp"

using namespace attn;
using namespace attn::ch01;

namespace {

using testing_support::shape;

void check_both(const Problem& p, Dist dist = Dist::normal) {
  const AttnInputs in = make_inputs(p, dist, 17);
  const ForwardOracle oracle(p, in, CheckPlan::full(p));
  for (Pipeline which : {Pipeline::handwritten, Pipeline::cublas}) {
    CAPTURE(p.describe());
    CAPTURE(pipeline_name(which));
    const GpuForward g = naive_forward_gpu(p, in, which, false);
    const CheckResult c = oracle.judge(g.o, &g.lse);
    CHECK_MESSAGE(c.pass(), c.failures());
  }
}

}  // namespace

TEST_CASE("both pipelines match the reference at awkward shapes") {
  for (DType t : {DType::f32, DType::f16, DType::bf16}) {
    check_both(shape().n(1).d(16).dtype(t));
    check_both(shape().heads(2).n(100).d(64).causal().dtype(t));
    check_both(shape().batch(2).heads(4, 2).n(130, 67).d(32).causal().dtype(t));  // Nq > Nk: empty rows
    check_both(shape().heads(2, 1).n(67, 300).d(128).causal().dtype(t));          // Nq < Nk
  }
  check_both(shape().batch(2).heads(3).n(257).d(64).dtype(DType::bf16), Dist::mean_shifted);
  check_both(shape().heads(2).n(512).d(128).causal().dtype(DType::bf16), Dist::outliers);
  check_both(shape().n(200).d(16).dtype(DType::f32), Dist::integers);
}

TEST_CASE("exercise ch01.4: the softmax kernel's warp-shuffle max") {
  Problem p = shape().n(3, 300).d(16).causal().dtype(DType::f32);
  p.nq = 3;
  // Row 2 has its maximum in the last lane of the last warp; row 0's in lane 5.
  std::vector<float> s(3 * 300);
  for (int j = 0; j < 300; ++j) {
    s[j] = float(j % 7) * 0.1f;
    s[300 + j] = -float(j);
    s[600 + j] = float(j) * 0.01f;
  }
  s[5] = 40.f;
  std::vector<float> prob, lse;
  softmax_rows_gpu(p, s, &prob, &lse);
  for (int r = 0; r < 3; ++r) {
    const int last = r + (300 - 3);  // bottom-right causal: row r sees keys 0..r+297
    double m = -INFINITY, l = 0;
    for (int j = 0; j <= last; ++j) m = std::max(m, double(s[r * 300 + j]));
    for (int j = 0; j <= last; ++j) l += std::exp(double(s[r * 300 + j]) - m);
    CHECK(lse[r] == doctest::Approx(m + std::log(l)).epsilon(1e-5));
    for (int j = 0; j < 300; ++j) {
      const double want = j <= last ? std::exp(double(s[r * 300 + j]) - m) / l : 0.0;
      CHECK(prob[r * 300 + j] == doctest::Approx(want).epsilon(1e-4).scale(1e-6));
    }
  }
}
