// Chapter 02's kernels against the fp64 reference (skipped without a device).
#include <doctest/doctest.h>

#include <cmath>
#include <vector>

#include "chapters/02_online_softmax/scores.hpp"
#include "chapters/02_online_softmax/softmax_gpu.hpp"
#include "chapters/02_online_softmax/softmax_model.hpp"
#include "common/inputs.hpp"
#include "support/shapes.hpp"

using namespace attn;
using namespace attn::ch02;

namespace {

/// Rows of fp32 scores with tau = 1: a test shape (support/shapes.hpp) in chapter 02's dtype and scale.
testing_support::Shape rows() { return testing_support::shape().dtype(DType::f32).scale(1.0); }

CheckResult judge(const SoftmaxOracle& oracle, Kernel k, const GpuResult& g) {
  return k == Kernel::fused ? oracle.judge_fused(g.o, g.lse) : oracle.judge_softmax(g.p, g.lse);
}

/// Every kernel in `which` against the reference on every row of `p` with inputs `in`.
void check_kernels(const Problem& p, const SoftmaxInputs& in, const std::vector<Kernel>& which) {
  CAPTURE(p.describe());
  const SoftmaxOracle oracle(p, in, CheckPlan::full(p));
  GpuSoftmax gpu(p, in);
  for (Kernel k : which) {
    CAPTURE(kernel_name(k));
    const GpuResult g = gpu.run(k, false);
    const CheckResult c = judge(oracle, k, g);
    CHECK_MESSAGE(c.pass(), c.failures());
  }
}

void check_kernels(const Problem& p, Dist dist = Dist::normal, std::vector<Kernel> which = all_kernels(),
                   double shift = kDefaultShift) {
  CAPTURE(dist_name(dist));
  check_kernels(p, make_softmax_inputs(p, dist, 17, shift), which);
}

}  // namespace

TEST_CASE("every kernel matches the fp64 reference at awkward shapes") {
  check_kernels(rows().n(1).d(32));                                      // one score
  check_kernels(rows().n(3).d(64).causal());
  check_kernels(rows().heads(2).n(100).d(64).causal());                  // causal, square
  check_kernels(rows().batch(2).heads(4, 2).n(130, 67).d(32).causal());  // Nq > Nk: empty rows; GQA for V
  check_kernels(rows().heads(2, 1).n(67, 300).d(128).causal());          // Nq < Nk, bottom-right; MQA
  check_kernels(rows().n(3, 4099).d(64));                                // one wave (4096) and 3
  check_kernels(rows().heads(2).n(4, 9000).d(64).causal());              // several waves, causal
  check_kernels(rows().batch(2).heads(3).n(5, 100).d(64));               // several batches and heads
  check_kernels(rows().n(17, 65).d(128));                                // Nq not a multiple of Br, Nk one past a tile
}

TEST_CASE("rows at every 16-byte alignment: Nk = 4093 to 4100") {
  // With Nk % 4 != 0, consecutive rows start 4, 8 or 12 bytes past a boundary: the head,
  // body and tail of every split are exercised, and P must line up with S.
  for (int nk = 4093; nk <= 4100; ++nk) check_kernels(rows().n(9, nk).d(32).causal(nk % 2 == 1));
  for (int nk : {2, 5, 6, 7, 9, 13}) check_kernels(rows().n(7, nk).d(32));
}

TEST_CASE("v3 keeps rows of up to 32768 scores in registers and hands longer ones to v2") {
  for (int nk : {31, 1024, 4096, 8191, kRowInRegisters - 3, kRowInRegisters, kRowInRegisters + 1}) {
    CAPTURE(nk);
    const Problem p = rows().n(3, nk).d(32);
    const SoftmaxInputs in = make_softmax_inputs(p, Dist::normal, 3);
    const SoftmaxOracle oracle(p, in, CheckPlan::full(p));
    GpuSoftmax gpu(p, in);
    const GpuResult g = gpu.run(Kernel::online_registers, false);
    CHECK(g.streamed == (nk > kRowInRegisters));
    const CheckResult c = oracle.judge_softmax(g.p, g.lse);
    CHECK_MESSAGE(c.pass(), c.failures());
  }
}

