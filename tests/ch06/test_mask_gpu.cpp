// Chapter 06, masks on the GPU: the sm_80 forward, the sm_90a forward (Hopper only:
// elsewhere these tests exit 77, a ctest skip) and the backward, for every variant,
// against the fp64 reference at awkward shapes. Outputs are poisoned before each run.
#include <doctest/doctest.h>

#include <cmath>
#include <cstdlib>
#include <iostream>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "chapters/06_variants/masks/mask_gpu.hpp"
#include "chapters/06_variants/masks/mask_model.hpp"
#include "chapters/06_variants/masks/mask_spec.hpp"
#include "common/check.hpp"
#include "common/device.hpp"
#include "support/mask_specs.hpp"
#include "support/shapes.hpp"

using namespace attn;
using namespace attn::ch06;
using testing_support::composed_spec;
using testing_support::shape;

namespace {

MaskSpec spec_of(MaskKind k, const Problem& p, bool causal = false) {
  MaskSpec s;
  s.kind = k;
  s.causal = causal;
  s.left = 90, s.right = 20;
  s.chunk = 80;
  s.prefix = 70;
  s.sinks = 5;
  s.softcap = 2.0;
  if (k == MaskKind::sink) s.left = 70, s.right = 0;
  if (k == MaskKind::document && p.nq == p.nk) s.doc_lens = random_doc_lens(p.nq, std::min(6, p.nq), 3);
  s.stride = 24, s.block = 40, s.summary = 6, s.globals = 2, s.random = 2;  // the sparse patterns, off the tiles
  finalize_spec(s, p);
  return s;
}

/// Exits 77 (a ctest skip) unless this GPU runs `path`.
void require_path(GpuPath path) {
  std::string why;
  const auto dev = query_device(&why);
  REQUIRE(dev);
  const std::string no = mask_gpu_unsupported(shape().n(64).d(128), path, *dev);
  if (!no.empty()) {
    std::cout << "SKIPPED: " << gpu_path_name(path) << ": " << no << "\n";
    std::exit(77);
  }
}

struct Inputs {
  Problem p;
  TokenLayout L;
  AttnInputs in, lin;
};

Inputs inputs(const MaskSpec& s, const Problem& user, Dist dist) {
  Inputs r;
  r.p = masked_problem(user);
  r.L = layout_for(s, r.p);
  r.in = make_inputs(r.p, dist, 13, true);
  r.lin.q = to_layout(r.in.q, r.p.heads, r.p.nq, r.p.d, r.L.packed);
  r.lin.k = to_layout(r.in.k, r.p.kv_heads, r.p.nk, r.p.d, r.L.packed);
  r.lin.v = to_layout(r.in.v, r.p.kv_heads, r.p.nk, r.p.dv, r.L.packed);
  r.lin.dout = to_layout(r.in.dout, r.p.heads, r.p.nq, r.p.dv, r.L.packed);
  return r;
}

void check_forward(GpuPath path, const MaskSpec& s, const Problem& user, Dist dist = Dist::normal,
                   std::vector<GpuForwardOptions> runs = {GpuForwardOptions{}}) {
  CAPTURE(s.describe());
  CAPTURE(user.describe());
  const Inputs x = inputs(s, user, dist);
  const auto mod = reference_mod(s, x.p);
  const ForwardOracle oracle(x.p, x.in, CheckPlan::full(x.p), mod.get());
  for (const GpuForwardOptions& o : runs) {  // one reference, several kernels (or grids)
    CAPTURE(hopper_step_file(o.hopper_step));
    CAPTURE(o.ctas);
    const GpuMaskForward f = mask_forward_gpu(x.p, s, x.L, x.lin, path, false, o);
    const CheckResult c = oracle.judge(from_layout(f.o, x.p.heads, x.p.nq, x.p.dv, x.L.packed), &f.lse);
    CHECK_MESSAGE(c.pass(), c.failures());
  }
}

/// Every sm90a step, each with its grid (0: one block per SM), on one reference; and the
/// last step once more with every tile partial (--all-partial: the same output).
std::vector<GpuForwardOptions> every_hopper_step(int ctas = 0) {
  std::vector<GpuForwardOptions> v;
  for (int step = 0; step < kHopperSteps; ++step)
    if (hopper_step_built(step)) v.push_back({step, ctas, false});  // the lab's step with TUTORIAL_LAB
  v.push_back({kHopperSteps - 1, ctas, true});
  return v;
}

void check_backward(const MaskSpec& s, const Problem& user, Dist dist = Dist::normal, bool deterministic = false,
                    BwdKernel kernel = BwdKernel::sm80, bool sampled = false) {
  CAPTURE(s.describe());
  CAPTURE(user.describe());
  CAPTURE(deterministic);
  CAPTURE(bwd_kernel_name(kernel));
  const Inputs x = inputs(s, user, dist);
  const auto mod = reference_mod(s, x.p);
  const BackwardOracle oracle(x.p, x.in, sampled ? BackwardPlan::sampled(x.p, 2e9) : BackwardPlan::full(x.p), mod.get());
  // O and LSE from a forward that runs the problem: the sm80 one is bf16 at d = 128 only.
  const GpuPath fwd = kernel == BwdKernel::sm90a ? GpuPath::sm90a : GpuPath::sm80;
  const GpuMaskForward f = mask_forward_gpu(x.p, s, x.L, x.lin, fwd, false);
  const GpuMaskBackward g = mask_backward_gpu(x.p, s, x.L, x.lin, f.o, f.lse, false, deterministic, kernel);
  const CheckResult c = oracle.judge(from_layout(g.dq, x.p.heads, x.p.nq, x.p.d, x.L.packed),
                                     from_layout(g.dk, x.p.kv_heads, x.p.nk, x.p.d, x.L.packed),
                                     from_layout(g.dv, x.p.kv_heads, x.p.nk, x.p.dv, x.L.packed));
  CHECK_MESSAGE(c.pass(), c.failures());
  if (deterministic) {  // a second run gives the same bits (dK, dV never had atomics; dQ no longer has)
    const GpuMaskBackward g2 = mask_backward_gpu(x.p, s, x.L, x.lin, f.o, f.lse, false, true, kernel);
    CHECK(g2.dq == g.dq);
    CHECK(g2.dk == g.dk);
    CHECK(g2.dv == g.dv);
  }
}

/// Every variant at the awkward shapes: batches and GQA, N not a multiple of any tile,
/// N below one tile, Nq != Nk (causal family), mean-shifted and outlier inputs; in element type t.
template <class Check>
void every_variant(Check&& check, int d = 128, DType t = DType::bf16) {
  for (MaskKind k : all_mask_kinds()) {
    const bool doc = k == MaskKind::document;
    const Problem many = shape().batch(doc ? 1 : 2).heads(4, 2).n(200).d(d).dtype(t);
    check(spec_of(k, many), many, Dist::normal);
    const Problem tiny = shape().heads(2).n(50).d(d).dtype(t);
    check(spec_of(k, tiny), tiny, Dist::normal);
    const Problem shifted = shape().heads(2).n(190).d(d).dtype(t);
    check(spec_of(k, shifted, true), shifted, Dist::mean_shifted);
    check(spec_of(k, shifted, true), shifted, Dist::outliers);
    if (doc) continue;
    for (const Problem p : {Problem(shape().heads(4, 1).n(100, 300).d(d).dtype(t)),
                            Problem(shape().heads(2).n(300, 100).d(d).dtype(t))})
      check(spec_of(k, p, true), p, Dist::normal);
  }
  // The compositions: a sliding window on the learned sink (gpt-oss) and on softcap (Gemma 2),
  // at the same shapes, with a window inside a tile (0), across tiles (70) and past N (1000).
  // Softcap at window 0 is left to the CPU tests (test_masks.cpp): a row of one key has as its
  // LSE that key's capped score alone, and the kernels' tanh.approx.f32 (common/cuda/
  // fast_math.cuh, about 2^-11 relative) is then not averaged over a row: on an H100 it was
  // 1.4e-5 off against the LSE's floor of 7e-6 (64 fp32 ulps), every kernel alike.
  for (MaskKind k : {MaskKind::learned_sink, MaskKind::softcap})
    for (const int w : {0, 70, 1000}) {
      if (k == MaskKind::softcap && w == 0) continue;
      for (const Problem p : {Problem(shape().batch(2).heads(4, 2).n(200).d(d).dtype(t)),
                              Problem(shape().heads(2).n(50).d(d).dtype(t)),
                              Problem(shape().heads(4, 1).n(100, 300).d(d).dtype(t)),
                              Problem(shape().heads(2).n(300, 100).d(d).dtype(t))})
        check(composed_spec(k, p, w, 2.0), p, w == 70 ? Dist::mean_shifted : Dist::normal);
    }
}

/// The final sm90a forward on rows that see no key (Nq > Nk, causal, two batches, GQA), at
/// head dim d in element type t: O = 0 and LSE = -inf exactly, with one block per SM and two.
void check_final_empty_rows(int d, DType t) {
  CAPTURE(d);
  CAPTURE(dtype_name(t));
  const Problem e = masked_problem(shape().batch(2).heads(4, 2).n(300, 130).d(d).dtype(t));
  const MaskSpec c = spec_of(MaskKind::causal, e);
  const Inputs x = inputs(c, e, Dist::normal);
  for (const int ctas : {0, 2}) {
    CAPTURE(ctas);
    const GpuMaskForward f = mask_forward_gpu(x.p, c, x.L, x.lin, GpuPath::sm90a, false, {kHopperFinal, ctas, false});
    int bad = 0;
    for (int b = 0; b < e.batch; ++b)
      for (int h = 0; h < e.heads; ++h)
        for (int i = 0; i < e.nq - e.nk; ++i) {
          const float l = f.lse[e.lse_off(b, h) + i];
          bad += !(std::isinf(l) && l < 0);
          for (int k = 0; k < e.dv; ++k) bad += f.o[e.o_off(b, h) + std::size_t(i) * e.dv + k] != 0.f;
        }
    CHECK(bad == 0);
  }
}

}  // namespace

