// Chapter 03's CPU model: Algorithm 1 correct at awkward shapes, its block sizes
// from M, and Theorem 2 on counted runs.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>

#include "chapters/01_naive/naive_model.hpp"
#include "chapters/03_fa1/fa1_model.hpp"
#include "common/check.hpp"
#include "common/errors.hpp"
#include "support/shapes.hpp"

using namespace attn;
using namespace attn::ch03;

namespace {

constexpr std::size_t kSram = 96 * 1024;

using testing_support::shape;

void check_forward(const Problem& p, Dist dist = Dist::normal, std::size_t sram = kSram, Blocks blocks = {}) {
  CAPTURE(p.describe());
  CAPTURE(sram);
  const AttnInputs in = make_inputs(p, dist, 42);
  const ForwardOracle oracle(p, in, CheckPlan::full(p));
  const Fa1ForwardResult r = fa1_forward_model(p, in, sram, blocks);
  CAPTURE(r.blocks.Br);
  CAPTURE(r.blocks.Bc);
  const CheckResult c = oracle.judge(r.o, &r.lse);
  CHECK_MESSAGE(c.pass(), c.failures());
  CHECK(r.sram_peak <= sram);
}

double counted_bytes(const Problem& p, std::size_t sram) {
  const AttnInputs in = make_inputs(p, Dist::normal, 1);
  return fa1_forward_model(p, in, sram).traffic.bytes();
}

}  // namespace

TEST_CASE("forward matches the fp64 reference at awkward shapes") {
  check_forward(shape().n(1).d(32));                                  // N = 1
  check_forward(shape().n(1).d(32).causal());
  check_forward(shape().heads(2).n(100).d(64));                       // N not a multiple of B_r or B_c
  check_forward(shape().heads(2).n(100).d(64).causal());
  check_forward(shape().n(37, 129).d(32).causal());                   // Nq < Nk, causal bottom-right
  check_forward(shape().n(129, 37).d(32).causal());                   // Nq > Nk: the first rows are empty
  check_forward(shape().batch(2).heads(3).n(65, 70).d(32));           // several batches and heads
  check_forward(shape().batch(2).heads(4, 2).n(50).d(128).causal());  // GQA
  check_forward(shape().heads(4, 1).n(33, 48).d(64));                 // MQA
  check_forward(shape().n(80).d(64), Dist::mean_shifted);
  check_forward(shape().n(80).d(64).causal(), Dist::outliers);
  check_forward(shape().heads(2, 1).n(70, 90).d(32).causal().dtype(DType::f32));
  check_forward(shape().heads(2).n(70, 90).d(32).dtype(DType::f16));
}

TEST_CASE("forward with many small blocks: N below one block and many steps per row") {
  // 8 KB: d = 64 gives B_c = 8, B_r = 7, so a row of 300 keys takes 38 online steps.
  check_forward(shape().n(300).d(64).causal(), Dist::mean_shifted, 8 * 1024);
  check_forward(shape().heads(2, 1).n(200, 77).d(32).causal(), Dist::normal, 8 * 1024);
  // A budget far above the problem: one block holds everything (T_r = T_c = 1).
  check_forward(shape().n(20, 30).d(32), Dist::normal, 4 << 20);
  // Explicit blocks, including B_r > B_c and sizes that divide nothing.
  check_forward(shape().n(97, 101).d(32).causal(), Dist::mean_shifted, kSram, {17, 5});
  check_forward(shape().n(97, 101).d(32), Dist::outliers, kSram, {3, 33});
}

TEST_CASE("every head dim the kernels support") {
  for (int d : {32, 64, 128}) check_forward(shape().n(67).d(d).causal(d != 64));
}

TEST_CASE("block sizes follow the paper's rule B_c = ceil(M/4d), B_r = min(B_c, d), capped to fit") {
  // 1 MiB = 262144 fp32 elements: B_c = 262144 / 256 = 1024 and B_r = min(1024, 64) = 64 fits.
  const Problem big = shape().n(4096).d(64);
  CHECK(forward_blocks(big, 1 << 20) == Blocks{64, 1024});
  // 96 KB = 24576 elements: B_c = 96; K_j and V_j take 12288, and 54 rows of
  // Q_i, O_i, S_ij, m_i, l_i (226 elements each) fill the rest: B_r is capped at 54.
  const Blocks b = forward_blocks(big, kSram);
  CHECK(b.Bc == 96);
  CHECK(b.Br == 54);
  CHECK(forward_footprint(big, b) * 4 <= kSram);
  CHECK(forward_footprint(big, {b.Br + 1, b.Bc}) * 4 > kSram);
  // Never larger than the problem.
  CHECK(forward_blocks(shape().n(10, 20).d(64), 1 << 20) == Blocks{10, 20});
  // The backward's four B_c x d tiles: B_c = ceil(M/8d).
  const Blocks bb = backward_blocks(big, kSram);
  CHECK(bb.Bc == 48);
  CHECK(backward_footprint(big, bb) * 4 <= kSram);
  CHECK(backward_footprint(big, {bb.Br + 1, bb.Bc}) * 4 > kSram);
  // The kernels' fixed blocks are the same rule at M = 32768 elements.
  CHECK(kernel_forward_blocks(64) == Blocks{64, 128});
  CHECK(kernel_backward_blocks(128) == Blocks{32, 32});
}