TEST_CASE("empty rows: P = 0, O = 0 and LSE = -inf, never NaN") {
  // Causal with Nq > Nk, bottom-right aligned: rows 0-29 of each head see no key.
  const Problem p = rows().heads(2).n(50, 20).d(64).causal();
  const SoftmaxInputs in = make_softmax_inputs(p, Dist::normal, 5);
  GpuSoftmax gpu(p, in);
  for (Kernel k : all_kernels()) {
    CAPTURE(kernel_name(k));
    const GpuResult g = gpu.run(k, false);
    for (int h = 0; h < 2; ++h)
      for (int i = 0; i < 30; ++i) {
        const std::size_t row = std::size_t(h) * p.nq + i;
        CHECK(g.lse[row] == -INFINITY);
        const std::vector<float>& out = k == Kernel::fused ? g.o : g.p;
        const int width = k == Kernel::fused ? p.dv : p.nk;
        for (int c = 0; c < width; ++c) CHECK(out[row * width + c] == 0.f);
      }
  }
  check_kernels(p, in, all_kernels());
}

TEST_CASE("mean-shifted scores, outliers, integers and a tau other than 1") {
  check_kernels(rows().heads(2).n(40, 1000).d(64).causal(), Dist::mean_shifted);
  check_kernels(rows().n(9, 5000).d(32), Dist::mean_shifted, all_kernels(), 500.0);
  check_kernels(rows().n(50, 5000).d(64), Dist::outliers);
  check_kernels(rows().heads(2).n(20, 33).d(32).causal(), Dist::integers);
  Problem p = rows().heads(2).n(30, 700).d(128).causal();
  p.scale = 0.3;
  check_kernels(p);
}

TEST_CASE("the kernels agree with the CPU models of their variants") {
  const Problem p = rows().heads(2, 1).n(33, 3000).d(64).causal();
  const SoftmaxInputs in = make_softmax_inputs(p, Dist::normal, 11);
  GpuSoftmax gpu(p, in);
  for (Kernel k : all_kernels()) {
    CAPTURE(kernel_name(k));
    const GpuResult g = gpu.run(k, false);
    const SoftmaxRun m = softmax_model(p, in, kernel_variant(k), 96 * 1024);
    const std::vector<float>& a = k == Kernel::fused ? g.o : g.p;
    const std::vector<float>& b = k == Kernel::fused ? m.o : m.p;
    REQUIRE(a.size() == b.size());
    double worst = 0;
    for (std::size_t e = 0; e < a.size(); ++e) worst = std::max(worst, double(std::abs(a[e] - b[e])));
    CHECK(worst < 1e-6);
    for (std::size_t r = 0; r < g.lse.size(); ++r)
      if (std::isfinite(m.lse[r])) CHECK(std::abs(g.lse[r] - m.lse[r]) < 1e-5);
  }
}

TEST_CASE("timed runs return a positive median and leave the results checked") {
  const Problem p = rows().heads(4).n(64, 4096).d(64);
  const SoftmaxInputs in = make_softmax_inputs(p, Dist::normal, 2);
  const SoftmaxOracle oracle(p, in, CheckPlan::full(p));
  GpuSoftmax gpu(p, in);
  for (Kernel k : all_kernels()) {
    CAPTURE(kernel_name(k));
    const GpuResult g = gpu.run(k, true);
    CHECK(g.time_ms > 0);
    CHECK(judge(oracle, k, g).pass());
  }
}

TEST_CASE("exercise ch02.4: the warp-shuffle merge of (m, l) in the online kernel") {
  // Rows whose maxima sit in different lanes and warps: the first row peaks in lane 5 of
  // warp 0, the second in the last lane of the last warp, the third has one real key and
  // every other weight underflows to 0.
  Problem p = rows().n(3, 4096).d(32);
  SoftmaxInputs in = make_softmax_inputs(p, Dist::normal, 4);
  in.s[5 * 4] = 30.f;                                   // float4 5 is thread 5's: lane 5, warp 0
  in.s[4096 + 4 * 255 + 3] = 25.f;                      // float4 255 is thread 255's: lane 31, warp 7
  for (int j = 1; j < 4096; ++j) in.s[8192 + j] = -1e30f;
  check_kernels(p, in, {Kernel::online});
  for (const Problem q : {rows().heads(2).n(10, 4096).d(32), rows().n(20, 9000).d(32).causal()})
    check_kernels(q, Dist::outliers, {Kernel::online});
}