TEST_CASE("sm80 forward: every variant passes the fp64 reference at awkward shapes") {
  require_path(GpuPath::sm80);
  every_variant([](const MaskSpec& s, const Problem& p, Dist d) { check_forward(GpuPath::sm80, s, p, d); });
}

TEST_CASE("sm90a forward: every variant passes the fp64 reference at awkward shapes, in every step") {
  require_path(GpuPath::sm90a);
  every_variant(
      [](const MaskSpec& s, const Problem& p, Dist d) { check_forward(GpuPath::sm90a, s, p, d, every_hopper_step()); });
}

TEST_CASE("sm90a forward: a few thread blocks, each walking many tiles, in every step") {
  // At the shapes above every block gets one tile; here 2 or 3 blocks walk 16 to 64 tiles
  // each, so tile boundaries (v1's two Q buffers, v2's pipeline across tiles), tiles with
  // no kept block between tiles with work (Nq > Nk, causal), and the ring's phases running
  // on over many tiles are all exercised.
  require_path(GpuPath::sm90a);
  for (MaskKind k : all_mask_kinds()) {
    const bool doc = k == MaskKind::document;
    const Problem many = shape().batch(doc ? 1 : 2).heads(4, 2).n(doc ? 1000 : 400).d(128);
    for (const int ctas : {2, 3}) check_forward(GpuPath::sm90a, spec_of(k, many, true), many, Dist::normal, every_hopper_step(ctas));
    if (doc) continue;
    const Problem tall = shape().heads(4, 2).n(500, 200).d(128);  // rows 0-299 see no key: empty tiles
    check_forward(GpuPath::sm90a, spec_of(k, tall, true), tall, Dist::normal, every_hopper_step(2));
  }
}

