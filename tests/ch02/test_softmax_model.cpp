// Chapter 02's CPU models: every algorithm against the fp64 reference at awkward shapes,
// and the traffic each one counts (the kernels' own count, softmax_traffic()).
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "chapters/02_online_softmax/scores.hpp"
#include "chapters/02_online_softmax/softmax_model.hpp"
#include "common/errors.hpp"
#include "support/shapes.hpp"

using namespace attn;
using namespace attn::ch02;

namespace {

constexpr std::size_t kSram = 96 * 1024;

/// Rows of fp32 scores with tau = 1: a test shape (support/shapes.hpp) in chapter 02's dtype and scale.
testing_support::Shape rows() { return testing_support::shape().dtype(DType::f32).scale(1.0); }

CheckResult judge(const SoftmaxOracle& oracle, Variant v, const SoftmaxRun& r) {
  return v == Variant::fused ? oracle.judge_fused(r.o, r.lse) : oracle.judge_softmax(r.p, r.lse);
}

/// Every variant in `which` against the reference on every row of `p`.
void check_variants(const Problem& p, Dist dist, const std::vector<Variant>& which, double shift = kDefaultShift) {
  CAPTURE(p.describe());
  CAPTURE(dist_name(dist));
  const SoftmaxInputs in = make_softmax_inputs(p, dist, 42, shift);
  const SoftmaxOracle oracle(p, in, CheckPlan::full(p));
  for (Variant v : which) {
    CAPTURE(variant_name(v));
    const SoftmaxRun r = softmax_model(p, in, v, kSram);
    const CheckResult c = judge(oracle, v, r);
    CHECK_MESSAGE(c.pass(), c.failures());
  }
}

/// The awkward shapes every chapter tests.
std::vector<Problem> awkward_shapes() {
  return {
      rows().n(1).d(32),                                      // one score
      rows().n(1).d(32).causal(),
      rows().heads(2).n(100).d(64).causal(),                  // causal, square
      rows().batch(2).heads(4, 2).n(130, 67).d(32).causal(),  // Nq > Nk: the first 63 rows of each head are empty; GQA
      rows().heads(2, 1).n(67, 300).d(128).causal(),          // Nq < Nk, bottom-right; MQA
      rows().n(3, 4099).d(64),                                // just over one wave of 4096, not a multiple of 4
      rows().n(2, 8195).d(32).causal(),                       // two waves and a bit
      rows().batch(2).heads(3).n(5, 100).d(64),               // several batches and heads, below one wave
      rows().n(17, 65).d(64),                                 // Nq not a multiple of Br, Nk one past a tile of Bc
  };
}

}  // namespace

TEST_CASE("every variant matches the fp64 reference at awkward shapes") {
  for (const Problem& p : awkward_shapes()) check_variants(p, Dist::normal, all_variants());
}

TEST_CASE("outliers and integer scores") {
  check_variants(rows().n(50, 5000).d(64), Dist::outliers, all_variants());
  check_variants(rows().heads(2).n(20, 33).d(32).causal(), Dist::integers, all_variants());
}

TEST_CASE("mean-shifted scores (+100): the safe and online variants cannot tell, the naive one overflows") {
  const std::vector<Variant> safe = {Variant::safe3, Variant::online2, Variant::online_on_chip, Variant::fused};
  check_variants(rows().heads(2).n(40, 1000).d(64).causal(), Dist::mean_shifted, safe);
  check_variants(rows().n(9, 37).d(32), Dist::mean_shifted, safe, 500.0);
  const Problem p = rows().n(4, 100).d(32);
  const SoftmaxInputs in = make_softmax_inputs(p, Dist::mean_shifted, 1);
  const SoftmaxOracle oracle(p, in, CheckPlan::full(p));
  CHECK(oracle.max_lse() > kLogFltMax);
  const SoftmaxRun naive = softmax_model(p, in, Variant::naive, kSram);
  CHECK_FALSE(judge(oracle, Variant::naive, naive).pass());
}

TEST_CASE("a tau other than 1 scales every score") {
  Problem p = rows().heads(2).n(30, 500).d(64).causal();
  p.scale = 0.3;
  check_variants(p, Dist::normal, all_variants());
}

TEST_CASE("exercise ch02.2: the fused 1-pass (m, l, O) matches P V of the whole row") {
  for (const Problem p : {rows().n(9, 200).d(64),
                          rows().batch(2).heads(2, 1).n(70, 40).d(32).causal(),
                          rows().heads(2).n(33, 1000).d(128).causal()})
    check_variants(p, Dist::normal, {Variant::fused});
  check_variants(rows().n(16, 300).d(64), Dist::mean_shifted, {Variant::fused});
}

