#pragma once
// Chapter 05's GPU checks, shared by the main path's tests (test_fa3_gpu.cpp) and the lab's
// (test_fa3_lab_gpu.cpp): each step against the fp64 reference (the FP8 steps against the
// plain FP8 computation), at the awkward shapes, and the repeated-run bit check.
#include <doctest/doctest.h>

#include <cmath>
#include <cstdlib>
#include <iostream>
#include <string>

#include "chapters/05_fa3_hopper/fa3_gpu.hpp"
#include "chapters/05_fa3_hopper/fa3_tiles.hpp"
#include "chapters/05_fa3_hopper/fp8_model.hpp"
#include "common/check.hpp"
#include "support/shapes.hpp"

namespace ch05_checks {

using namespace attn;
using namespace attn::ch05;

/// Ends the test binary with ctest's skip code (77) unless chapter 05's kernels can run
/// here. ctest runs each TEST_CASE as its own process, so each one reports "skipped".
inline void require_hopper() {
  std::string why;
  if (hopper_ready(&why)) return;
  std::cout << "SKIPPED: " << why << std::endl;
  std::exit(77);
}

using testing_support::shape;

inline void check_step(Step s, const Problem& p, Dist dist = Dist::normal) {
  CAPTURE(step_name(s));
  CAPTURE(p.describe());
  CAPTURE(dist_name(dist));
  const AttnInputs in = make_inputs(p, dist, 17);
  const GpuForward g = fa3_forward_gpu(p, in, s, false);
  if (step_is_fp8(s)) {
    const Fp8Oracle oracle(p, in, CheckPlan::full(p));
    const CheckResult c = oracle.judge(g.o, &g.lse);
    CHECK_MESSAGE(c.pass(), c.failures());
  } else {
    const ForwardOracle oracle(p, in, CheckPlan::full(p));
    const CheckResult c = oracle.judge(g.o, &g.lse);
    CHECK_MESSAGE(c.pass(), c.failures());
  }
}

/// The awkward shapes every step must pass, at head dim d.
inline void awkward_shapes(Step s, int d, DType t) {
  check_step(s, shape().n(1).d(d).dtype(t));                                      // N = 1
  check_step(s, shape().heads(2).n(100).d(d).causal().dtype(t));                  // N below one tile
  check_step(s, shape().batch(2).heads(4, 2).n(130, 67).d(d).causal().dtype(t));  // Nq > Nk: empty rows; GQA; batches
  check_step(s, shape().heads(2, 1).n(67, 300).d(d).causal().dtype(t));           // Nq < Nk, causal bottom-right
  check_step(s, shape().heads(2).n(300, 40).d(d).causal().dtype(t));              // Nq - Nk > Br: whole tiles see no key
  check_step(s, shape().heads(3).n(257).d(d).dtype(t), Dist::mean_shifted);
  check_step(s, shape().heads(4, 1).n(300, 520).d(d).dtype(t));                   // MQA, N not a multiple of any tile
}

/// Two runs of step s on the same inputs give the same bits (no race between the producer
/// and the consumers).
inline void check_repeatable(Step s, const Problem& p) {
  CAPTURE(step_name(s));
  const AttnInputs in = make_inputs(p, Dist::normal, 3);
  const GpuForward a = fa3_forward_gpu(p, in, s, false), b = fa3_forward_gpu(p, in, s, false);
  std::size_t diff = 0;
  for (std::size_t i = 0; i < a.o.size(); ++i) diff += !(a.o[i] == b.o[i]);
  CHECK(diff == 0);
}



}  // namespace ch05_checks