TEST_CASE("final kernel: the sparse patterns masked from their rows (SparseRow), d = 64, 128 and 256, bf16 and fp16") {
  // every_variant's sparse sizes (24, 40) are not powers of two, so there the final kernel's rows fall back
  // to keep(). Here the sizes that take the SparseRow form (and a few that do not), with one
  // block per SM, two blocks walking every tile, and every visited tile partial (--all-partial:
  // the rows on tiles that are really full too).
  require_path(GpuPath::sm90a);
  std::string why;
  const auto dev = query_device(&why);
  REQUIRE(dev);
  for (const DType dt : {DType::bf16, DType::f16})
    for (const int hd : {64, 128, 256})
      CHECK(mask_gpu_unsupported(shape().n(64).d(hd).dtype(dt), GpuPath::sm90a, *dev, kHopperFinal).empty());
  auto sparse = [](MaskKind k, const Problem& p, int l, int c, int w, int g, int r) {
    MaskSpec s;
    s.kind = k;
    s.stride = s.block = l, s.summary = c, s.left = w, s.globals = g, s.random = r, s.seed = 7;
    finalize_spec(s, p);
    return s;
  };
  for (const DType dt : {DType::bf16, DType::f16})
    for (const int hd : {64, 128, 256})
      for (const auto& [nq, nk] : {std::pair{300, 300}, std::pair{200, 333}, std::pair{333, 200}}) {
        const Problem p = shape().heads(2, 1).n(nq, nk).d(hd).dtype(dt);
        CAPTURE(hd);
        CAPTURE(int(dt));
        std::vector<MaskSpec> specs;
        for (int l : {1, 16, 64, 128, 24}) specs.push_back(sparse(MaskKind::strided, p, l, 0, 0, 0, 0));
        for (auto [l, c] : {std::pair{16, 16}, std::pair{32, 0}, std::pair{64, 8}, std::pair{128, 16}, std::pair{40, 6}})
          specs.push_back(sparse(MaskKind::fixed, p, l, c, 0, 0, 0));
        for (auto [w, g] : {std::pair{0, 0}, std::pair{64, 1}, std::pair{100, 3}})
          specs.push_back(sparse(MaskKind::longformer, p, 64, 0, w, g, 0));
        for (auto [b, g, r] : {std::tuple{64, 2, 3}, std::tuple{128, 1, 2}, std::tuple{32, 0, 4}, std::tuple{16, 2, 3}})
          specs.push_back(sparse(MaskKind::bigbird, p, b, 0, 0, g, r));
        for (const MaskSpec& s : specs)
          check_forward(GpuPath::sm90a, s, p, Dist::normal,
                        {GpuForwardOptions{kHopperFinal, 0, false}, GpuForwardOptions{kHopperFinal, 2, false},
                         GpuForwardOptions{kHopperFinal, 0, true}});
      }
}