TEST_CASE("tiles that do not fit the on-chip budget are an error, not a silent overflow") {
  const Problem p = shape().n(64).d(64);
  const AttnInputs in = make_inputs(p, Dist::normal, 1, true);
  CHECK_THROWS_AS(fa1_forward_model(p, in, 512), SramOverflow);  // K_j and V_j (B_c = 1) fill all 512 B
  CHECK_THROWS_AS(fa1_forward_model(p, in, kSram, {64, 128}), SramOverflow);  // explicit blocks: 131 KB
  const Fa1ForwardResult r = fa1_forward_model(p, in, 4096);
  CHECK(r.sram_peak <= 4096);
  CHECK_THROWS_AS(fa1_backward_model(p, in, r.o, r.lse, 1024), SramOverflow);
}

TEST_CASE("exercise ch03.1: the rescale of Algorithm 1 line 12") {
  // Mean-shifted scores and many K/V blocks per row: the running max changes often.
  check_forward(shape().heads(2).n(150).d(32), Dist::mean_shifted, 16 * 1024);
  check_forward(shape().n(90, 200).d(64).causal(), Dist::outliers, 16 * 1024);
}

TEST_CASE("exercise ch03.4: the traffic formula predicts the counted bytes for any B_r and B_c") {
  struct Case {
    Problem p;
    std::size_t sram;
    Blocks blocks;
  };
  for (const Case& c : {Case{shape().n(64).d(64), kSram, {}},
                        Case{shape().batch(2).heads(2, 1).n(100, 130).d(32).causal(), kSram, {}},
                        Case{shape().heads(3).n(1, 200).d(32).dtype(DType::f32), kSram, {}},
                        Case{shape().n(129, 37).d(32).causal(), 8 * 1024, {}},       // empty Q blocks
                        Case{shape().n(200).d(64), kSram, {16, 16}},
                        Case{shape().n(200).d(64), kSram, {64, 16}},                 // B_r changes nothing
                        Case{shape().n(200).d(64).causal(), kSram, {8, 32}}}) {
    CAPTURE(c.p.describe());
    const AttnInputs in = make_inputs(c.p, Dist::normal, 1);
    const Fa1ForwardResult r = fa1_forward_model(c.p, in, c.sram, c.blocks);
    const Fa1Traffic f = fa1_forward_traffic(c.p, r.blocks);
    CHECK(r.traffic.bytes_read == f.read());
    CHECK(r.traffic.bytes_written == f.write());
    CHECK(r.traffic.extra_peak == f.extra);
    CHECK(f.kv_read > 0);
    CHECK(f.visits > 0);
  }
  // B_r does not change the traffic; halving B_c doubles the streamed part.
  const Problem p = shape().n(512).d(64);
  CHECK(fa1_forward_traffic(p, {16, 32}).total() == fa1_forward_traffic(p, {64, 32}).total());
  const double half = fa1_forward_traffic(p, {32, 16}).total() / fa1_forward_traffic(p, {32, 32}).total();
  CHECK(half > 1.95);
  CHECK(half < 2.05);
}

TEST_CASE("exercise ch03.2: causal block skipping visits only the blocks below the diagonal") {
  // Correct with skipping (including Q blocks that are entirely empty) ...
  check_forward(shape().n(129, 37).d(32).causal(), Dist::normal, 8 * 1024);
  check_forward(shape().heads(2).n(100, 300).d(32).causal(), Dist::mean_shifted, 8 * 1024);
  // ... and the skipped blocks are not paid for: for a square causal problem the
  // visited pairs are about half (T_c (T_c + 1) / 2 of T_c^2), and so are the FLOPs.
  const Problem causal = shape().n(512).d(32).causal();
  Problem full = causal;
  full.causal = false;
  const AttnInputs in = make_inputs(causal, Dist::normal, 1);
  const Blocks b{32, 32};  // T_r = T_c = 16
  const Fa1ForwardResult rc = fa1_forward_model(causal, in, kSram, b), rf = fa1_forward_model(full, in, kSram, b);
  CHECK(fa1_forward_traffic(causal, b).visits == 16 * 17 / 2);
  // Counted FLOPs include the masked half of each diagonal block: 17/32 of the full square.
  CHECK(rc.traffic.flops == doctest::Approx(rf.traffic.flops * 17.0 / 32.0));
  CHECK(rc.traffic.flops < 1.1 * flops_forward(causal));
  CHECK(rc.traffic.bytes() < 0.6 * rf.traffic.bytes());
  // Nq > Nk: the first 92 rows see no key; with B_r = 32 the first two Q blocks are skipped entirely.
  const Problem tall = shape().n(129, 37).d(32).causal();
  CHECK(last_visit(tall, {32, 16}, 0) == -1);
  CHECK(last_visit(tall, {32, 16}, 1) == -1);
  CHECK(last_visit(tall, {32, 16}, 2) == 0);   // rows 64..95: row 95 sees keys 0..3
  CHECK(last_visit(tall, {32, 16}, 4) == 2);   // row 128 sees every key
}

