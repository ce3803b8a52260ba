// Chapter 03's backward model (Algorithm 4 without dropout): correct against the
// fp64 reference backward, 2.5x the forward's FLOPs, and its counted traffic next to
// chapter 01's materialising backward.
#include <doctest/doctest.h>

#include "chapters/01_naive/naive_model.hpp"
#include "chapters/03_fa1/fa1_model.hpp"
#include "common/check.hpp"
#include "support/shapes.hpp"

using namespace attn;
using namespace attn::ch03;

namespace {

constexpr std::size_t kSram = 96 * 1024;

using testing_support::shape;

struct Run {
  Fa1ForwardResult fwd;
  Fa1BackwardResult bwd;
};

Run run(const Problem& p, const AttnInputs& in, std::size_t sram = kSram, Blocks blocks = {}) {
  Run r{fa1_forward_model(p, in, sram), {}};
  r.bwd = fa1_backward_model(p, in, r.fwd.o, r.fwd.lse, sram, blocks);
  return r;
}

// Seed 7. With outlier inputs one seed in 30 at the 80 x 80 shape below (seed 5) puts
// dK 7% beyond the tolerance, for a reason the last test of this file shows.
void check_backward(const Problem& p, Dist dist = Dist::normal, std::size_t sram = kSram, Blocks blocks = {},
                    uint64_t seed = 7) {
  CAPTURE(p.describe());
  CAPTURE(sram);
  const AttnInputs in = make_inputs(p, dist, seed, /*with_dout=*/true);
  const BackwardOracle oracle(p, in, BackwardPlan::full(p));
  const Run r = run(p, in, sram, blocks);
  CAPTURE(r.bwd.blocks.Br);
  CAPTURE(r.bwd.blocks.Bc);
  const CheckResult c = oracle.judge(r.bwd.dq, r.bwd.dk, r.bwd.dv);
  CHECK_MESSAGE(c.pass(), c.failures());
  CHECK(r.bwd.sram_peak <= sram);
}

}  // namespace

TEST_CASE("backward matches the fp64 reference backward at awkward shapes") {
  check_backward(shape().n(1).d(32));
  check_backward(shape().n(1).d(32).causal());
  check_backward(shape().heads(2).n(100).d(64));                       // N not a multiple of B_r or B_c
  check_backward(shape().heads(2).n(100).d(64).causal());
  check_backward(shape().n(37, 129).d(32).causal());                   // Nq < Nk, causal bottom-right
  check_backward(shape().n(129, 37).d(32).causal());                   // Nq > Nk: empty rows, dQ = 0
  check_backward(shape().batch(2).heads(3).n(65, 70).d(32));           // several batches and heads
  check_backward(shape().batch(2).heads(4, 2).n(50).d(128).causal());  // GQA: the group adds into dK, dV on chip
  check_backward(shape().heads(4, 1).n(33, 48).d(64));                 // MQA
  check_backward(shape().n(80).d(64), Dist::mean_shifted);
  check_backward(shape().n(80).d(64).causal(), Dist::outliers);
  check_backward(shape().heads(2, 1).n(70, 90).d(32).causal().dtype(DType::f32));
  check_backward(shape().heads(2).n(70, 90).d(32).dtype(DType::f16));
}

TEST_CASE("exercise ch03.3: the backward recomputes P from the stored LSE") {
  check_backward(shape().heads(2).n(120).d(32).causal(), Dist::mean_shifted, 16 * 1024);
  check_backward(shape().heads(2, 1).n(140, 90).d(64).causal(), Dist::normal, 8 * 1024);  // many blocks, empty rows
  check_backward(shape().n(97, 101).d(32), Dist::outliers, kSram, {7, 13});
}

TEST_CASE("backward: every head dim the kernels support, and the kernels' blocks") {
  for (int d : {32, 64, 128}) {
    const Problem p = shape().n(75).d(d).causal(d != 32);
    check_backward(p, Dist::normal, 1 << 20, kernel_backward_blocks(d));
  }
}

TEST_CASE("backward FLOPs are 2.5x the forward's: five matmuls to two") {
  for (bool causal : {false, true}) {
    const Problem p = shape().heads(2, 1).n(256).d(64).causal(causal);
    const AttnInputs in = make_inputs(p, Dist::normal, 1, true);
    const Blocks b{32, 32};  // the same visited blocks in both passes
    const Fa1ForwardResult f = fa1_forward_model(p, in, kSram, b);
    const Fa1BackwardResult r = fa1_backward_model(p, in, f.o, f.lse, kSram, b);
    CAPTURE(causal);
    CHECK(r.traffic.flops == doctest::Approx(2.5 * f.traffic.flops));
    CHECK(flops_backward(p) == doctest::Approx(2.5 * flops_forward(p)));
  }
}

