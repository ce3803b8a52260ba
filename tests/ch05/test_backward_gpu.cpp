// Chapter 05's backward against the fp64 backward. Skipped (exit code 77, which ctest
// reports as "skipped") without a device, on a GPU that is not sm_90, or in a build
// without the sm_90a kernels: every test case starts with require_hopper().
#include <doctest/doctest.h>

#include <cstdlib>
#include <iostream>
#include <string>

#include "chapters/05_fa3_hopper/backward_gpu.hpp"
#include "chapters/05_fa3_hopper/fa3_gpu.hpp"
#include "common/check.hpp"
#include "common/errors.hpp"
#include "support/shapes.hpp"

using namespace attn;
using namespace attn::ch05;

namespace {

void require_hopper() {
  std::string why;
  if (hopper_ready(&why)) return;
  std::cout << "SKIPPED: " << why << std::endl;
  std::exit(77);
}

using testing_support::shape;

void check_backward(BwdStep s, const Problem& p, bool det, Dist dist = Dist::normal) {
  CAPTURE(std::string(bwd_step_name(s)));
  CAPTURE(p.describe());
  CAPTURE(det);
  CAPTURE(dist_name(dist));
  const AttnInputs in = make_inputs(p, dist, 23, true);
  const BackwardOracle oracle(p, in, BackwardPlan::full(p));
  const GpuBackward g = fa3_backward_gpu(p, in, s, det, false);
  const CheckResult c = oracle.judge(g.dq, g.dk, g.dv);
  CHECK_MESSAGE(c.pass(), c.failures());
}

/// The awkward shapes every backward step must pass, at head dim d.
void awkward_shapes(BwdStep s, int d, DType t, bool det) {
  check_backward(s, shape().n(1).d(d).dtype(t), det);                                      // N = 1
  check_backward(s, shape().heads(2).n(100).d(d).causal().dtype(t), det);                  // N below one tile
  check_backward(s, shape().batch(2).heads(4, 2).n(130, 67).d(d).causal().dtype(t), det);  // Nq > Nk: empty rows; GQA
  check_backward(s, shape().heads(2, 1).n(67, 300).d(d).causal().dtype(t), det);           // Nq < Nk, causal bottom-right
  check_backward(s, shape().heads(2).n(300, 40).d(d).causal().dtype(t), det);              // whole query blocks see no key
  check_backward(s, shape().heads(3).n(257).d(d).dtype(t), det, Dist::mean_shifted);       // not a multiple of the tile
  check_backward(s, shape().heads(4, 1).n(300, 520).d(d).dtype(t), det);                   // MQA, Nq != Nk, no mask
}

}  // namespace

TEST_CASE("backward b1 (wgmma) at awkward shapes, d = 64 and 128, bf16 and fp16") {
  require_hopper();
  for (int d : {64, 128}) {
    CAPTURE(d);
    awkward_shapes(BwdStep::b1_wgmma, d, DType::bf16, false);
    check_backward(BwdStep::b1_wgmma, shape().heads(2).n(200, 333).d(d).causal().dtype(DType::f16), false);
    check_backward(BwdStep::b1_wgmma, shape().n(256).d(d).dtype(DType::f16), false, Dist::outliers);
  }
}

TEST_CASE("backward b2 (warp-specialised) at awkward shapes, d = 64 and 128, bf16 and fp16") {
  require_hopper();
  for (int d : {64, 128}) {
    CAPTURE(d);
    awkward_shapes(BwdStep::b2_warp_specialized, d, DType::bf16, false);
    check_backward(BwdStep::b2_warp_specialized, shape().heads(2).n(200, 333).d(d).causal().dtype(DType::f16), false);
    check_backward(BwdStep::b2_warp_specialized, shape().n(256).d(d).dtype(DType::f16), false, Dist::outliers);
  }
}

