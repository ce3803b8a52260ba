// Chapter 01's CPU model: correct at awkward shapes, and its traffic counted right.
#include <doctest/doctest.h>

#include <cmath>

#include "chapters/01_naive/naive_model.hpp"
#include "common/check.hpp"
#include "common/errors.hpp"
#include "support/shapes.hpp"

using namespace attn;
using namespace attn::ch01;

namespace {

constexpr std::size_t kSram = 96 * 1024;

using testing_support::shape;

void check_forward(const Problem& p, Dist dist = Dist::normal) {
  CAPTURE(p.describe());
  const AttnInputs in = make_inputs(p, dist, 42);
  const ForwardOracle oracle(p, in, CheckPlan::full(p));
  const NaiveForwardResult r = naive_forward_model(p, in, kSram);
  const CheckResult c = oracle.judge(r.o, &r.lse);
  CHECK_MESSAGE(c.pass(), c.failures());
}

}  // namespace

TEST_CASE("forward matches the fp64 reference at awkward shapes") {
  check_forward(shape().n(1).d(16));                                  // N = 1
  check_forward(shape().n(1).d(16).causal());
  check_forward(shape().heads(2).n(100).d(64));                       // N not a multiple of any tile
  check_forward(shape().heads(2).n(100).d(64).causal());
  check_forward(shape().n(37, 129).d(32).causal());                   // Nq < Nk, causal bottom-right
  check_forward(shape().n(129, 37).d(32).causal());                   // Nq > Nk: the first rows are empty
  check_forward(shape().batch(2).heads(3).n(65, 70).d(16));           // several batches and heads
  check_forward(shape().batch(2).heads(4, 2).n(50).d(128).causal());  // GQA
  check_forward(shape().heads(4, 1).n(33, 48).d(64));                 // MQA
  check_forward(shape().n(80).d(64), Dist::mean_shifted);
  check_forward(shape().n(80).d(64).causal(), Dist::outliers);
  check_forward(shape().heads(2, 1).n(70, 90).d(32).causal().dtype(DType::f32));
  check_forward(shape().heads(2).n(70, 90).d(32).dtype(DType::f16));
}

TEST_CASE("every head dim the chapter supports") {
  for (int d : {16, 32, 64, 128}) check_forward(shape().n(67).d(d).causal(d % 32 == 0));
}

TEST_CASE("integer inputs: the model matches the reference to fp32 rounding") {
  Problem p = shape().n(20, 24).d(16).dtype(DType::f32);
  p.scale = 0.25;  // exact products: scores are exact multiples of 1/4
  const AttnInputs in = make_inputs(p, Dist::integers, 8);
  const RefForward ref = reference_forward(p, in, CheckPlan::full(p));
  const NaiveForwardResult r = naive_forward_model(p, in, kSram);
  for (std::size_t i = 0; i < ref.o.values.size(); ++i) CHECK(r.o[i] == doctest::Approx(ref.o.values[i]).epsilon(1e-5));
}

TEST_CASE("exercise ch01.1: the softmax kernel's normalise pass") {
  // An awkward causal shape with empty rows exercises every branch of pass 3.
  check_forward(shape().heads(2).n(70, 40).d(32).causal());
  check_forward(shape().n(300).d(16), Dist::mean_shifted);
}

TEST_CASE("exercise ch01.2: the traffic formula equals the model's counted bytes") {
  for (const Problem p : {shape().n(64).d(64),
                          shape().batch(2).heads(2, 1).n(100, 130).d(32).causal(),
                          shape().heads(3).n(1, 200).d(16).dtype(DType::f32)}) {
   CAPTURE(p.describe());
   const AttnInputs in = make_inputs(p, Dist::normal, 1);
   const NaiveForwardResult r = naive_forward_model(p, in, kSram);
   const NaiveTrafficFormula f = naive_forward_traffic(p);
   CHECK(r.traffic.bytes_read == f.read());
   CHECK(r.traffic.bytes_written == f.write());
   CHECK(r.traffic.extra_peak == f.extra());
   CHECK(f.qk_write == f.s_bytes);
   CHECK(f.softmax_read == 3 * f.s_bytes);
 }
}

TEST_CASE("traffic grows as N^2 at fixed d, and S and P are O(N^2) extra memory") {
  const Problem a = shape().n(512).d(64), b = shape().n(1024).d(64);
  const NaiveTrafficFormula fa = naive_forward_traffic(a), fb = naive_forward_traffic(b);
  const double ratio = (fb.read() + fb.write()) / (fa.read() + fa.write());
  CHECK(ratio > 3.8);
  CHECK(ratio < 4.2);
  CHECK(fb.extra() == 4 * fa.extra());
  // Far above the ideal: each input read once, each output written once.
  CHECK(fb.read() + fb.write() > 20 * b.ideal_fwd_bytes());
}

TEST_CASE("tiles that do not fit the on-chip budget are an error, not a silent overflow") {
  const Problem p = shape().n(64).d(64);
  const AttnInputs in = make_inputs(p, Dist::normal, 1);
  CHECK_THROWS_AS(naive_forward_model(p, in, 8 * 1024), SramOverflow);
  const NaiveForwardResult r = naive_forward_model(p, in, 32 * 1024);
  CHECK(r.sram_peak <= 32 * 1024);
}

TEST_CASE("exercise ch01.3: the materialising backward matches the fp64 reference") {
  for (const Problem p : {shape().n(40).d(16).dtype(DType::f32),
                          shape().heads(2, 1).n(33, 47).d(32).causal(),
                          shape().batch(2).heads(2).n(65).d(64).causal().dtype(DType::f16),
                          shape().n(50, 20).d(16).causal()}) {
   CAPTURE(p.describe());
   const AttnInputs in = make_inputs(p, Dist::normal, 3, /*with_dout=*/true);
   const BackwardOracle oracle(p, in, BackwardPlan::full(p));
   const NaiveBackwardResult r = naive_backward_model(p, in, kSram);
   const CheckResult c = oracle.judge(r.dq, r.dk, r.dv);
   CHECK_MESSAGE(c.pass(), c.failures());
 }
}

TEST_CASE("the backward's traffic is dominated by its four N^2 matrices") {
  const Problem p = shape().n(256).d(64).dtype(DType::bf16);
  const AttnInputs in = make_inputs(p, Dist::normal, 3, true);
  const NaiveBackwardResult r = naive_backward_model(p, in, kSram);
  const double nn4 = 4.0 * 256 * 256;
  CHECK(r.traffic.extra_peak >= 3 * nn4);  // P, dP, dS
  CHECK(r.traffic.bytes() > 6 * nn4);
  // Four matmuls (dV, dP, dQ, dK): S is not recomputed because P was stored. The
  // FlashAttention convention of 2.5x the forward counts a fifth, the recompute of S.
  CHECK(r.traffic.flops >= 2.0 * flops_forward(p));
  CHECK(r.traffic.flops < 2.1 * flops_forward(p));
}
