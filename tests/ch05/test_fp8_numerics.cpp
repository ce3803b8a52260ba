// Chapter 05's FP8 numerics on the CPU: E4M3 rounding, the Hadamard rotation, the
// scales, and what incoherent processing buys on inputs with outliers.
#include <doctest/doctest.h>

#include <cmath>
#include <vector>

#include "chapters/05_fa3_hopper/fp8_model.hpp"
#include "support/shapes.hpp"

using namespace attn;
using namespace attn::ch05;

namespace {

using testing_support::shape;

}  // namespace

TEST_CASE("E4M3: every finite code round-trips, and rounding is to nearest even with saturation") {
  for (int b = 0; b < 256; ++b) {
    if ((b & 0x7f) == 0x7f) {
      CHECK(std::isnan(e4m3_value(uint8_t(b))));
      continue;
    }
    CHECK(e4m3_bits(e4m3_value(uint8_t(b))) == uint8_t(b));
  }
  CHECK(e4m3_value(0x7e) == 448.f);
  CHECK(round_e4m3(1000.f) == 448.f);
  CHECK(round_e4m3(-1e30f) == -448.f);
  CHECK(round_e4m3(INFINITY) == 448.f);
  CHECK(round_e4m3(1.0625f) == 1.f);      // halfway between 1 and 1.125: even mantissa wins
  CHECK(round_e4m3(1.1875f) == 1.25f);    // halfway between 1.125 and 1.25: 1.25 is even
  CHECK(round_e4m3(std::ldexp(1.f, -9)) == std::ldexp(1.f, -9));  // the smallest subnormal
  CHECK(round_e4m3(std::ldexp(1.f, -10)) == 0.f);                   // half of it ties to 0
  CHECK(round_e4m3(3.f * std::ldexp(1.f, -11)) == std::ldexp(1.f, -9));
  CHECK(e4m3_bits(NAN) == 0x7f);
}

TEST_CASE("exercise ch05.2: the Hadamard rotation is orthogonal and keeps q . k") {
  for (int d : {64, 128, 256}) {
    CAPTURE(d);
    std::vector<float> q(d), k(d);
    for (int i = 0; i < d; ++i) {
      q[i] = std::sin(0.7f * i) + (i == 5 ? 20.f : 0.f);
      k[i] = std::cos(0.3f * i);
    }
    double dot = 0, nq = 0;
    for (int i = 0; i < d; ++i) {
      dot += double(q[i]) * k[i];
      nq += double(q[i]) * q[i];
    }
    std::vector<float> hq = q, hk = k;
    hadamard_inplace(hq.data(), d);
    hadamard_inplace(hk.data(), d);
    double hdot = 0, hn = 0, amax = 0;
    for (int i = 0; i < d; ++i) {
      hdot += double(hq[i]) * hk[i];
      hn += double(hq[i]) * hq[i];
      amax = std::max(amax, std::fabs(double(hq[i])));
    }
    CHECK(hdot == doctest::Approx(dot).epsilon(1e-4));
    CHECK(hn == doctest::Approx(nq).epsilon(1e-4));
    CHECK(amax < 0.5 * 20);  // the outlier is spread over all coordinates
    // H is its own inverse: rotating twice gives q back.
    hadamard_inplace(hq.data(), d);
    for (int i = 0; i < d; ++i) CHECK(std::fabs(hq[i] - q[i]) < 1e-4f * 20.f);
  }
}

TEST_CASE("quantize_fp8: scales put each block's largest entry at 448") {
  const Problem p = shape().heads(2, 1).n(130, 100).d(64);
  const AttnInputs in = make_inputs(p, Dist::normal, 3);
  const Fp8Inputs f = quantize_fp8(p, in, {Fp8Scaling::per_block, false});
  REQUIRE(f.q_blocks == 3);
  REQUIRE(f.k_blocks == 2);
  for (int h = 0; h < 2; ++h)
    for (int blk = 0; blk < 3; ++blk) {
      float amax = 0, qmax = 0;
      for (int r = 64 * blk; r < std::min(130, 64 * blk + 64); ++r)
        for (int c = 0; c < 64; ++c) {
          amax = std::max(amax, std::fabs(in.q[p.q_off(0, h) + r * 64 + c]));
          qmax = std::max(qmax, std::fabs(f.q8[p.q_off(0, h) + r * 64 + c]));
        }
      CHECK(f.q_scale[h * 3 + blk] == amax / 448.f);
      CHECK(qmax == 448.f);
    }
  // Dequantised values are within E4M3's relative step (2^-4) of the input.
  for (std::size_t i = 0; i < in.v.size(); ++i) {
    const float back = f.v8[i] * f.v_scale[i % 64];
    CHECK(std::fabs(back - in.v[i]) <= 0.0625f * std::fabs(in.v[i]) + 448.f * f.v_scale[i % 64] * std::ldexp(1.f, -9));
  }
}

TEST_CASE("the plain FP8 computation passes its own oracle at awkward shapes") {
  for (const Problem p : {shape().heads(2, 1).n(100, 160).d(64).causal(),
                          shape().batch(2).n(70).d(128),
                          shape().n(200, 90).d(256).causal().dtype(DType::f16)}) {
   CAPTURE(p.describe());
   const AttnInputs in = make_inputs(p, Dist::normal, 4);
   const Fp8Oracle oracle(p, in, CheckPlan::full(p));
   const NaiveForward n = naive_fp8_forward(p, oracle.inputs(), oracle.plan());
   // Spread the compact rows into full tensors (poisoned elsewhere) and judge them.
   std::vector<float> o(p.o_elems(), 0.f), lse(p.lse_elems(), 0.f);
   for (std::size_t k = 0; k < n.o.rows.size(); ++k) {
     for (int c = 0; c < p.dv; ++c) o[n.o.rows[k] * p.dv + c] = n.o.row(k)[c];
     lse[n.lse.rows[k]] = n.lse.values[k];
   }
   const CheckResult c = oracle.judge(o, &lse);
   CHECK_MESSAGE(c.pass(), c.failures());
   CHECK(oracle.naive_o().rel_l2 > 1e-3);  // FP8 is visibly coarser than bf16...
   CHECK(oracle.naive_o().rel_l2 < 0.1);   // ...but still attention
 }
}

TEST_CASE("FP8 accuracy: per-block scales and the Hadamard rotation help on channel outliers") {
  const Problem p = shape().heads(2).n(256).d(128);
  const CheckPlan plan = CheckPlan::full(p);
  const std::vector<Fp8AccuracyRow> t = fp8_accuracy_table(p, channel_outlier_inputs(p, 21), plan);
  REQUIRE(t.size() == 4);
  const double bf16 = t[0].rel_l2, per_tensor = t[1].rel_l2, per_block = t[2].rel_l2, hadamard = t[3].rel_l2;
  MESSAGE("rel L2: bf16 " << bf16 << ", fp8 per-tensor " << per_tensor << ", per-block " << per_block
                          << ", per-block + Hadamard " << hadamard);
  CHECK(bf16 < hadamard);
  CHECK(hadamard < per_tensor);
  CHECK(hadamard < per_block);
}
