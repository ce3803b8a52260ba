// Chapter 04's CPU model of FlashAttention-2: correct at awkward shapes, and its
// traffic shows the loop swap (Q once, no statistics in HBM) and causal skipping.
#include <doctest/doctest.h>

#include "chapters/04_fa2/fa2_model.hpp"
#include "common/check.hpp"
#include "common/errors.hpp"
#include "support/shapes.hpp"

using namespace attn;
using namespace attn::ch04;

namespace {

constexpr std::size_t kSram = 224 * 1024;

using testing_support::shape;

void check_forward(const Problem& p, Dist dist = Dist::normal) {
  CAPTURE(p.describe());
  const AttnInputs in = make_inputs(p, dist, 7);
  const ForwardOracle oracle(p, in, CheckPlan::full(p));
  const Fa2ForwardResult r = fa2_forward_model(p, in, kSram);
  const CheckResult c = oracle.judge(r.o, &r.lse);
  CHECK_MESSAGE(c.pass(), c.failures());
}

void check_backward(const Problem& p, Dist dist = Dist::normal) {
  CAPTURE(p.describe());
  const AttnInputs in = make_inputs(p, dist, 8, true);
  const BackwardOracle oracle(p, in, BackwardPlan::full(p));
  const Fa2BackwardResult r = fa2_backward_model(p, in, kSram);
  const CheckResult c = oracle.judge(r.dq, r.dk, r.dv);
  CHECK_MESSAGE(c.pass(), c.failures());
}

}  // namespace

TEST_CASE("forward model matches the fp64 reference at awkward shapes") {
  check_forward(shape().n(1).d(64));
  check_forward(shape().n(1).d(64).causal());
  check_forward(shape().heads(2).n(200).d(64).causal());      // N not a multiple of Br or Bc
  check_forward(shape().n(100, 300).d(64).causal());          // Nq < Nk, bottom-right
  check_forward(shape().n(300, 100).d(64).causal());          // Nq > Nk: empty rows
  check_forward(shape().batch(2).heads(4, 2).n(130).d(128));  // GQA, batches
  check_forward(shape().heads(2).n(140).d(64).causal().dtype(DType::f16), Dist::mean_shifted);
  check_forward(shape().n(129).d(128), Dist::outliers);
}

TEST_CASE("exercise ch04.1: the running output is rescaled when the maximum grows") {
  // Mean-shifted rows grow their maximum block after block; without the rescale O_i is wrong.
  check_forward(shape().n(150, 400).d(64), Dist::mean_shifted);
}

TEST_CASE("the loop swap: Q read once, K and V once per query block, no statistics in HBM") {
  const Problem p = shape().heads(2).n(512).d(64);
  const AttnInputs in = make_inputs(p, Dist::normal, 1);
  const Fa2ForwardResult r = fa2_forward_model(p, in, kSram);
  const double e = dtype_bytes(p.dtype);
  CHECK(r.q_read == e * double(p.q_elems()));                   // exactly once
  CHECK(r.kv_read == 4 * e * double(p.k_elems() + p.v_elems()));  // Nq / Br = 4 query blocks
  CHECK(r.o_written == e * double(p.o_elems()));
  CHECK(r.lse_written == 4.0 * double(p.lse_elems()));
  CHECK(r.traffic.extra_peak == 0);                             // m, l never leave the chip
  CHECK(r.traffic.bytes() == fa2_forward_bytes(p));
}

TEST_CASE("exercise ch04.2: causal blocks past the diagonal are never loaded") {
  for (const Problem p : {shape().n(1024).d(64).causal(),
                          shape().heads(2, 1).n(300, 700).d(64).causal(),
                          shape().n(700, 300).d(64).causal()}) {
   CAPTURE(p.describe());
   const AttnInputs in = make_inputs(p, Dist::normal, 1);
   const Fa2ForwardResult r = fa2_forward_model(p, in, kSram);
   Problem unmasked = p;  // the same shape without the mask: every query block reads every K/V block
   unmasked.causal = false;
   CHECK(r.traffic.bytes() == fa2_forward_bytes(p));
   CHECK(r.traffic.bytes() < fa2_forward_bytes(unmasked));
 }
  // Square causal: the K/V traffic is about half (whole 64-key tiles round it up a little).
  const Problem p = shape().n(1024).d(64).causal();
  const Problem q = shape().n(1024).d(64);
  const double ratio = fa2_forward_bytes(p) / fa2_forward_bytes(q);
  CHECK(ratio > 0.5);
  CHECK(ratio < 0.62);
}

TEST_CASE("the tiles must fit the on-chip budget") {
  const Problem p = shape().n(64).d(128);
  const AttnInputs in = make_inputs(p, Dist::normal, 1);
  CHECK_THROWS_AS(fa2_forward_model(p, in, 96 * 1024), SramOverflow);
  CHECK(fa2_onchip_bytes(p) <= kSram);
  CHECK_NOTHROW(fa2_forward_model(p, in, fa2_onchip_bytes(p)));
}

TEST_CASE("the default on-chip budget holds the tiles at every head dim the chapter accepts") {
  for (const int d : {64, 128, 256}) {
    CAPTURE(d);
    const Problem p = shape().n(130).d(d).causal();
    const AttnInputs in = make_inputs(p, Dist::normal, 1, true);
    CHECK(fa2_onchip_bytes(p) <= kSmOnChipBytes);
    const ForwardOracle oracle(p, in, CheckPlan::full(p));
    const Fa2ForwardResult r = fa2_forward_model(p, in, kSmOnChipBytes);
    CHECK(r.sram_peak <= kSmOnChipBytes);
    const CheckResult c = oracle.judge(r.o, &r.lse);
    CHECK_MESSAGE(c.pass(), c.failures());
  }
}

TEST_CASE("backward model matches the fp64 reference at awkward shapes") {
  check_backward(shape().n(1).d(64).dtype(DType::f16));
  check_backward(shape().heads(2).n(100).d(64));
  check_backward(shape().n(70, 150).d(64).causal());
  check_backward(shape().n(150, 70).d(64).causal());                  // empty rows
  check_backward(shape().batch(2).heads(4, 2).n(65).d(64).causal());  // GQA: dK, dV summed over the group
}

TEST_CASE("exercise ch04.4: dQ accumulates across K/V blocks") {
  check_backward(shape().n(64, 200).d(64));                    // four K/V blocks add into each dQ_i
}

TEST_CASE("backward model: FLOPs are 2.5x the forward and dQ's atomics are counted") {
  const Problem p = shape().n(128).d(64);
  const AttnInputs in = make_inputs(p, Dist::normal, 1, true);
  const Fa2BackwardResult r = fa2_backward_model(p, in, kSram);
  CHECK(r.traffic.flops == doctest::Approx(flops_backward(p)));
  // Two K/V blocks each read and write all of dQ's fp32 accumulator, plus zeroing and conversion.
  CHECK(r.dq_accum_bytes == doctest::Approx(4.0 * double(p.q_elems()) * (2 * 2 + 2)));
}