#if TUTORIAL_LAB  // a lab step (steps/lab/): built with TUTORIAL_LAB=ON
TEST_CASE("backward b3 (dQ in fragment order) at awkward shapes, d = 64 and 128, bf16 and fp16") {
  require_hopper();
  for (int d : {64, 128}) {
    CAPTURE(d);
    awkward_shapes(BwdStep::b3_dq_fragment_order, d, DType::bf16, false);
    check_backward(BwdStep::b3_dq_fragment_order, shape().heads(2).n(200, 333).d(d).causal().dtype(DType::f16), false);
    check_backward(BwdStep::b3_dq_fragment_order, shape().n(256).d(d).dtype(DType::f16), false, Dist::outliers);
  }
}
#endif

#if TUTORIAL_LAB  // a lab step (steps/lab/): built with TUTORIAL_LAB=ON
TEST_CASE("backward b4 (no spills) at awkward shapes, d = 64 and 128, bf16 and fp16") {
  require_hopper();
  for (int d : {64, 128}) {
    CAPTURE(d);
    awkward_shapes(BwdStep::b4_no_spills, d, DType::bf16, false);
    check_backward(BwdStep::b4_no_spills, shape().heads(2).n(200, 333).d(d).causal().dtype(DType::f16), false);
    check_backward(BwdStep::b4_no_spills, shape().n(256).d(d).dtype(DType::f16), false, Dist::outliers);
  }
}
#endif

TEST_CASE("backward b5 (dQ writer warp) at awkward shapes, d = 64 and 128, bf16 and fp16") {
  require_hopper();
  for (int d : {64, 128}) {
    CAPTURE(d);
    awkward_shapes(BwdStep::b5_dq_writer, d, DType::bf16, false);
    check_backward(BwdStep::b5_dq_writer, shape().heads(2).n(200, 333).d(d).causal().dtype(DType::f16), false);
    check_backward(BwdStep::b5_dq_writer, shape().n(256).d(d).dtype(DType::f16), false, Dist::outliers);
  }
}

TEST_CASE("backward b6 (deterministic walk) at awkward shapes, both modes") {
  require_hopper();
  for (int d : {64, 128}) {
    CAPTURE(d);
    awkward_shapes(BwdStep::b6_deterministic_walk, d, DType::bf16, false);
    awkward_shapes(BwdStep::b6_deterministic_walk, d, DType::f16, true);
  }
}

#if TUTORIAL_LAB  // a lab step (steps/lab/): built with TUTORIAL_LAB=ON
TEST_CASE("backward b7 (dQ split by keys) at awkward shapes, both modes") {
  require_hopper();
  for (int d : {64, 128}) {
    CAPTURE(d);
    awkward_shapes(BwdStep::b7_dq_split_by_keys, d, DType::bf16, false);
    awkward_shapes(BwdStep::b7_dq_split_by_keys, d, DType::f16, true);
  }
}
#endif

#if TUTORIAL_LAB  // a lab step (steps/lab/): built with TUTORIAL_LAB=ON
TEST_CASE("backward b8 (named-barrier release) at awkward shapes, both modes") {
  require_hopper();
  for (int d : {64, 128}) {
    CAPTURE(d);
    awkward_shapes(BwdStep::b8_named_barrier_release, d, DType::bf16, false);
    awkward_shapes(BwdStep::b8_named_barrier_release, d, DType::f16, true);
  }
}
#endif

#if TUTORIAL_LAB  // a lab step (steps/lab/): built with TUTORIAL_LAB=ON
TEST_CASE("backward b9 (two dS^T buffers) at awkward shapes, both modes") {
  require_hopper();
  for (int d : {64, 128}) {
    CAPTURE(d);
    awkward_shapes(BwdStep::b9_two_ds_buffers, d, DType::bf16, false);
    awkward_shapes(BwdStep::b9_two_ds_buffers, d, DType::f16, true);
  }
}
#endif

