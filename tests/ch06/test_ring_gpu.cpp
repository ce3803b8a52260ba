// Chapter 06, ring attention on the GPU: the streams backend (P virtual ranks on one
// GPU, chapter 04's kernels per step) against the fp64 reference, forward and
// backward, every P, layout and mask; the NCCL backend at P = 1 when it is built.
// Skipped without a device.
#include <cstdlib>
#include <iostream>
#include <doctest/doctest.h>

#include <string>

#include "chapters/06_variants/ring/ring_gpu.hpp"
#include "common/check.hpp"
#include "common/errors.hpp"
#include "support/run_binary.hpp"
#include "support/shapes.hpp"

using namespace attn;
using namespace attn::ch06::ring;
using testing_support::shape;

namespace {

void check_gpu_ring(const Problem& p, Backend backend, Layout layout, int ranks, Dist dist = Dist::normal) {
  CAPTURE(p.describe());
  CAPTURE(ranks);
  CAPTURE(layout_name(layout));
  CAPTURE(backend_name(backend));
  const AttnInputs in = make_inputs(p, dist, 41, true);
  GpuRingOptions o;
  o.backend = backend;
  o.layout = layout;
  o.ranks = ranks;
  o.backward = true;
  const GpuRingResult g = ring_gpu(p, in, o);
  const ForwardOracle fwd(p, in, CheckPlan::full(p));
  const CheckResult cf = fwd.judge(g.o, &g.lse);
  CHECK_MESSAGE(cf.pass(), cf.failures());
  const BackwardOracle bwd(p, in, BackwardPlan::full(p));
  const CheckResult cb = bwd.judge(g.dq, g.dk, g.dv);
  CHECK_MESSAGE(cb.pass(), cb.failures());
}

const Layout kLayouts[] = {Layout::contiguous, Layout::striped, Layout::zigzag};

}  // namespace

TEST_CASE("streams ring equals single-device attention: P 1 2 3 4 8, every layout, causal and not") {
  // N = 301: not a multiple of 2P, of any tile, and striped shards of unequal length.
  for (bool causal : {true, false})
    for (Layout l : kLayouts)
      for (int P : {1, 2, 3, 4, 8}) check_gpu_ring(shape().heads(2).n(301).d(64).causal(causal), Backend::streams, l, P);
}

TEST_CASE("streams ring: GQA, several batches, d 128, fp16, mean-shifted inputs") {
  for (Layout l : kLayouts) {
    check_gpu_ring(shape().batch(2).heads(4, 2).n(517).d(64).causal(), Backend::streams, l, 3);
    check_gpu_ring(shape().heads(4, 1).n(1000).d(128).causal(), Backend::streams, l, 4);
    check_gpu_ring(shape().batch(2).heads(2).n(257).d(64).causal().dtype(DType::f16), Backend::streams, l, 8);
  }
  check_gpu_ring(shape().heads(2).n(640).d(64).causal(), Backend::streams, Layout::zigzag, 4, Dist::mean_shifted);
}

TEST_CASE("streams ring: every rank holds one token (P = N)") {
  for (Layout l : kLayouts) check_gpu_ring(shape().n(8).d(64).causal(), Backend::streams, l, 8);
}

TEST_CASE("the one-device baseline that --bench times beside the ring equals the reference") {
  // The rows the ring's --bench times beside the ring: chapter 04's kernels on the whole
  // problem, their outputs from a first launch into poisoned buffers.
  for (const Problem& p : {Problem(shape().heads(2).n(301).d(64).causal()),
                           Problem(shape().batch(2).heads(4, 2).n(517).d(128)),
                           Problem(shape().heads(2).n(257).d(64).causal().dtype(DType::f16))}) {
    CAPTURE(p.describe());
    const AttnInputs in = make_inputs(p, Dist::normal, 43, true);
    const SingleGpuTiming t = single_gpu_timing(p, in, true);
    CHECK(t.fwd_ms > 0);
    CHECK(t.bwd_ms > 0);
    const CheckResult cf = ForwardOracle(p, in, CheckPlan::full(p)).judge(t.o, &t.lse);
    CHECK_MESSAGE(cf.pass(), cf.failures());
    const CheckResult cb = BackwardOracle(p, in, BackwardPlan::full(p)).judge(t.dq, t.dk, t.dv);
    CHECK_MESSAGE(cb.pass(), cb.failures());
  }
}

TEST_CASE("nccl ring at P = 1 on one GPU (when built with NCCL)") {
  if (!nccl_built()) {
    std::cout << "SKIPPED: this build has no NCCL backend" << std::endl;
    std::exit(77);  // ctest's skip code: a case that cannot run is skipped, never passed
  }
  for (bool causal : {true, false}) check_gpu_ring(shape().heads(2).n(300).d(64).causal(causal), Backend::nccl, Layout::zigzag, 1);
}

TEST_CASE("ch06_variants ring --backend streams: checked run, timeline, bad input") {
  const auto r = testing_support::run_binary(CH06_BINARY, "ring --backend streams --ranks 4 --n 1000 --json");
  CHECK(r.exit_code == 0);
  CHECK(r.out.find("\"pass\": false") == std::string::npos);
  // --bench adds the one-device rows, checked like the ring's own.
  const auto b = testing_support::run_binary(CH06_BINARY, "ring --backend streams --ranks 2 --n 600 --no-decode --bench --json");
  CHECK(b.exit_code == 0);
  CHECK(b.out.find("one device: chapter 04's kernel") != std::string::npos);
  CHECK(b.out.find("\"pass\": false") == std::string::npos);
  const auto t = testing_support::run_binary(
      CH06_BINARY, "ring --backend streams --ranks 2 --n 512 --no-decode --timeline /tmp/ch06_ring_test_timeline.svg");
  CHECK(t.exit_code == 0);
  CHECK(testing_support::slurp("/tmp/ch06_ring_test_timeline.svg").find("<svg") != std::string::npos);
  const auto bad = testing_support::run_binary(CH06_BINARY, "ring --backend streams --d 32 --n 100");
  CHECK(bad.exit_code == 2);
  CHECK(bad.err_lines() == 1);
}