TEST_CASE("backward: every variant passes the fp64 reference at awkward shapes") {
  require_path(GpuPath::backward);
  every_variant([](const MaskSpec& s, const Problem& p, Dist d) { check_backward(s, p, d); });
}

TEST_CASE("backward, deterministic dQ: every variant passes the fp64 reference, and two runs agree bit for bit") {
  require_path(GpuPath::backward);
  every_variant([](const MaskSpec& s, const Problem& p, Dist d) { check_backward(s, p, d, true); });
}

TEST_CASE("backward: the learnable sink's gradient on the GPU matches the CPU model's, sm80 and sm90a") {
  require_path(GpuPath::backward);
  std::string why;
  const auto dev = query_device(&why);
  REQUIRE(dev);
  // The model's dsink is checked against a finite difference of the fp64 reference
  // (test_masks.cpp); here the GPU's, from its own bf16 O and LSE, against it. The sm90a
  // backward where this GPU runs it (Hopper), at d = 64 and 128.
  for (const auto& [kernel, hd] : {std::pair{BwdKernel::sm80, 128}, std::pair{BwdKernel::sm90a, 64}, std::pair{BwdKernel::sm90a, 128}})
  for (const Problem user : {Problem(shape().batch(2).heads(4, 2).n(200).d(hd)), Problem(shape().heads(2).n(300, 130).d(hd))})
    for (const bool causal : {false, true}) {
      const MaskSpec s = spec_of(MaskKind::learned_sink, user, causal);
      if (!mask_backward_unsupported(user, s, kernel, *dev).empty()) continue;
      CAPTURE(bwd_kernel_name(kernel));
      CAPTURE(s.describe());
      CAPTURE(user.describe());
      const Inputs x = inputs(s, user, Dist::normal);
      const BlockMap map = build_block_map(s, x.p, kModelBr, kModelBc);
      const MaskForwardResult mf = mask_forward_model(x.p, s, x.L, x.lin, map, 224 * 1024);
      const MaskBackwardResult mb = mask_backward_model(x.p, s, x.L, x.lin, mf.o, mf.lse, map, 224 * 1024);
      const GpuPath fwd = kernel == BwdKernel::sm90a ? GpuPath::sm90a : GpuPath::sm80;
      const GpuMaskForward f = mask_forward_gpu(x.p, s, x.L, x.lin, fwd, false);
      const GpuMaskBackward g = mask_backward_gpu(x.p, s, x.L, x.lin, f.o, f.lse, false, false, kernel);
      const GpuMaskBackward gd = mask_backward_gpu(x.p, s, x.L, x.lin, f.o, f.lse, false, true, kernel);
      REQUIRE(g.dsink.size() == std::size_t(x.p.heads));
      REQUIRE(mb.dsink.size() == std::size_t(x.p.heads));
      for (int h = 0; h < x.p.heads; ++h) {
        // The scale of the sum: sum_i |e^(sink - LSE_i) D_i| over the model's rows.
        double scale = 0;
        for (int b = 0; b < x.p.batch; ++b)
          for (int i = 0; i < x.p.nq; ++i) {
            double d = 0;
            for (int c = 0; c < x.p.dv; ++c)
              d += double(x.in.dout[x.p.o_off(b, h) + std::size_t(i) * x.p.dv + c]) *
                   mf.o[x.p.o_off(b, h) + std::size_t(i) * x.p.dv + c];
            scale += std::exp(double(s.sink_logits[h]) - mf.lse[x.p.lse_off(b, h) + i]) * std::abs(d);
          }
        CAPTURE(h);
        CAPTURE(mb.dsink[h]);
        CAPTURE(scale);
        CHECK(std::isfinite(g.dsink[h]));
        CHECK(std::abs(g.dsink[h] - mb.dsink[h]) <= 0.01 * scale + 1e-6);
        CHECK(scale > 1e-3);
        CHECK(gd.dsink[h] == g.dsink[h]);  // a fixed-order sum, whatever the dQ path
      }
    }
}