TEST_CASE("backward b10 (the consumers a dQ apart) at awkward shapes, both modes") {
  require_hopper();
  for (int d : {64, 128}) {
    CAPTURE(d);
    awkward_shapes(BwdStep::b10_consumer_offset, d, DType::bf16, false);
    awkward_shapes(BwdStep::b10_consumer_offset, d, DType::f16, true);
    // one step per key block, and two: consumer 0's late dQ is all it multiplies, then the last too
    check_backward(BwdStep::b10_consumer_offset, shape().heads(2).n(64, 128).d(d).dtype(DType::bf16), false);
    check_backward(BwdStep::b10_consumer_offset, shape().heads(2).n(128, 200).d(d).causal().dtype(DType::bf16), true);
  }
}

TEST_CASE("backward b11 (longest walks first) at awkward shapes, both modes") {
  require_hopper();
  for (int d : {64, 128}) {
    CAPTURE(d);
    awkward_shapes(BwdStep::b11_longest_walks_first, d, DType::bf16, false);
    awkward_shapes(BwdStep::b11_longest_walks_first, d, DType::f16, true);
    // the causal grid is (KV head, key block): several heads and key blocks in both modes, GQA
    check_backward(BwdStep::b11_longest_walks_first, shape().batch(2).heads(6, 3).n(700, 900).d(d).causal(), false);
    check_backward(BwdStep::b11_longest_walks_first, shape().batch(2).heads(6, 3).n(700, 900).d(d).causal(), true);
  }
}

#if TUTORIAL_LAB  // a lab step (steps/lab/): built with TUTORIAL_LAB=ON
TEST_CASE("backward b12 (pairs of query blocks, d = 64) at awkward shapes, both modes") {
  require_hopper();
  awkward_shapes(BwdStep::b12_pairs_of_query_blocks, 64, DType::bf16, false);
  awkward_shapes(BwdStep::b12_pairs_of_query_blocks, 64, DType::f16, true);
  // an odd and an even number of 64-row blocks (the padding block of the last pair, and none);
  // one pair per key block, and several; GQA over two batches
  for (int nq : {64, 192, 256, 448})
    for (bool det : {false, true}) {
      check_backward(BwdStep::b12_pairs_of_query_blocks, shape().heads(2).n(nq, 300).d(64).causal(), det);
      check_backward(BwdStep::b12_pairs_of_query_blocks, shape().batch(2).heads(4, 2).n(nq, 130).d(64), det);
    }
  // not built at d = 128: refused as bad input, never run wrong
  CHECK_FALSE(bwd_step_supports(BwdStep::b12_pairs_of_query_blocks, shape().n(128).d(128)));
  CHECK(bwd_step_supports(BwdStep::b12_pairs_of_query_blocks, shape().n(128).d(64)));
  const Problem p128 = shape().n(128).d(128);
  CHECK_THROWS_AS(fa3_backward_gpu(p128, make_inputs(p128, Dist::normal, 1, true), BwdStep::b12_pairs_of_query_blocks,
                                   false, false),
                  UsageError);
}
#endif

#if TUTORIAL_LAB  // a lab step (steps/lab/): built with TUTORIAL_LAB=ON
TEST_CASE("backward b13 (80 queries a step, d = 128) at awkward shapes, both modes") {
  require_hopper();
  awkward_shapes(BwdStep::b13_eighty_queries, 128, DType::bf16, false);
  awkward_shapes(BwdStep::b13_eighty_queries, 128, DType::f16, true);
  // N a multiple of 80 and not, of 64 and not (160, 192, 240, 400); one step per key block and
  // several (the single dQ buffer reused); causal walks starting inside an 80-row block; GQA
  for (int nq : {80, 160, 192, 400})
    for (bool det : {false, true}) {
      check_backward(BwdStep::b13_eighty_queries, shape().heads(2).n(nq, 300).d(128).causal(), det);
      check_backward(BwdStep::b13_eighty_queries, shape().batch(2).heads(4, 2).n(nq, 130).d(128), det);
    }
  CHECK_FALSE(bwd_step_supports(BwdStep::b13_eighty_queries, shape().n(128).d(64)));
  const Problem p64 = shape().n(128).d(64);
  CHECK_THROWS_AS(fa3_backward_gpu(p64, make_inputs(p64, Dist::normal, 1, true), BwdStep::b13_eighty_queries, false, false),
                  UsageError);
}
#endif

