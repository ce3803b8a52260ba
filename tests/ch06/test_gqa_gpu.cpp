// Chapter 06 (gqa_mla) on the GPU: the packed Hopper forward and the chapter 04-derived
// packed forward against the fp64 reference, packed and unpacked, G in {1, 2, 4, 8} and
// MQA, Nq in {1, 4, 16, 64, 128, 4096}, d != dv (Hopper).
#include <cstdlib>
#include <iostream>
#include <doctest/doctest.h>

#include <string>

#include "chapters/06_variants/gqa_mla/gqa_mla_gpu.hpp"
#include "common/check.hpp"
#include "common/errors.hpp"
#include "support/shapes.hpp"

using namespace attn;
using namespace attn::ch06;
using testing_support::shape;

namespace {

/// Skips (does not pass) on a GPU without the sm_90a kernels.
/// True on a GPU that runs the sm_90a kernels; anywhere else this test case's process ends
/// with ctest's skip code (77): a case that cannot run is skipped, never passed.
bool hopper_or_skip() {
  std::string why;
  if (hopper_ready(&why)) return true;
  std::cout << "SKIPPED: " << why << std::endl;
  std::exit(77);
}

void check_packed(const Problem& p, Dist dist = Dist::normal) {
  const AttnInputs in = make_inputs(p, dist, 11);
  const ForwardOracle oracle(p, in, CheckPlan::sampled(p, 2e9));
  for (bool pack : {true, false}) {
    const GpuResult g = packed_forward_gpu(p, in, pack, false);
    const CheckResult c = oracle.judge(g.o, &g.lse);
    CAPTURE(p.describe());
    CAPTURE(pack);
    CAPTURE(c.failures());
    CHECK(c.pass());
  }
}

/// The chapter 04-derived packed forward (ampere_packed.cu), packed and unpacked.
void check_sm80(const Problem& p, Dist dist = Dist::normal) {
  const AttnInputs in = make_inputs(p, dist, 13);
  const ForwardOracle oracle(p, in, CheckPlan::sampled(p, 2e9));
  for (bool pack : {true, false}) {
    const GpuResult g = packed_forward_sm80_gpu(p, in, pack, false);
    const CheckResult c = oracle.judge(g.o, &g.lse);
    CAPTURE(p.describe());
    CAPTURE(pack);
    CAPTURE(c.failures());
    CHECK(c.pass());
  }
}

}  // namespace

TEST_CASE("packed sm_80 forward (chapter 04's v9 packed): G in {1, 2, 4, 8} and MQA, Nq in {1, 4, 16, 64, 128, 4096}") {
  for (int g : {1, 2, 4, 8, 32}) {
    const int hkv = g == 32 ? 1 : 2;
    for (int nq : {1, 4, 16, 64, 128, 4096}) {
      if (nq == 4096 && g > 4) continue;  // the fp64 check's budget
      check_sm80(shape().heads(hkv * g, hkv).n(nq, nq == 4096 ? 4096 : 1000).d(128));
    }
  }
}

TEST_CASE("packed sm_80 forward: awkward shapes, causal tiles that straddle heads, d = 64 and 256, fp16") {
  check_sm80(shape().heads(8, 2).n(3, 1).d(128));
  check_sm80(shape().batch(2).heads(12, 2).n(5, 301).d(128), Dist::mean_shifted);  // G = 6: 30 rows per group
  check_sm80(shape().heads(8, 1).n(37, 200).d(128).causal(), Dist::outliers);      // tiles straddle heads
  check_sm80(shape().batch(3).heads(4, 2).n(200, 200).d(128).causal());             // square causal
  check_sm80(shape().heads(6, 3).n(130, 1000).d(128).causal());                     // bottom-right, G Nq = 260
  check_sm80(shape().heads(16, 16).n(100, 1).d(128).causal());                      // Nq > Nk: empty rows
  check_sm80(shape().heads(8, 2).n(7, 333).d(64).causal());                         // d = 64 (Bc = 128)
  check_sm80(shape().heads(4, 1).n(9, 129).d(256));                                 // d = 256 (8 warps)
  check_sm80(shape().heads(8, 2).n(16, 500).d(128).dtype(DType::f16).causal());
  const Problem bad = shape().heads(2, 1).n(10, 10).d(192).dv(128);
  CHECK_THROWS_AS(packed_forward_sm80_gpu(bad, make_inputs(bad, Dist::normal, 1), true, false), UsageError);
}

TEST_CASE("packed forward: G in {1, 2, 4, 8} and MQA, Nq in {1, 4, 16, 64, 128, 4096}") {
  if (!hopper_or_skip()) return;
  for (int g : {1, 2, 4, 8, 32}) {
    const int hkv = g == 32 ? 1 : 2;
    for (int nq : {1, 4, 16, 64, 128, 4096}) {
      if (nq == 4096 && g > 4) continue;  // the fp64 check's budget; G = 8 at 4096 is in the sweep
      check_packed(shape().heads(hkv * g, hkv).n(nq, nq == 4096 ? 4096 : 1000).d(128));
    }
  }
}

TEST_CASE("packed forward: awkward shapes (Nk = 1, Nk off the block, G Nq off the tile, causal Nq != Nk)") {
  if (!hopper_or_skip()) return;
  check_packed(shape().heads(8, 2).n(3, 1).d(128));
  check_packed(shape().batch(2).heads(12, 2).n(5, 301).d(128), Dist::mean_shifted);  // G = 6: 30 rows per group
  check_packed(shape().heads(8, 1).n(37, 200).d(128).causal(), Dist::outliers);      // tiles straddle heads
  check_packed(shape().batch(3).heads(4, 2).n(200, 200).d(128).causal());             // square causal
  check_packed(shape().heads(6, 3).n(130, 1000).d(128).causal());                     // bottom-right, G Nq = 260
  check_packed(shape().heads(16, 16).n(100, 1).d(128).causal());                      // Nq > Nk: empty rows
}

TEST_CASE("packed forward: causal tiles walked by position (Nq a multiple of the tile, G > 1)") {
  if (!hopper_or_skip()) return;
  // TileWalk's position order: packed tile m is position block m % (Nq / 128) of head m / (Nq / 128).
  check_packed(shape().batch(2).heads(8, 2).n(256, 256).d(128).causal());             // G = 4, square
  check_packed(shape().heads(6, 2).n(384, 1000).d(128).causal(), Dist::mean_shifted);  // G = 3, bottom-right
  check_packed(shape().batch(3).heads(16, 2).n(128, 128).d(128).causal());            // G = 8, one block a head
}

TEST_CASE("packed forward: d = 192, dv = 128 (MLA's decompressed prefill)") {
  if (!hopper_or_skip()) return;
  check_packed(shape().heads(4, 4).n(200, 333).d(192).dv(128));
  check_packed(shape().batch(2).heads(3, 3).n(129, 129).d(192).dv(128).causal(), Dist::mean_shifted);
  check_packed(shape().heads(8, 2).n(1, 70).d(192).dv(128));
}

TEST_CASE("packed forward: unsupported shapes are a UsageError, not a wrong answer") {
  if (!hopper_or_skip()) return;
  const Problem p = shape().heads(2, 1).n(10, 10).d(64);
  CHECK_THROWS_AS(packed_forward_gpu(p, make_inputs(p, Dist::normal, 1), true, false), UsageError);
}