/// Exits 77 (a ctest skip) unless this GPU runs the sm90a masked backward (hopper_backward.cu).
void require_sm90a_backward() {
  std::string why;
  const auto dev = query_device(&why);
  REQUIRE(dev);
  const Problem p = shape().n(64).d(128);
  const std::string no = mask_backward_unsupported(p, spec_of(MaskKind::causal, p), BwdKernel::sm90a, *dev);
  if (!no.empty()) {
    std::cout << "SKIPPED: sm90a backward: " << no << "\n";
    std::exit(77);
  }
}

TEST_CASE("sm90a backward: every variant passes the fp64 reference at awkward shapes, d = 64 and 128, bf16 and fp16, "
          "both modes; two deterministic runs agree bit for bit") {
  require_sm90a_backward();
  std::string why;
  const auto dev = query_device(&why);
  REQUIRE(dev);
  for (const int hd : {64, 128})
    for (const DType t : {DType::bf16, DType::f16}) {
      CAPTURE(hd);
      CAPTURE(dtype_name(t));
      every_variant(
          [&](const MaskSpec& s, const Problem& p, Dist d) {
            if (s.kind == MaskKind::document) {  // packed rows: the sm80 backward's, and the kernel says so
              CHECK_FALSE(mask_backward_unsupported(p, s, BwdKernel::sm90a, *dev).empty());
              return;
            }
            check_backward(s, p, d, false, BwdKernel::sm90a);
            check_backward(s, p, d, true, BwdKernel::sm90a);
          },
          hd, t);
    }
  // d = 256 and fp32 are refused with a reason, never run.
  const Problem p256 = shape().n(64).d(256), p32 = shape().n(64).d(128).dtype(DType::f32);
  CHECK_FALSE(mask_backward_unsupported(p256, spec_of(MaskKind::causal, p256), BwdKernel::sm90a, *dev).empty());
  CHECK_FALSE(mask_backward_unsupported(p32, spec_of(MaskKind::causal, p32), BwdKernel::sm90a, *dev).empty());
}