#if TUTORIAL_LAB  // a lab step (steps/lab/): built with TUTORIAL_LAB=ON
TEST_CASE("backward b14 (dS stored by queries, d = 128) at awkward shapes, both modes") {
  require_hopper();
  awkward_shapes(BwdStep::b14_ds_by_queries, 128, DType::bf16, false);
  awkward_shapes(BwdStep::b14_ds_by_queries, 128, DType::f16, true);
  for (int nq : {80, 192, 400})
    for (bool det : {false, true}) {
      check_backward(BwdStep::b14_ds_by_queries, shape().heads(2).n(nq, 300).d(128).causal(), det);
      check_backward(BwdStep::b14_ds_by_queries, shape().batch(2).heads(4, 2).n(nq, 130).d(128), det);
    }
}
#endif

#if TUTORIAL_LAB  // a lab step (steps/lab/): built with TUTORIAL_LAB=ON
TEST_CASE("backward b15 (the next S^T ahead of dQ, d = 128) at awkward shapes, both modes") {
  require_hopper();
  awkward_shapes(BwdStep::b15_scores_ahead, 128, DType::bf16, false);
  awkward_shapes(BwdStep::b15_scores_ahead, 128, DType::f16, true);
  // one step per key block (its S^T issued before the loop, and the last step's extra one),
  // two, several; GQA over two batches (a walk goes on into the next query head of its group)
  for (int nq : {80, 160, 192, 400})
    for (bool det : {false, true}) {
      check_backward(BwdStep::b15_scores_ahead, shape().heads(2).n(nq, 300).d(128).causal(), det);
      check_backward(BwdStep::b15_scores_ahead, shape().batch(2).heads(4, 2).n(nq, 130).d(128), det);
    }
  CHECK_FALSE(bwd_step_supports(BwdStep::b15_scores_ahead, shape().n(128).d(64)));
}
#endif

#if TUTORIAL_LAB  // lab steps (steps/lab/): built with TUTORIAL_LAB=ON
// b16 and b17 keep the final backward's table (d = 64: pairs of 64-row blocks; d = 128: blocks
// of 80): the shapes of its test, an odd and an even number of blocks, tails, GQA over batches.
void final_table_shapes(BwdStep s) {
  for (int d : {64, 128}) {
    CAPTURE(d);
    CHECK(bwd_step_supports(s, shape().n(128).d(d)));
    awkward_shapes(s, d, DType::bf16, false);
    awkward_shapes(s, d, DType::f16, true);
  }
  for (bool det : {false, true}) {
    for (int nq : {64, 192, 256, 448}) {
      check_backward(s, shape().heads(2).n(nq, 300).d(64).causal(), det);
      check_backward(s, shape().batch(2).heads(4, 2).n(nq, 130).d(64), det);
    }
    for (int nq : {80, 160, 192, 400}) {
      check_backward(s, shape().heads(2).n(nq, 300).d(128).causal(), det);
      check_backward(s, shape().batch(2).heads(4, 2).n(nq, 130).d(128), det);
    }
    check_backward(s, shape().batch(2).heads(6, 3).n(700, 900).d(128).causal(), det, Dist::outliers);
  }
}
TEST_CASE("backward b16 (shared loads and stores, d = 64 and 128) at awkward shapes, both modes") {
  require_hopper();
  final_table_shapes(BwdStep::b16_shared_state_space);
}
TEST_CASE("backward b17 (FA4's order of the products, d = 64 and 128) at awkward shapes, both modes") {
  require_hopper();
  final_table_shapes(BwdStep::b17_fa4_order);
}
#endif

TEST_CASE("backward, deterministic mode: correct at awkward shapes") {
  require_hopper();
  for (BwdStep s : kAllBwdSteps)
    for (int d : {64, 128}) {
      CAPTURE(d);
      if (!bwd_step_supports(s, shape().d(d))) continue;
      awkward_shapes(s, d, DType::bf16, true);
    }
}