TEST_CASE("exercise ch02.3: a fully masked row gives P = 0 and LSE = -inf, never NaN") {
  // Causal with Nq > Nk, bottom-right aligned: query i sees keys j <= i - 30, so rows 0-29 are empty.
  const Problem p = rows().heads(2).n(50, 20).d(32).causal();
  const SoftmaxInputs in = make_softmax_inputs(p, Dist::normal, 5);
  const SoftmaxOracle oracle(p, in, CheckPlan::full(p));
  const SoftmaxRun r = softmax_model(p, in, Variant::safe3, kSram);
  for (int h = 0; h < 2; ++h)
    for (int i = 0; i < 30; ++i) {
      const std::size_t row = std::size_t(h) * p.nq + i;
      CHECK(r.lse[row] == -INFINITY);
      for (int j = 0; j < p.nk; ++j) CHECK(r.p[row * p.nk + j] == 0.f);
    }
  const CheckResult c = oracle.judge_softmax(r.p, r.lse);
  CHECK_MESSAGE(c.pass(), c.failures());
}

TEST_CASE("exercise ch02.5: the traffic formula equals the models' counted bytes") {
  for (const Problem p : {rows().n(64).d(64),
                          rows().batch(2).heads(2, 1).n(100, 130).d(32).causal(),
                          rows().heads(3).n(1, 4100).d(128),
                          rows().n(17, 65).d(64),
                          rows().n(2, kRowInRegisters + 1).d(32)}) {
   CAPTURE(p.describe());
   const SoftmaxInputs in = make_softmax_inputs(p, Dist::normal, 1);
   for (Variant v : all_variants()) {
     CAPTURE(variant_name(v));
     const SoftmaxRun r = softmax_model(p, in, v, kSram);
     const SoftmaxTraffic f = softmax_traffic(p, v);
     CHECK(r.traffic.bytes_read == f.read);
     CHECK(r.traffic.bytes_written == f.write);
     CHECK(f.hbm_sweeps >= 1);
     CHECK(r.on_chip == f.on_chip);
     CHECK(r.traffic.extra_peak == 0);  // no scratch: P (or O) is the output
   }
 }
}

TEST_CASE("passes: three sweeps read S three times, online twice, on chip and fused once") {
  const Problem p = rows().heads(2).n(40, 1000).d(64);
  const double s = 4.0 * double(p.s_elems()), lse = 4.0 * double(p.lse_elems());
  CHECK(softmax_traffic(p, Variant::naive).read == 2 * s);
  CHECK(softmax_traffic(p, Variant::safe3).read == 3 * s);
  CHECK(softmax_traffic(p, Variant::online2).read == 2 * s);
  CHECK(softmax_traffic(p, Variant::online_on_chip).read == s);
  for (Variant v : {Variant::naive, Variant::safe3, Variant::online2, Variant::online_on_chip})
    CHECK(softmax_traffic(p, v).write == s + lse);
  // Fused: S once, V_j once per block of Br rows, O (dv per row) and the LSE written; P never.
  const SoftmaxTraffic f = softmax_traffic(p, Variant::fused);
  const double blocks = 2.0 * ((40 + kBr - 1) / kBr);
  CHECK(f.read == s + blocks * 4.0 * p.nk * p.dv);
  CHECK(f.write == 4.0 * double(p.o_elems()) + lse);
  CHECK(f.write < s);
  CHECK(variant_sweeps(Variant::safe3) == 3);
  CHECK(variant_sweeps(Variant::online2) == 2);
  CHECK(variant_sweeps(Variant::fused) == 1);
}

TEST_CASE("rows longer than the registers hold stream: two sweeps over HBM again") {
  const Problem fits = rows().n(2, kRowInRegisters).d(32);
  const Problem too_long = rows().n(2, kRowInRegisters + 1).d(32);
  CHECK(softmax_traffic(fits, Variant::online_on_chip).on_chip);
  CHECK(softmax_traffic(fits, Variant::online_on_chip).hbm_sweeps == 1);
  CHECK_FALSE(softmax_traffic(too_long, Variant::online_on_chip).on_chip);
  CHECK(softmax_traffic(too_long, Variant::online_on_chip).hbm_sweeps == 2);
  check_variants(too_long, Dist::normal, {Variant::online_on_chip});
}