TEST_CASE("sm90a backward: more thread blocks than the GPU holds at once, deterministic, every walk shape") {
  require_sm90a_backward();
  // 2 x 4 KV heads x 32 key blocks = 256 thread blocks, more than an H100's or H200's SMs hold
  // at once (one a SM): a block waits only for blocks started before it, or this hangs. Window,
  // causal, sparse (steps skipped inside a walk) and dense; GQA 2:1. Sampled fp64 checks.
  for (const int hd : {64, 128})
    for (MaskKind k : {MaskKind::causal, MaskKind::window, MaskKind::bigbird, MaskKind::alibi}) {
      CAPTURE(hd);
      const Problem p = shape().batch(2).heads(8, 4).n(4096).d(hd);
      check_backward(spec_of(k, p, k == MaskKind::causal), p, Dist::normal, true, BwdKernel::sm90a, true);
    }
}

TEST_CASE("GPU edge cases: window 0, a window wider than the sequence, 1000 documents, empty rows") {
  require_path(GpuPath::sm80);
  std::string why;
  const bool hopper = mask_gpu_unsupported(shape().n(64).d(128), GpuPath::sm90a, *query_device(&why)).empty();
  const Problem p = shape().heads(2).n(200, 230).d(128);
  MaskSpec w0 = spec_of(MaskKind::window, p);
  w0.left = w0.right = 0;
  MaskSpec wide = w0;
  wide.left = wide.right = 1 << 20;
  const Problem packed = shape().heads(2, 1).n(1200).d(128);
  MaskSpec docs;
  docs.kind = MaskKind::document;
  docs.causal = true;
  docs.doc_lens = random_doc_lens(1200, 1000, 5);
  finalize_spec(docs, packed);
  for (const auto& [s, prob] : {std::pair{w0, p}, std::pair{wide, p}, std::pair{docs, packed}}) {
    check_forward(GpuPath::sm80, s, prob);
    if (hopper) check_forward(GpuPath::sm90a, s, prob, Dist::normal, every_hopper_step());
    if (hopper) check_forward(GpuPath::sm90a, s, prob, Dist::normal, every_hopper_step(1));  // one block: every tile
    check_backward(s, prob);
    check_backward(s, prob, Dist::normal, true);
  }
  // Empty rows (Nq > Nk, causal): O = 0, LSE = -inf, dQ = 0 exactly.
  const Problem e = masked_problem(shape().heads(2).n(300, 130).d(128));
  const MaskSpec c = spec_of(MaskKind::causal, e);
  const Inputs x = inputs(c, e, Dist::normal);
  const GpuMaskForward f = mask_forward_gpu(x.p, c, x.L, x.lin, GpuPath::sm80, false);
  const GpuMaskBackward g = mask_backward_gpu(x.p, c, x.L, x.lin, f.o, f.lse, false);
  const GpuMaskBackward gd = mask_backward_gpu(x.p, c, x.L, x.lin, f.o, f.lse, false, true);
  int bad = 0;
  for (int h = 0; h < e.heads; ++h)
    for (int i = 0; i < e.nq - e.nk; ++i) {
      const float l = f.lse[e.lse_off(0, h) + i];
      bad += !(std::isinf(l) && l < 0);
      for (int k = 0; k < e.d; ++k) {
        bad += f.o[e.o_off(0, h) + std::size_t(i) * e.dv + k] != 0.f;
        bad += g.dq[e.q_off(0, h) + std::size_t(i) * e.d + k] != 0.f;
        bad += gd.dq[e.q_off(0, h) + std::size_t(i) * e.d + k] != 0.f;
      }
    }
  CHECK(bad == 0);
}

