// Chapter 05's main path against the fp64 reference: v1-v8 and the final kernels (the lab's
// steps have their own file, test_fa3_lab_gpu.cpp, built with TUTORIAL_LAB=ON). Skipped
// (exit code 77, which ctest reports as "skipped") without a device, and on a GPU that is
// not sm_90: every test case starts with require_hopper().
#include "ch05/fa3_checks.hpp"

using namespace attn;
using namespace attn::ch05;
using namespace ch05_checks;

TEST_CASE("hopper building blocks, one at a time") {
  require_hopper();
  const ProbeResult tma = probe_tma_swizzle();
  CHECK_MESSAGE(tma.max_err == 0, tma.what);
  const ProbeResult bf16 = probe_wgmma_bf16();
  CHECK_MESSAGE(bf16.max_err < 1e-3, bf16.what << ": max error " << bf16.max_err);
  const ProbeResult fp8 = probe_wgmma_fp8();
  CHECK_MESSAGE(fp8.max_err < 1e-2, fp8.what << ": max error " << fp8.max_err);
}

TEST_CASE("steps 1-7 (d = 128) at awkward shapes, bf16 and fp16") {
  require_hopper();
  for (Step s : {Step::v1_tma, Step::v2_wgmma, Step::v3_warp_specialized, Step::v4_pingpong, Step::v5_intra_overlap,
                 Step::v6_masked_first, Step::v7_persistent}) {
    awkward_shapes(s, 128, DType::bf16);
    check_step(s, shape().heads(2).n(200, 333).d(128).causal().dtype(DType::f16));
    check_step(s, shape().n(256).d(128).dtype(DType::f16), Dist::outliers);
  }
}

TEST_CASE("the fp8 preparation pass equals the CPU quantisation bit for bit") {
  require_hopper();
  for (const Problem p : {shape().heads(2, 1).n(130, 77).d(64).dtype(DType::bf16),
                          shape().batch(2).n(64, 200).d(128).causal().dtype(DType::f16),
                          shape().n(90, 33).d(256).dtype(DType::bf16)}) {
   CAPTURE(p.describe());
   const AttnInputs in = make_inputs(p, Dist::outliers, 5);
   const Fp8Inputs cpu = quantize_fp8(p, in);
   const Fp8Prepared gpu = fp8_prepare_gpu(p, in);
   REQUIRE(gpu.q8.size() == cpu.q8.size());
   std::size_t bad = 0;
   for (std::size_t i = 0; i < cpu.q8.size(); ++i) bad += gpu.q8[i] != e4m3_bits(cpu.q8[i]);
   for (std::size_t i = 0; i < cpu.k8.size(); ++i) bad += gpu.k8[i] != e4m3_bits(cpu.k8[i]);
   CHECK(bad == 0);
   CHECK(gpu.q_scale == cpu.q_scale);
   CHECK(gpu.k_scale == cpu.k_scale);
   CHECK(gpu.v_scale == cpu.v_scale);
   // V^T: channel c, position 32 s + p holds key 32 s + fp8_key_at(p) (0 past Nk).
   std::size_t bad_v = 0;
   for (int bh = 0; bh < p.batch * p.kv_heads; ++bh)
     for (int c = 0; c < p.d; ++c)
       for (int pos = 0; pos < gpu.nk_pad; ++pos) {
         const int key = 32 * (pos / 32) + fp8_key_at(pos % 32);
         const uint8_t want = key < p.nk ? e4m3_bits(cpu.v8[(std::size_t(bh) * p.nk + key) * p.d + c]) : 0;
         bad_v += gpu.vt8[(std::size_t(bh) * p.d + c) * gpu.nk_pad + pos] != want;
       }
   CHECK(bad_v == 0);
 }
}


TEST_CASE("steps 7, 8 and the final forward with more tiles than SMs (every block walks several)") {
  require_hopper();
  // 17 query tiles x 16 heads = 272 tiles, more than the 132 blocks of the persistent grid.
  for (Step s : {Step::v7_persistent, Step::v8_head_dims, Step::final_fwd}) {
    check_step(s, shape().batch(2).heads(8, 4).n(2100).d(128).causal().dtype(DType::bf16));
    check_step(s, shape().batch(2).heads(8).n(2100, 1900).d(128).dtype(DType::f16));
  }
  for (Step s : {Step::v8_head_dims, Step::final_fwd}) {
    check_step(s, shape().batch(2).heads(8).n(2100, 1900).d(64).dtype(DType::bf16));
    check_step(s, shape().batch(2).heads(8, 4).n(2100).d(64).causal().dtype(DType::bf16));
  }
  // The final kernel's d = 256 key block divides neither N nor the query tile.
  check_step(Step::final_fwd, shape().batch(2).heads(4).n(1100, 1250).d(256).dtype(DType::bf16));
  check_step(Step::final_fwd, shape().heads(4).n(700, 1000).d(256).causal().dtype(DType::f16));
}