TEST_CASE("the backward traffic formula equals the counted bytes") {
  for (const Problem p : {shape().n(64).d(64),
                          shape().batch(2).heads(4, 2).n(100, 130).d(32).causal(),
                          shape().n(129, 37).d(32).causal(),
                          shape().heads(3).n(1, 200).d(32).dtype(DType::f32)}) {
   for (std::size_t sram : {8 * 1024, 96 * 1024}) {
     CAPTURE(p.describe());
     CAPTURE(sram);
     const AttnInputs in = make_inputs(p, Dist::normal, 1, true);
     const Run r = run(p, in, sram);
     const Fa1Traffic t = fa1_backward_traffic(p, r.bwd.blocks);
     CHECK(r.bwd.traffic.bytes_read == t.read());
     CHECK(r.bwd.traffic.bytes_written == t.write());
     CHECK(r.bwd.traffic.extra_peak == t.extra);
   }
 }
}

TEST_CASE("backward: Theta(N^2 d^2 / M) traffic and O(N) extra memory") {
  auto counted = [](int n, std::size_t sram) {
    const Problem p = shape().n(n).d(32);
    const AttnInputs in = make_inputs(p, Dist::normal, 1, true);
    return run(p, in, sram).bwd.traffic;
  };
  // Doubling M halves B_c's step count: Q_i, dO_i and the fp32 dQ_i round trip are
  // streamed half as often; K, V, dK, dV and the D pass (a few percent) stay.
  const Traffic a = counted(512, 16 * 1024), b = counted(512, 32 * 1024), c = counted(1024, 16 * 1024);
  CHECK(a.bytes() / b.bytes() > 1.8);
  CHECK(a.bytes() / b.bytes() < 2.1);
  // Doubling N quadruples it (N^2), while the scratch (D and the fp32 dQ) only doubles.
  CHECK(c.bytes() / a.bytes() > 3.8);
  CHECK(c.bytes() / a.bytes() < 4.2);
  CHECK(c.extra_peak == 2 * a.extra_peak);
}

TEST_CASE("next to chapter 01's materialising backward: no N^2 matrix, fewer bytes at d = 64") {
  const Problem p = shape().heads(2).n(512).d(64);
  const AttnInputs in = make_inputs(p, Dist::normal, 1, true);
  const Run r = run(p, in, kSram);
  const ch01::NaiveBackwardResult naive = ch01::naive_backward_model(p, in, kSram);
  // Chapter 01 keeps P, dP and dS: three fp32 N^2 matrices per head.
  CHECK(naive.traffic.extra_peak >= 3.0 * 4 * p.s_elems());
  CHECK(r.bwd.traffic.extra_peak < 0.1 * naive.traffic.extra_peak);
  // Recomputing S and P costs one matmul more than chapter 01 counts (5 instead of 4) ...
  CHECK(r.bwd.traffic.flops > 1.2 * naive.traffic.flops);
  // ... and moves fewer bytes than reading the stored N^2 matrices back.
  CHECK(r.bwd.traffic.bytes() < naive.traffic.bytes());
}

TEST_CASE("the stored O's rounding dominates the backward's error at outlier inputs") {
  // D_i = rowsum(dO_i o O_i) is computed from the O the forward stored in bf16, as every
  // FlashAttention backward does. With outliers (entries of V and dO scaled by 20) the
  // rounding of a large O_i moves D_i by ~u |dO_i| |O_i|, and every dS_ij of the row
  // inherits it. The yardstick recomputes its own O, rounded differently, so at some
  // seeds it is the luckier one: this is such a seed, where dK lands just beyond
  // 2x the yardstick. Given O in fp32 instead, the same backward is far inside.
  const Problem p = shape().n(80).d(64).causal();
  const AttnInputs in = make_inputs(p, Dist::outliers, 5, true);
  const BackwardOracle oracle(p, in, BackwardPlan::full(p));
  const Fa1ForwardResult f = fa1_forward_model(p, in, kSram);
  const RefForward exact = reference_forward(p, in, CheckPlan::full(p));
  const std::vector<float> o32(exact.o.values.begin(), exact.o.values.end());
  const Fa1BackwardResult b16 = fa1_backward_model(p, in, f.o, f.lse, kSram);
  const CheckResult stored = oracle.judge(b16.dq, b16.dk, b16.dv);
  const Fa1BackwardResult b32 = fa1_backward_model(p, in, o32, f.lse, kSram);
  const CheckResult with_fp32_o = oracle.judge(b32.dq, b32.dk, b32.dv);
  CHECK(with_fp32_o.pass());
  for (int t = 0; t < 3; ++t) {
    CAPTURE(stored.tensors[t].name);
    CHECK(with_fp32_o.tensors[t].err.max_abs <= 0.5 * with_fp32_o.tensors[t].verdict.tolerance);
  }
  // dQ and dK carry the D_i error; dV = P^T dO does not use D at all.
  CHECK(stored.tensors[0].err.max_abs > 3 * with_fp32_o.tensors[0].err.max_abs);
  CHECK(stored.tensors[1].err.max_abs > 3 * with_fp32_o.tensors[1].err.max_abs);
  CHECK(stored.tensors[2].err.max_abs == with_fp32_o.tensors[2].err.max_abs);
  CHECK(stored.tensors[1].err.max_abs < 1.2 * stored.tensors[1].verdict.tolerance);
}