TEST_CASE("final sm90a forward (steps/final.cu): the default kernel passes every variant, and empty rows are exact") {
  require_path(GpuPath::sm90a);
  REQUIRE(GpuForwardOptions{}.hopper_step == kHopperFinal);
  CHECK(std::string(hopper_step_file(kHopperFinal)) == "steps/final.cu");
  // Every variant at the awkward shapes (N off the tile, N below one tile, Nq != Nk, batches, GQA),
  // with one block per SM and with two blocks walking every tile.
  every_variant([](const MaskSpec& s, const Problem& p, Dist d) {
    check_forward(GpuPath::sm90a, s, p, d, {GpuForwardOptions{}, GpuForwardOptions{kHopperFinal, 2, false}});
  });
  check_final_empty_rows(128, DType::bf16);
}

TEST_CASE("final sm90a forward at d = 64 and 256: every variant at the awkward shapes, and many tiles a block") {
  require_path(GpuPath::sm90a);
  std::string why;
  const auto dev = query_device(&why);
  REQUIRE(dev);
  // The final kernel has d = 64, 128 and 256; the steps before it, the sm80 forward and the
  // backward d = 128 only, and say so rather than run.
  CHECK(mask_gpu_unsupported(shape().n(64).d(64), GpuPath::sm90a, *dev, kHopperFinal).empty());
  CHECK(mask_gpu_unsupported(shape().n(64).d(128), GpuPath::sm90a, *dev, kHopperFinal).empty());
  CHECK(mask_gpu_unsupported(shape().n(64).d(256), GpuPath::sm90a, *dev, kHopperFinal).empty());
  CHECK_FALSE(mask_gpu_unsupported(shape().n(64).d(256), GpuPath::sm90a, *dev, 4).empty());
  CHECK_FALSE(mask_gpu_unsupported(shape().n(64).d(32), GpuPath::sm90a, *dev, kHopperFinal).empty());
  CHECK_FALSE(mask_gpu_unsupported(shape().n(64).d(64), GpuPath::sm90a, *dev, 4).empty());
  CHECK_FALSE(mask_gpu_unsupported(shape().n(64).d(64), GpuPath::sm80, *dev).empty());
  CHECK_FALSE(mask_gpu_unsupported(shape().n(64).d(64), GpuPath::backward, *dev).empty());
  for (const int hd : {64, 256}) {
    CAPTURE(hd);
    every_variant(
        [](const MaskSpec& s, const Problem& p, Dist d) {
          check_forward(GpuPath::sm90a, s, p, d, {GpuForwardOptions{}, GpuForwardOptions{kHopperFinal, 2, false}});
        },
        hd);
    // Two or three blocks walking 16 to 64 tiles each: the ring's phases (four stages at
    // d = 64) and the Q buffers' (one at d = 256) run on across tile boundaries, and tiles
    // with no kept block sit between tiles with work.
    for (MaskKind k : all_mask_kinds()) {
      const bool doc = k == MaskKind::document;
      const Problem many = shape().batch(doc ? 1 : 2).heads(4, 2).n(doc ? 1000 : 400).d(hd);
      for (const int ctas : {2, 3})
        check_forward(GpuPath::sm90a, spec_of(k, many, true), many, Dist::normal,
                      {GpuForwardOptions{kHopperFinal, ctas, false}});
      if (doc) continue;
      const Problem tall = shape().heads(4, 2).n(500, 200).d(hd);
      check_forward(GpuPath::sm90a, spec_of(k, tall, true), tall, Dist::normal, {GpuForwardOptions{kHopperFinal, 2, false}});
    }
  }
}

