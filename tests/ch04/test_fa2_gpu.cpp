// Chapter 04's kernels on the GPU: every forward step of the main path, the final kernel
// (the lab's steps in a TUTORIAL_LAB build) and the backward against the fp64 reference at awkward shapes (skipped without a device).
#include <doctest/doctest.h>

#include "chapters/04_fa2/fa2_gpu.hpp"
#include "common/check.hpp"
#include "support/shapes.hpp"

using namespace attn;
using namespace attn::ch04;

namespace {

using testing_support::shape;

const Problem kShapes[] = {
    shape().n(1).d(64),
    shape().n(1).d(128).causal(),
    shape().heads(2).n(200).d(64).causal(),
    shape().batch(2).heads(4, 2).n(333).d(128),
    shape().heads(2, 1).n(100, 700).d(128).causal(),
    shape().n(700, 100).d(64).causal(),
    shape().heads(3).n(1024).d(128).causal(),
    shape().n(513, 1031).d(64),
};

void check_step(int step, const Problem& p, Dist dist = Dist::normal) {
  if (!step_unsupported(step, p).empty()) return;
  CAPTURE(step_name(step));
  CAPTURE(p.describe());
  const AttnInputs in = make_inputs(p, dist, 21);
  const ForwardOracle oracle(p, in, CheckPlan::full(p));
  const GpuForward g = fa2_forward_gpu(p, in, step, false);
  const CheckResult c = oracle.judge(g.o, &g.lse);
  CHECK_MESSAGE(c.pass(), c.failures());
}

void check_backward(const Problem& p, bool det, Dist dist = Dist::normal) {
  CAPTURE(p.describe());
  CAPTURE(det);
  const AttnInputs in = make_inputs(p, dist, 22, true);
  const BackwardOracle oracle(p, in, BackwardPlan::full(p));
  const GpuBackward g = fa2_backward_gpu(p, in, det, false);
  const CheckResult c = oracle.judge(g.dq, g.dk, g.dv);
  CHECK_MESSAGE(c.pass(), c.failures());
}

}  // namespace

TEST_CASE("forward step 1 (loop swap)") {
  for (const Problem& p : kShapes) check_step(1, p);
}
TEST_CASE("forward step 2 (mma.sync)") {
  for (const Problem& p : kShapes) check_step(2, p);
}
TEST_CASE("forward step 3 (ldmatrix and swizzle)") {
  for (const Problem& p : kShapes) check_step(3, p);
}
TEST_CASE("forward step 4 (cp.async)") {
  for (const Problem& p : kShapes) check_step(4, p);
}
TEST_CASE("forward step 5 (heaviest first)") {
  for (const Problem& p : kShapes) check_step(5, p);
  check_step(5, shape().n(256).d(64).causal(), Dist::mean_shifted);
}
TEST_CASE("forward step 6 (two tiles per warp)") {
  for (const Problem& p : kShapes) check_step(6, p);
  check_step(6, shape().heads(2).n(127, 129).d(128).causal(), Dist::mean_shifted);  // one row short of Br
}
TEST_CASE("final forward: bf16 and fp16, d 64/128/256, mean-shifted and outliers") {
  for (const Problem& p : kShapes) {
    check_step(kFinal, p);
    Problem h = p;
    h.dtype = DType::f16;
    check_step(kFinal, h);
  }
  check_step(kFinal, shape().heads(2).n(300).d(256).causal());
  check_step(kFinal, shape().batch(2).heads(2, 1).n(129, 257).d(256).dtype(DType::f16));
  check_step(kFinal, shape().n(700, 100).d(256).causal());  // empty rows at d = 256
  check_step(kFinal, shape().heads(4).n(512).d(128).causal(), Dist::mean_shifted);
  check_step(kFinal, shape().heads(4).n(512).d(64), Dist::outliers);
  check_step(kFinal, shape().heads(2).n(129).d(128).causal(), Dist::outliers);  // one row past Br, O from registers
  check_step(kFinal, shape().batch(3).heads(2, 1).n(65, 400).d(64).causal());    // O through shared memory
}

#if TUTORIAL_LAB  // the lab's steps (steps/lab/), built with TUTORIAL_LAB=ON
TEST_CASE("lab step 7 (deferred row sums)") {
  for (const Problem& p : kShapes) check_step(7, p);
  check_step(7, shape().heads(2).n(129).d(64).causal(), Dist::outliers);  // one row past Br
}
TEST_CASE("lab step 8 (O through shared memory)") {
  for (const Problem& p : kShapes) check_step(8, p);
  check_step(8, shape().batch(3).heads(2, 1).n(65, 400).d(128).causal());
}
TEST_CASE("lab step 9 (tiles per head dim): bf16 and fp16, d 64/128/256, mean-shifted and outliers") {
  for (const Problem& p : kShapes) {
    check_step(9, p);
    Problem h = p;
    h.dtype = DType::f16;
    check_step(9, h);
  }
  check_step(9, shape().heads(2).n(300).d(256).causal());
  check_step(9, shape().batch(2).heads(2, 1).n(129, 257).d(256).dtype(DType::f16));
  check_step(9, shape().n(700, 100).d(256).causal());  // empty rows at d = 256
  check_step(9, shape().heads(4).n(512).d(128).causal(), Dist::mean_shifted);
  check_step(9, shape().heads(4).n(512).d(64), Dist::outliers);
}
#endif

// One small awkward shape through every kernel of the chapter: quick, and the set that
// compute-sanitizer (memcheck, racecheck) runs: tests_ch04_gpu -tc="every kernel*".
TEST_CASE("every kernel at one small awkward shape") {
  for (int d : {64, 128, 256}) {
    const Problem p = shape().heads(2, 1).n(130, 257).d(d).causal();
    for (int s : kMainSteps) check_step(s, p);
#if TUTORIAL_LAB
    for (int s : kLabSteps) check_step(s, p);
#endif
    if (backward_unsupported(p).empty())
      for (bool det : {false, true}) check_backward(p, det);
  }
}

TEST_CASE("exercise ch04.3: backward with dQ atomics") {
  for (const Problem p : {shape().n(1).d(64),
                          shape().heads(2).n(200).d(64).causal(),
                          shape().batch(2).heads(4, 2).n(129, 300).d(128).causal(),
                          shape().n(300, 129).d(128).causal(),
                          shape().heads(2).n(256).d(64).dtype(DType::f16)})
    check_backward(p, false);
  check_backward(shape().heads(2).n(256).d(128).causal(), false, Dist::mean_shifted);
}

TEST_CASE("backward, deterministic dQ: correct and bitwise repeatable") {
  for (const Problem p : {shape().heads(2).n(200).d(64).causal(),
                          shape().batch(2).heads(4, 2).n(129, 300).d(128).causal(),
                          shape().n(300, 129).d(64).causal()})
    check_backward(p, true);
  const Problem p = shape().heads(4).n(512).d(128);
  const AttnInputs in = make_inputs(p, Dist::normal, 5, true);
  const GpuBackward a = fa2_backward_gpu(p, in, true, false), b = fa2_backward_gpu(p, in, true, false);
  CHECK(a.dq == b.dq);
  CHECK(a.dk == b.dk);
  CHECK(a.dv == b.dv);
}