TEST_CASE("steps 1, 8 and the final forward at every head dim, causal and not, bf16 and fp16") {
  require_hopper();
  for (Step s : {Step::v1_tma, Step::v8_head_dims, Step::final_fwd})
    for (int d : {64, 128, 256})
      for (DType t : {DType::bf16, DType::f16}) {
        CAPTURE(d);
        awkward_shapes(s, d, t);
      }
  for (int d : {64, 128, 256}) {
    CAPTURE(d);
    check_step(Step::final_fwd, shape().heads(2).n(500).d(d).causal().dtype(DType::bf16), Dist::outliers);
    check_step(Step::final_fwd, shape().heads(2).n(333, 777).d(d).dtype(DType::bf16), Dist::outliers);
  }
}

TEST_CASE("the final fp8 forward at every head dim against the plain FP8 computation") {
  require_hopper();
  const Step s = Step::final_fp8;
  for (int d : {64, 128, 256}) {
    CAPTURE(d);
    awkward_shapes(s, d, DType::bf16);
    check_step(s, shape().heads(2).n(300).d(d).causal().dtype(DType::f16), Dist::outliers);
    // More tiles than SMs (every block walks several), Nq != Nk, GQA.
    check_step(s, shape().batch(2).heads(8, 2).n(1100, 1300).d(d).causal().dtype(DType::bf16));
  }
  // The last key block past Nk at the wide FP8 blocks: Nk = 320 at d = 256 (blocks of 128),
  // Nk = 200 and 400 at d = 128 (blocks of 192, V^T in two boxes).
  check_step(s, shape().heads(2, 1).n(200, 320).d(256).dtype(DType::bf16));
  check_step(s, shape().heads(2, 1).n(150, 200).d(128).dtype(DType::bf16));
  check_step(s, shape().heads(2, 1).n(150, 400).d(128).causal().dtype(DType::bf16));
}

TEST_CASE("the final fp8 forward's causal rows on the grid (d = 128 and 256) at awkward causal shapes") {
  require_hopper();
  const Step s = Step::final_fp8;  // one block a tile, a head's tiles together (kGrid)
  for (int d : {128, 256}) {
    CAPTURE(d);
    for (DType t : {DType::bf16, DType::f16}) {
      check_step(s, shape().heads(2).n(100).d(d).causal().dtype(t));                  // N below one tile
      check_step(s, shape().batch(2).heads(4, 2).n(130, 67).d(d).causal().dtype(t));  // Nq > Nk: empty rows; GQA
      check_step(s, shape().heads(2, 1).n(67, 300).d(d).causal().dtype(t));           // Nq < Nk, bottom-right
      check_step(s, shape().heads(2).n(300, 40).d(d).causal().dtype(t));              // whole tiles see no key
    }
    check_step(s, shape().batch(2).heads(8, 4).n(2100).d(d).causal().dtype(DType::bf16));  // many tiles a head
    check_step(s, shape().heads(2).n(500).d(d).causal().dtype(DType::bf16), Dist::outliers);
    check_repeatable(s, shape().batch(2).heads(4, 2).n(1000, 1100).d(d).causal().dtype(DType::bf16));
  }
}