// ----------------------------------------------------------------------------- Theorem 2

TEST_CASE("Theorem 2: counted HBM traffic is Theta(N^2 d^2 / M)") {
  // A grid over which N^2 d^2 / M spans a factor of 256. The counted bytes divided
  // by it stay at about 40 * (1 + 1.6/d): per K/V block and per query row FA1 moves
  // Q_i (2d bytes in bf16) and the fp32 state (m, l, O) in and out (8d + 16), and
  // there are T_c ~ 4dN/M K/V blocks. What the Theta hides (K and V read once, the
  // first step that reads no state and the last that writes none, the rounding up
  // of T_c) moves the constant by a few percent here, so 15% is the band.
  double lo = 1e300, hi = 0;
  for (int d : {32, 64})
    for (int n : {256, 1024})
      for (std::size_t sram : {16 * 1024, 32 * 1024, 64 * 1024}) {
        const Problem p = shape().n(n).d(d);
        const double c = counted_bytes(p, sram) / theorem2_scale(p, sram);
        CAPTURE(p.describe());
        CAPTURE(sram);
        CHECK(c > 0.85 * 40 * (1 + 1.6 / d));
        CHECK(c < 1.05 * 40 * (1 + 1.6 / d));
        lo = std::min(lo, c);
        hi = std::max(hi, c);
      }
  CHECK(hi / lo < 1.15);
}

TEST_CASE("Theorem 2: doubling M roughly halves the traffic at fixed N and d") {
  // B_c doubles with M, so T_c halves; only the K/V read (a few percent here) stays.
  for (int d : {32, 64}) {
    const Problem p = shape().heads(2).n(768).d(d).causal();
    for (std::size_t sram : {16 * 1024, 32 * 1024}) {
      const double ratio = counted_bytes(p, sram) / counted_bytes(p, 2 * sram);
      CAPTURE(d);
      CAPTURE(sram);
      CHECK(ratio > 1.85);
      CHECK(ratio < 2.1);
    }
  }
}

TEST_CASE("Theorem 2: the extra global memory is O(N), not O(N^2)") {
  // FA1's scratch is the statistics m, l and the fp32 O accumulator: (8 + 4 dv) bytes
  // per query row, however long the rows are. Chapter 01 keeps S and P: 8 Nk bytes per row.
  auto extra = [](int n) {
    const Problem p = shape().heads(2).n(n).d(32);
    const AttnInputs in = make_inputs(p, Dist::normal, 1);
    return fa1_forward_model(p, in, kSram).traffic.extra_peak;
  };
  const double e256 = extra(256), e512 = extra(512), e1024 = extra(1024);
  CHECK(e512 == 2 * e256);
  CHECK(e1024 == 2 * e512);
  CHECK(e1024 == 2 * 1024 * (8 + 4 * 32));
  const Problem p = shape().heads(2).n(1024).d(32);
  CHECK(ch01::naive_forward_traffic(p).extra() > 50 * e1024);
}

TEST_CASE("the ratio to chapter 01's traffic grows with M as Theorem 2 says") {
  // Chapter 01 moves Theta(N^2) bytes whatever M is; FA1 moves Theta(N^2 d^2 / M).
  const Problem p = shape().n(1024).d(64);
  const ch01::NaiveTrafficFormula n = ch01::naive_forward_traffic(p);
  const double naive = n.read() + n.write();
  const double r96 = naive / counted_bytes(p, kSram), r192 = naive / counted_bytes(p, 2 * kSram);
  CHECK(r96 > 2.5);  // at d = 64 and 96 KB, about 3.6x fewer bytes
  CHECK(r192 / r96 > 1.85);
  CHECK(r192 / r96 < 2.1);
  // And at d = 128 the same budget buys much less: d^2 / M is four times larger.
  const Problem p128 = shape().n(1024).d(128);
  const ch01::NaiveTrafficFormula n128 = ch01::naive_forward_traffic(p128);
  CHECK((n128.read() + n128.write()) / counted_bytes(p128, kSram) < 0.5 * r96);
}
