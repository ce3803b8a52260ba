// Chapter 04's kernels on the GPU: every forward step and the backward against the
// fp64 reference at awkward shapes (skipped without a device).
#include <doctest/doctest.h>

#include "common/check.hpp"
#include "fa2_gpu.hpp"
#include "support/shapes.hpp"

using namespace attn;
using namespace attn::ch04;

namespace {

using testing_support::shape;

const Problem kShapes[] = {
    shape(1, 1, 1, 1, 1, 64, false),      shape(1, 1, 1, 1, 1, 128, true),
    shape(1, 2, 2, 200, 200, 64, true),   shape(2, 4, 2, 333, 333, 128, false),
    shape(1, 2, 1, 100, 700, 128, true),  shape(1, 1, 1, 700, 100, 64, true),
    shape(1, 3, 3, 1024, 1024, 128, true), shape(1, 1, 1, 513, 1031, 64, false),
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
TEST_CASE("forward step 5 (exp2 and causal skipping)") {
  for (const Problem& p : kShapes) check_step(5, p);
  check_step(5, shape(1, 1, 1, 256, 256, 64, true), Dist::mean_shifted);
}
TEST_CASE("forward step 6 (final): bf16 and fp16, d 64/128/256, mean-shifted and outliers") {
  for (const Problem& p : kShapes) {
    check_step(6, p);
    Problem h = p;
    h.dtype = DType::f16;
    check_step(6, h);
  }
  check_step(6, shape(1, 2, 2, 300, 300, 256, true));
  check_step(6, shape(2, 2, 1, 129, 257, 256, false, DType::f16));
  check_step(6, shape(1, 4, 4, 512, 512, 128, true), Dist::mean_shifted);
  check_step(6, shape(1, 4, 4, 512, 512, 64, false), Dist::outliers);
}

TEST_CASE("exercise ch04.3: backward with dQ atomics") {
  for (const Problem& p : {shape(1, 1, 1, 1, 1, 64, false), shape(1, 2, 2, 200, 200, 64, true),
                           shape(2, 4, 2, 129, 300, 128, true), shape(1, 1, 1, 300, 129, 128, true),
                           shape(1, 2, 2, 256, 256, 64, false, DType::f16)})
    check_backward(p, false);
  check_backward(shape(1, 2, 2, 256, 256, 128, true), false, Dist::mean_shifted);
}

TEST_CASE("backward, deterministic dQ: correct and bitwise repeatable") {
  for (const Problem& p : {shape(1, 2, 2, 200, 200, 64, true), shape(2, 4, 2, 129, 300, 128, true),
                           shape(1, 1, 1, 300, 129, 64, true)})
    check_backward(p, true);
  const Problem p = shape(1, 4, 4, 512, 512, 128, false);
  const AttnInputs in = make_inputs(p, Dist::normal, 5, true);
  const GpuBackward a = fa2_backward_gpu(p, in, true, false), b = fa2_backward_gpu(p, in, true, false);
  CHECK(a.dq == b.dq);
  CHECK(a.dk == b.dk);
  CHECK(a.dv == b.dv);
}