TEST_CASE("backward, deterministic mode: bitwise repeatable, and dK and dV in either mode") {
  require_hopper();
  // Many key blocks add into every dQ tile (Nk = 1500: 12 blocks), several heads per group.
  for (const Problem p : {shape().batch(2).heads(8, 2).n(1000, 1500).d(128).causal().dtype(DType::bf16),
                          shape().heads(4).n(1536).d(64).dtype(DType::f16),
                          shape().heads(4, 2).n(1100, 1536).d(64).causal().dtype(DType::bf16)}) {
    CAPTURE(p.describe());
    const AttnInputs in = make_inputs(p, Dist::normal, 5, true);
    for (BwdStep s : kAllBwdSteps) {
      if (!bwd_step_supports(s, p)) continue;
      CAPTURE(std::string(bwd_step_name(s)));
      const GpuBackward a = fa3_backward_gpu(p, in, s, true, false), b = fa3_backward_gpu(p, in, s, true, false);
      CHECK(a.dq == b.dq);
      CHECK(a.dk == b.dk);
      CHECK(a.dv == b.dv);
      // dK and dV are summed on chip in a fixed order in both modes, the same order up to b5
      // (from b6 on the deterministic mode walks the query blocks the other way round).
      if (s < BwdStep::b6_deterministic_walk) {
        const GpuBackward c = fa3_backward_gpu(p, in, s, false, false);
        CHECK(c.dk == a.dk);
        CHECK(c.dv == a.dv);
      }
    }
  }
}

TEST_CASE("backward at the benchmark's shape (sampled KV groups)") {
  // B = 2, H = 16, N = 8192, d = 128: the README's shape, causal and not.
  require_hopper();
  for (bool causal : {true, false}) {
    Problem p = shape().batch(2).heads(16).n(8192).d(128).dtype(DType::bf16);
    p.causal = causal;
    const AttnInputs in = make_inputs(p, Dist::normal, 1, true);
    const BackwardOracle oracle(p, in, BackwardPlan::sampled(p, 2e9));
    for (BwdStep s : kAllBwdSteps) {
      if (!bwd_step_supports(s, p)) continue;  // b12: d = 64 only
      CAPTURE(std::string(bwd_step_name(s)));
      CAPTURE(causal);
      const GpuBackward g = fa3_backward_gpu(p, in, s, false, false);
      const CheckResult c = oracle.judge(g.dq, g.dk, g.dv);
      CHECK_MESSAGE(c.pass(), c.failures());
    }
  }
}

TEST_CASE("the final backward at awkward shapes, d = 64 and 128, bf16 and fp16, both modes") {
  require_hopper();
  for (int d : {64, 128}) {
    CAPTURE(d);
    awkward_shapes(BwdStep::final_bwd, d, DType::bf16, false);
    awkward_shapes(BwdStep::final_bwd, d, DType::f16, true);
  }
  // d = 64 takes query blocks in pairs: an odd and an even number of 64-row blocks.
  // d = 128 takes blocks of 80: N a multiple of 80 and not, of 64 and not. GQA over batches.
  for (bool det : {false, true}) {
    for (int nq : {64, 192, 256, 448}) {
      check_backward(BwdStep::final_bwd, shape().heads(2).n(nq, 300).d(64).causal(), det);
      check_backward(BwdStep::final_bwd, shape().batch(2).heads(4, 2).n(nq, 130).d(64), det);
    }
    for (int nq : {80, 160, 192, 400}) {
      check_backward(BwdStep::final_bwd, shape().heads(2).n(nq, 300).d(128).causal(), det);
      check_backward(BwdStep::final_bwd, shape().batch(2).heads(4, 2).n(nq, 130).d(128), det);
    }
    check_backward(BwdStep::final_bwd, shape().batch(2).heads(6, 3).n(700, 900).d(128).causal(), det, Dist::outliers);
  }
}

