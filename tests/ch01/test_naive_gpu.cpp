// Chapter 01's kernels against the fp64 reference (skipped without a device).
#include <doctest/doctest.h>

#include <cmath>

#include "common/check.hpp"
#include "naive_gpu.hpp"
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
    check_both(shape(1, 1, 1, 1, 1, 16, false, t));
    check_both(shape(1, 2, 2, 100, 100, 64, true, t));
    check_both(shape(2, 4, 2, 130, 67, 32, true, t));   // Nq > Nk: empty rows
    check_both(shape(1, 2, 1, 67, 300, 128, true, t));  // Nq < Nk
  }
  check_both(shape(2, 3, 3, 257, 257, 64, false, DType::bf16), Dist::mean_shifted);
  check_both(shape(1, 2, 2, 512, 512, 128, true, DType::bf16), Dist::outliers);
  check_both(shape(1, 1, 1, 200, 200, 16, false, DType::f32), Dist::integers);
}

TEST_CASE("exercise ch01.4: the softmax kernel's warp-shuffle max") {
  Problem p = shape(1, 1, 1, 3, 300, 16, true, DType::f32);
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