TEST_CASE("tiles that do not fit the on-chip budget are an error, not a silent overflow") {
  const Problem p = rows().n(4, 100).d(128);
  const SoftmaxInputs in = make_softmax_inputs(p, Dist::normal, 1);
  CHECK_THROWS_AS(softmax_model(p, in, Variant::fused, 16 * 1024), SramOverflow);  // V_j alone is 32 KB
  CHECK_THROWS_AS(softmax_model(p, in, Variant::safe3, 8 * 1024), SramOverflow);   // a wave is 16 KB
  const SoftmaxRun r = softmax_model(p, in, Variant::fused, 48 * 1024);
  CHECK(r.sram_peak <= 48 * 1024);
  CHECK(r.sram_peak >= std::size_t(kBc) * p.dv * 4);
}

TEST_CASE("inputs: each row has its own stream, so a row does not depend on how many there are") {
  const Problem small = rows().n(4, 37).d(32), large = rows().n(300, 37).d(32);
  for (Dist d : {Dist::normal, Dist::mean_shifted, Dist::outliers, Dist::integers}) {
    const SoftmaxInputs a = make_softmax_inputs(small, d, 9), b = make_softmax_inputs(large, d, 9);
    for (std::size_t k = 0; k < a.s.size(); ++k) CHECK(a.s[k] == b.s[k]);
    CHECK(make_softmax_inputs(small, d, 10).s != a.s);
  }
  const SoftmaxInputs shifted = make_softmax_inputs(small, Dist::mean_shifted, 9, 100.0);
  double mean = 0;
  for (float x : shifted.s) mean += x / double(shifted.s.size());
  CHECK(mean > 99.0);
  CHECK(mean < 101.0);
}

TEST_CASE("every score of a row has exactly one owner thread, at every alignment") {
  // The kernels' loops (row_ops.cuh sweep(), v3_online_registers.cu), replayed on the CPU.
  std::vector<int> lengths;
  for (int n = 1; n <= 260; ++n) lengths.push_back(n);
  for (int n = 4090; n <= 4101; ++n) lengths.push_back(n);
  for (int n = kRowInRegisters - 5; n <= kRowInRegisters; ++n) lengths.push_back(n);
  for (int misaligned = 0; misaligned < 4; ++misaligned)
    for (int n : lengths) {
      CAPTURE(misaligned);
      CAPTURE(n);
      const unsigned long long address = 4096 + 4 * misaligned;
      const RowSplit g = split_row(address, n);
      REQUIRE(g.head + 4 * g.nvec + g.tail == n);
      CHECK(g.head <= 3);
      CHECK(g.tail <= 3);
      if (g.nvec > 0) CHECK((address + 4 * g.head) % 16 == 0);  // the body is 16-byte aligned
      auto own_scalars = [&](int threads, std::vector<int>& owners) {
        for (int t = 0; t < threads; ++t) {
          if (t < g.head) ++owners[t];
          if (t < g.tail) ++owners[g.tail_start() + t];
        }
      };
      // v1, v2: 256 threads, kUnroll float4 per step of the sweep
      std::vector<int> owners(n, 0);
      for (int t = 0; t < kThreads; ++t)
        for (int v0 = t; v0 < g.nvec; v0 += kUnroll * kThreads)
          for (int u = 0; u < kUnroll; ++u)
            if (v0 + u * kThreads < g.nvec)
              for (int c = 0; c < 4; ++c) ++owners[g.head + 4 * (v0 + u * kThreads) + c];
      own_scalars(kThreads, owners);
      CHECK(std::count(owners.begin(), owners.end(), 1) == n);
      // v3: registers_threads(n) threads, kVecsPerThread float4 each
      const int T = registers_threads(n);
      CHECK(T % 32 == 0);
      CHECK(T <= kMaxThreads);
      std::vector<int> held(n, 0);
      for (int t = 0; t < T; ++t)
        for (int k = 0; k < kVecsPerThread; ++k)
          if (t + k * T < g.nvec)
            for (int c = 0; c < 4; ++c) ++held[g.head + 4 * (t + k * T) + c];
      own_scalars(T, held);
      CHECK(std::count(held.begin(), held.end(), 1) == n);
    }
  CHECK(registers_threads(4096) == 128);
  CHECK(registers_threads(kRowInRegisters) == kMaxThreads);
  CHECK(registers_threads(kRowInRegisters + 4) > kMaxThreads);  // does not fit: v2 runs instead
}
