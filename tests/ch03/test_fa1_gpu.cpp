// Chapter 03's kernels against the fp64 reference (skipped without a device).
#include <doctest/doctest.h>

#include <cmath>

#include "common/check.hpp"
#include "common/errors.hpp"
#include "fa1_blocks.hpp"
#include "fa1_gpu.hpp"
#include "fa1_model.hpp"
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
    check_forward(shape(1, 1, 1, 1, 1, 64, false, t));         // N = 1: below one block
    check_forward(shape(1, 1, 1, 1, 1, 32, true, t));
    check_forward(shape(1, 2, 2, 100, 100, 64, true, t));      // N not a multiple of B_r or B_c
    check_forward(shape(2, 4, 2, 130, 67, 32, true, t));       // Nq > Nk: empty rows; GQA
    check_forward(shape(1, 2, 1, 67, 300, 128, true, t));      // Nq < Nk; MQA
    check_forward(shape(1, 1, 1, 300, 37, 64, true, t));       // whole Q blocks with no visible key
    check_forward(shape(2, 3, 3, 257, 257, 64, false, t));     // several batches and heads
  }
  check_forward(shape(1, 2, 2, 700, 700, 128, false, DType::bf16), Dist::mean_shifted);  // 11 K/V blocks
  check_forward(shape(1, 2, 2, 600, 650, 64, true, DType::bf16), Dist::outliers);
  check_forward(shape(1, 1, 1, 1000, 1000, 32, true, DType::f16), Dist::mean_shifted);   // B_c = 256
}

TEST_CASE("forward kernel: every head dim, causal and not") {
  for (int d : {32, 64, 128})
    for (bool causal : {false, true}) check_forward(shape(1, 2, 2, 333, 333, d, causal, DType::bf16));
}

TEST_CASE("backward kernel matches the fp64 reference backward at awkward shapes") {
  for (DType t : {DType::f16, DType::bf16}) {
    check_backward(shape(1, 1, 1, 1, 1, 64, false, t));
    check_backward(shape(1, 1, 1, 1, 1, 32, true, t));
    check_backward(shape(1, 2, 2, 100, 100, 64, true, t));
    check_backward(shape(2, 4, 2, 130, 67, 32, true, t));     // empty rows; GQA adds the group on chip
    check_backward(shape(1, 2, 1, 67, 300, 128, true, t));    // Nq < Nk; MQA
    check_backward(shape(1, 1, 1, 300, 37, 64, true, t));     // whole Q blocks with dQ = 0
    check_backward(shape(2, 3, 3, 257, 257, 64, false, t));
  }
  check_backward(shape(1, 2, 2, 300, 300, 128, false, DType::bf16), Dist::mean_shifted);  // 10 K/V blocks
  check_backward(shape(1, 2, 1, 250, 260, 32, true, DType::f16), Dist::mean_shifted);
}

TEST_CASE("backward kernel: every head dim, causal and not") {
  for (int d : {32, 64, 128})
    for (bool causal : {false, true}) check_backward(shape(1, 2, 2, 200, 200, d, causal, DType::bf16));
}

TEST_CASE("sanitizer set: small awkward shapes, every head dim, both kernels") {
  // Small enough for compute-sanitizer's racecheck, which follows every shared-memory
  // access: partial blocks on both sides, empty rows, GQA, causal and not.
  for (int d : {32, 64, 128}) {
    check_forward(shape(1, 4, 2, 70, 50, d, true, DType::bf16));
    check_forward(shape(1, 1, 1, 40, 90, d, false, DType::f16));
    check_backward(shape(1, 4, 2, 70, 50, d, true, DType::bf16));
    check_backward(shape(1, 1, 1, 40, 90, d, false, DType::f16));
  }
}

TEST_CASE("the kernels refuse what they were not built for") {
  const Problem f32 = shape(1, 1, 1, 16, 16, 64, false, DType::f32);
  const AttnInputs in = make_inputs(f32, Dist::normal, 1, true);
  CHECK_THROWS_AS(fa1_forward_gpu(f32, in, false), UsageError);
  Problem dv = shape(1, 1, 1, 16, 16, 64, false, DType::bf16);
  dv.dv = 32;
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