TEST_CASE("the final kernels' rows by sequence length: each side of the switch, at awkward shapes") {
  require_hopper();
  // final-fp8, d = 128 not causal: v12's row up to 1K keys, v27's above (blocks of 192, V^T in two boxes).
  for (int nk : {1024, 1025, 1100, 1300}) {
    CAPTURE(nk);
    check_step(Step::final_fp8, shape().heads(2, 1).n(150, nk).d(128).dtype(DType::bf16));
    check_step(Step::final_fp8, shape().batch(2).heads(4, 2).n(nk, nk).d(128).dtype(DType::f16), Dist::outliers);
  }
  // final-fp8, d = 256 causal (v29's row, one at every length): blocks of 128 around 2K keys.
  for (int nk : {2048, 2049, 2100}) {
    CAPTURE(nk);
    check_step(Step::final_fp8, shape().heads(2, 1).n(300, nk).d(256).causal().dtype(DType::bf16));
    check_step(Step::final_fp8, shape().heads(2).n(nk, nk).d(256).causal().dtype(DType::bf16), Dist::mean_shifted);
  }
  // final, d = 128, either mask: blocks of 128 below 8K keys (v31's grid when causal), of 176 from 8K on.
  for (int nk : {8191, 8192, 8300}) {
    CAPTURE(nk);
    check_step(Step::final_fwd, shape().heads(2, 1).n(100, nk).d(128).causal().dtype(DType::bf16));
    check_step(Step::final_fwd, shape().heads(2).n(300, nk).d(128).causal().dtype(DType::f16), Dist::outliers);
    check_step(Step::final_fwd, shape().heads(2, 1).n(130, nk).d(128).dtype(DType::bf16), Dist::mean_shifted);
    check_step(Step::final_fwd, shape().batch(2).heads(2).n(nk, nk).d(128).dtype(DType::f16), Dist::outliers);
  }
  check_repeatable(Step::final_fwd, shape().heads(2).n(600, 8300).d(128).causal().dtype(DType::bf16));
  check_repeatable(Step::final_fwd, shape().heads(2).n(600, 8300).d(128).dtype(DType::bf16));
  check_repeatable(Step::final_fwd, shape().heads(2).n(600, 1000).d(256).dtype(DType::bf16));
  check_repeatable(Step::final_fp8, shape().heads(2).n(600, 1000).d(128).dtype(DType::bf16));
  check_repeatable(Step::final_fp8, shape().heads(2).n(600, 2000).d(256).causal().dtype(DType::bf16));
}

TEST_CASE("every main-path step at the benchmark's causal shape (sampled rows)") {
  // B = 2, H = 16, N = 8192, d = 128: the shape of the README's causal row.
  require_hopper();
  const Problem p = shape().batch(2).heads(16).n(8192).d(128).causal().dtype(DType::bf16);
  const AttnInputs in = make_inputs(p, Dist::normal, 1);
  const ForwardOracle oracle(p, in, CheckPlan::sampled(p, 2e9));
  for (Step s : {Step::v1_tma, Step::v2_wgmma, Step::v5_intra_overlap, Step::v6_masked_first, Step::v7_persistent,
                 Step::v8_head_dims, Step::final_fwd}) {
    CAPTURE(step_name(s));
    const GpuForward g = fa3_forward_gpu(p, in, s, false);
    const CheckResult c = oracle.judge(g.o, &g.lse);
    CHECK_MESSAGE(c.pass(), c.failures());
  }
}

TEST_CASE("the final forward's tile scheduler starts afresh at every launch") {
  // The third of three launches of one prepared kernel, each with the outputs poisoned
  // first: a tile counter left past zero would leave tiles unwritten (NaN) or skip them.
  require_hopper();
  for (const Problem p : {shape().batch(2).heads(8, 4).n(2100).d(128).causal().dtype(DType::bf16),
                          shape().batch(2).heads(8).n(1500, 1700).d(64).dtype(DType::f16),
                          shape().batch(2).heads(8, 4).n(2100).d(64).causal().dtype(DType::bf16)}) {
    CAPTURE(p.describe());
    const AttnInputs in = make_inputs(p, Dist::normal, 9);
    const GpuForward g = fa3_forward_gpu(p, in, Step::final_fwd, false, 3);
    const CheckResult c = ForwardOracle(p, in, CheckPlan::full(p)).judge(g.o, &g.lse);
    CHECK_MESSAGE(c.pass(), c.failures());
  }
}

TEST_CASE("repeated runs give identical bits (no race between producer and consumers)") {
  require_hopper();
  const Problem p = shape().batch(2).heads(4, 2).n(1000, 1100).d(128).causal().dtype(DType::bf16);
  for (Step s : {Step::v3_warp_specialized, Step::v5_intra_overlap, Step::v6_masked_first, Step::v7_persistent,
                 Step::v8_head_dims, Step::final_fwd, Step::final_fp8})
    check_repeatable(s, p);
  for (int d : {64, 256}) {
    CAPTURE(d);
    check_repeatable(Step::final_fwd, shape().batch(2).heads(4, 2).n(1000, 1100).d(d).causal().dtype(DType::bf16));
    check_repeatable(Step::final_fp8, shape().batch(2).heads(4, 2).n(1000, 1100).d(d).causal().dtype(DType::bf16));
  }
}