TEST_CASE("final sm90a forward in fp16: every variant at the awkward shapes at d = 64, 128 and 256, and many tiles a block") {
  require_path(GpuPath::sm90a);
  std::string why;
  const auto dev = query_device(&why);
  REQUIRE(dev);
  // fp16 is the final kernel's alone (steps/final.cu's kernel, instantiated in final_fp16.cu):
  // the steps before it, the sm80 forward and the backward are bf16 only and say so rather than run.
  for (const int hd : {64, 128, 256})
    CHECK(mask_gpu_unsupported(shape().n(64).d(hd).dtype(DType::f16), GpuPath::sm90a, *dev, kHopperFinal).empty());
  CHECK_FALSE(mask_gpu_unsupported(shape().n(64).d(128).dtype(DType::f16), GpuPath::sm90a, *dev, 4).empty());
  CHECK_FALSE(mask_gpu_unsupported(shape().n(64).d(128).dtype(DType::f16), GpuPath::sm90a, *dev, 0).empty());
  CHECK_FALSE(mask_gpu_unsupported(shape().n(64).d(128).dtype(DType::f16), GpuPath::sm80, *dev).empty());
  CHECK_FALSE(mask_gpu_unsupported(shape().n(64).d(128).dtype(DType::f16), GpuPath::backward, *dev).empty());
  CHECK_FALSE(mask_gpu_unsupported(shape().n(64).d(128).dtype(DType::f32), GpuPath::sm90a, *dev, kHopperFinal).empty());
  for (const int hd : {64, 128, 256}) {
    CAPTURE(hd);
    every_variant(
        [](const MaskSpec& s, const Problem& p, Dist d) {
          REQUIRE(p.dtype == DType::f16);
          check_forward(GpuPath::sm90a, s, p, d, {GpuForwardOptions{}, GpuForwardOptions{kHopperFinal, 2, false}});
        },
        hd, DType::f16);
    // Three blocks walking many tiles each (the ring's and the Q buffers' phases across tiles,
    // empty tiles between tiles with work), and rows that see no key.
    for (MaskKind k : all_mask_kinds()) {
      const bool doc = k == MaskKind::document;
      const Problem many = shape().batch(doc ? 1 : 2).heads(4, 2).n(doc ? 1000 : 400).d(hd).dtype(DType::f16);
      check_forward(GpuPath::sm90a, spec_of(k, many, true), many, Dist::normal, {GpuForwardOptions{kHopperFinal, 3, false}});
      if (doc) continue;
      const Problem tall = shape().heads(4, 2).n(500, 200).d(hd).dtype(DType::f16);
      check_forward(GpuPath::sm90a, spec_of(k, tall, true), tall, Dist::normal, {GpuForwardOptions{kHopperFinal, 2, false}});
    }
    check_final_empty_rows(hd, DType::f16);
    // Window 0 (one key a row) and 1000 documents in 1200 tokens (most of length 1), with one
    // block walking every tile.
    const Problem p = shape().heads(2).n(200, 230).d(hd).dtype(DType::f16);
    MaskSpec w0 = spec_of(MaskKind::window, p);
    w0.left = w0.right = 0;
    const Problem packed = shape().heads(2, 1).n(1200).d(hd).dtype(DType::f16);
    MaskSpec docs;
    docs.kind = MaskKind::document;
    docs.causal = true;
    docs.doc_lens = random_doc_lens(1200, 1000, 5);
    finalize_spec(docs, packed);
    for (const auto& [s, prob] : {std::pair{w0, p}, std::pair{docs, packed}})
      check_forward(GpuPath::sm90a, s, prob, Dist::normal, {GpuForwardOptions{}, GpuForwardOptions{kHopperFinal, 1, false}});
  }
}
