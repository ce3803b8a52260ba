// Chapter 03's kernels against the fp64 reference (skipped without a device).
#include <doctest/doctest.h>

#include <cmath>

#include "chapters/03_fa1/fa1_blocks.hpp"
#include "chapters/03_fa1/fa1_gpu.hpp"
#include "chapters/03_fa1/fa1_model.hpp"
#include "common/check.hpp"
#include "common/errors.hpp"
#include "support/json_check.hpp"
#include "support/run_binary.hpp"
#include "support/shapes.hpp"

using namespace attn;
using namespace attn::ch03;

namespace {

using testing_support::shape;

void check_forward(const Problem& p, Dist dist = Dist::normal) {
  CAPTURE(p.describe());
  CAPTURE(dist_name(dist));
  const AttnInputs in = make_inputs(p, dist, 17);
  const ForwardOracle oracle(p, in, CheckPlan::full(p));
  const GpuForward g = fa1_forward_gpu(p, in, false);
  const CheckResult c = oracle.judge(g.o, &g.lse);
  CHECK_MESSAGE(c.pass(), c.failures());
}

void check_backward(const Problem& p, Dist dist = Dist::normal) {
  CAPTURE(p.describe());
  CAPTURE(dist_name(dist));
  const AttnInputs in = make_inputs(p, dist, 7, /*with_dout=*/true);
  const BackwardOracle oracle(p, in, BackwardPlan::full(p));
  const GpuBackward g = fa1_backward_gpu(p, in, false);
  const CheckResult c = oracle.judge(g.dq, g.dk, g.dv);
  CHECK_MESSAGE(c.pass(), c.failures());
}

}  // namespace

TEST_CASE("forward kernel matches the reference at awkward shapes") {
  for (DType t : {DType::f16, DType::bf16}) {
    check_forward(shape().n(1).d(64).dtype(t));                                      // N = 1: below one block
    check_forward(shape().n(1).d(32).causal().dtype(t));
    check_forward(shape().heads(2).n(100).d(64).causal().dtype(t));                  // N not a multiple of B_r or B_c
    check_forward(shape().batch(2).heads(4, 2).n(130, 67).d(32).causal().dtype(t));  // Nq > Nk: empty rows; GQA
    check_forward(shape().heads(2, 1).n(67, 300).d(128).causal().dtype(t));          // Nq < Nk; MQA
    check_forward(shape().n(300, 37).d(64).causal().dtype(t));                       // whole Q blocks with no visible key
    check_forward(shape().batch(2).heads(3).n(257).d(64).dtype(t));                  // several batches and heads
  }
  check_forward(shape().heads(2).n(700).d(128).dtype(DType::bf16), Dist::mean_shifted);  // 11 K/V blocks
  check_forward(shape().heads(2).n(600, 650).d(64).causal().dtype(DType::bf16), Dist::outliers);
  check_forward(shape().n(1000).d(32).causal().dtype(DType::f16), Dist::mean_shifted);   // B_c = 256
}

TEST_CASE("forward kernel: every head dim, causal and not") {
  for (int d : {32, 64, 128})
    for (bool causal : {false, true})
      check_forward(shape().heads(2).n(333).d(d).causal(causal).dtype(DType::bf16));
}

TEST_CASE("backward kernel matches the fp64 reference backward at awkward shapes") {
  for (DType t : {DType::f16, DType::bf16}) {
    check_backward(shape().n(1).d(64).dtype(t));
    check_backward(shape().n(1).d(32).causal().dtype(t));
    check_backward(shape().heads(2).n(100).d(64).causal().dtype(t));
    check_backward(shape().batch(2).heads(4, 2).n(130, 67).d(32).causal().dtype(t));  // empty rows; GQA adds the group on chip
    check_backward(shape().heads(2, 1).n(67, 300).d(128).causal().dtype(t));          // Nq < Nk; MQA
    check_backward(shape().n(300, 37).d(64).causal().dtype(t));                       // whole Q blocks with dQ = 0
    check_backward(shape().batch(2).heads(3).n(257).d(64).dtype(t));
  }
  check_backward(shape().heads(2).n(300).d(128).dtype(DType::bf16), Dist::mean_shifted);  // 10 K/V blocks
  check_backward(shape().heads(2, 1).n(250, 260).d(32).causal().dtype(DType::f16), Dist::mean_shifted);
}

TEST_CASE("backward kernel: every head dim, causal and not") {
  for (int d : {32, 64, 128})
    for (bool causal : {false, true})
      check_backward(shape().heads(2).n(200).d(d).causal(causal).dtype(DType::bf16));
}

TEST_CASE("sanitizer set: small awkward shapes, every head dim, both kernels") {
  // Small enough for compute-sanitizer's racecheck, which follows every shared-memory
  // access: partial blocks on both sides, empty rows, GQA, causal and not.
  for (int d : {32, 64, 128}) {
    check_forward(shape().heads(4, 2).n(70, 50).d(d).causal().dtype(DType::bf16));
    check_forward(shape().n(40, 90).d(d).dtype(DType::f16));
    check_backward(shape().heads(4, 2).n(70, 50).d(d).causal().dtype(DType::bf16));
    check_backward(shape().n(40, 90).d(d).dtype(DType::f16));
  }
}

TEST_CASE("the kernels refuse what they were not built for") {
  const Problem f32 = shape().n(16).d(64).dtype(DType::f32);
  const AttnInputs in = make_inputs(f32, Dist::normal, 1, true);
  CHECK_THROWS_AS(fa1_forward_gpu(f32, in, false), UsageError);
  const Problem dv = shape().n(16).d(64).dv(32).dtype(DType::bf16);
  CHECK(!kernel_unsupported(dv).empty());
}

TEST_CASE("ch03_fa1 on the GPU: every row passes, and chapter 01's kernels are timed next to FA1") {
  const auto r = testing_support::run_binary(CH03_BINARY, "--device cuda --n 300 --nk 250 --causal --heads 4 --kv-heads 2 --json");
  CHECK(r.exit_code == 0);
  CHECK(testing_support::is_valid_json(r.out));
  CHECK(r.out.find("\"pass\": false") == std::string::npos);
  CHECK(r.out.find("FA1 forward kernel") != std::string::npos);
  CHECK(r.out.find("FA1 backward kernel") != std::string::npos);
  CHECK(r.out.find("speed-up over chapter 01") != std::string::npos);
}