// What scripts run under compute-sanitizer, one step per case: tails, empty rows, GQA,
// causal, both modes.
void sanitizer_shape(BwdStep s, int d = 128) {
  require_hopper();
  for (bool det : {false, true}) check_backward(s, shape().heads(2, 1).n(200, 333).d(d).causal(), det);
}
TEST_CASE("backward sanitizer shape b1") { sanitizer_shape(BwdStep::b1_wgmma); }
TEST_CASE("backward sanitizer shape b2") { sanitizer_shape(BwdStep::b2_warp_specialized); }
#if TUTORIAL_LAB  // a lab step (steps/lab/): built with TUTORIAL_LAB=ON
TEST_CASE("backward sanitizer shape b3") { sanitizer_shape(BwdStep::b3_dq_fragment_order); }
#endif
#if TUTORIAL_LAB  // a lab step (steps/lab/): built with TUTORIAL_LAB=ON
TEST_CASE("backward sanitizer shape b4") { sanitizer_shape(BwdStep::b4_no_spills); }
#endif
TEST_CASE("backward sanitizer shape b5") { sanitizer_shape(BwdStep::b5_dq_writer); }
TEST_CASE("backward sanitizer shape b6") { sanitizer_shape(BwdStep::b6_deterministic_walk); }
#if TUTORIAL_LAB  // a lab step (steps/lab/): built with TUTORIAL_LAB=ON
TEST_CASE("backward sanitizer shape b7") { sanitizer_shape(BwdStep::b7_dq_split_by_keys); }
#endif
#if TUTORIAL_LAB  // a lab step (steps/lab/): built with TUTORIAL_LAB=ON
TEST_CASE("backward sanitizer shape b8") { sanitizer_shape(BwdStep::b8_named_barrier_release); }
#endif
#if TUTORIAL_LAB  // a lab step (steps/lab/): built with TUTORIAL_LAB=ON
TEST_CASE("backward sanitizer shape b9") { sanitizer_shape(BwdStep::b9_two_ds_buffers); }
#endif
TEST_CASE("backward sanitizer shape b10") { sanitizer_shape(BwdStep::b10_consumer_offset); }
TEST_CASE("backward sanitizer shape b11") { sanitizer_shape(BwdStep::b11_longest_walks_first); }
#if TUTORIAL_LAB  // a lab step (steps/lab/): built with TUTORIAL_LAB=ON
TEST_CASE("backward sanitizer shape b12") { sanitizer_shape(BwdStep::b12_pairs_of_query_blocks, 64); }
#endif
#if TUTORIAL_LAB  // a lab step (steps/lab/): built with TUTORIAL_LAB=ON
TEST_CASE("backward sanitizer shape b13") { sanitizer_shape(BwdStep::b13_eighty_queries); }
#endif
#if TUTORIAL_LAB  // a lab step (steps/lab/): built with TUTORIAL_LAB=ON
TEST_CASE("backward sanitizer shape b14") { sanitizer_shape(BwdStep::b14_ds_by_queries); }
#endif
#if TUTORIAL_LAB  // a lab step (steps/lab/): built with TUTORIAL_LAB=ON
TEST_CASE("backward sanitizer shape b15") { sanitizer_shape(BwdStep::b15_scores_ahead); }
#endif
#if TUTORIAL_LAB  // a lab step (steps/lab/): built with TUTORIAL_LAB=ON
TEST_CASE("backward sanitizer shape b16, d = 64") { sanitizer_shape(BwdStep::b16_shared_state_space, 64); }
TEST_CASE("backward sanitizer shape b16, d = 128") { sanitizer_shape(BwdStep::b16_shared_state_space, 128); }
TEST_CASE("backward sanitizer shape b17, d = 64") { sanitizer_shape(BwdStep::b17_fa4_order, 64); }
TEST_CASE("backward sanitizer shape b17, d = 128") { sanitizer_shape(BwdStep::b17_fa4_order, 128); }
#endif
TEST_CASE("backward sanitizer shape final, d = 64") { sanitizer_shape(BwdStep::final_bwd, 64); }
TEST_CASE("backward sanitizer shape final, d = 128") { sanitizer_shape(BwdStep::final_bwd, 128); }
