// Chapter 06 (gqa_mla): the cache arithmetic of real models, and the packed GQA model
// against the fp64 reference with its counted K/V bytes.
#include <doctest/doctest.h>

#include <cmath>
#include <string>

#include "chapters/06_variants/gqa_mla/cache_table.hpp"
#include "chapters/06_variants/gqa_mla/grouped_model.hpp"
#include "common/check.hpp"
#include "support/shapes.hpp"

using namespace attn;
using namespace attn::ch06;
using testing_support::shape;

namespace {

const ModelConfig& model(const std::string& name) {
  for (const ModelConfig& m : model_configs())
    if (m.name == name) return m;
  FAIL("no model " << name);
  return model_configs().front();
}

/// Runs the model on p and judges O and the LSE with the acceptance rule.
CheckResult run_checked(const Problem& p, const GroupedOptions& o, Dist dist = Dist::normal, GroupedResult* out = nullptr) {
  const AttnInputs in = make_inputs(p, dist, 7);
  const ForwardOracle oracle(p, in, CheckPlan::full(p));
  GroupedResult r = grouped_forward_model(p, in, o);
  const CheckResult c = oracle.judge(r.o, &r.lse);
  if (out) *out = std::move(r);
  return c;
}

}  // namespace

TEST_CASE("cache table: bytes per token and layer of the six models, from their configs") {
  CHECK(model_configs().size() == 6);
  // Llama-3.1-8B: 8 KV heads of 128: 2 x 8 x 128 x 2 B = 4 KB; MHA would be 32 heads: 16 KB.
  const ModelConfig& l8 = model("Llama-3.1-8B");
  CHECK(2 * cache_elems_per_token(l8) == 4096);
  CHECK(2 * mha_elems_per_token(l8) == 16384);
  // GQA caches Hkv / Hq of MHA (here 1/4), not 1/N.
  for (const ModelConfig& m : model_configs())
    if (m.kind == AttnKind::gqa) CHECK(cache_elems_per_token(m) / mha_elems_per_token(m) == doctest::Approx(double(m.kv_heads) / m.heads));
  CHECK(2 * cache_elems_per_token(model("Llama-3.1-70B")) == 4096);
  CHECK(2 * cache_elems_per_token(model("Qwen2.5-7B")) == 2048);
  CHECK(2 * cache_elems_per_token(model("Gemma-2-9B")) == 8192);
  CHECK(model("Llama-3.1-70B").layers == 80);
  CHECK(model("Gemma-2-9B").head_dim == 256);
  // DeepSeek-V3: the latent c (512) and k_rope (64): 1152 B per token and layer.
  const ModelConfig& ds = model("DeepSeek-V3");
  CHECK(2 * cache_elems_per_token(ds) == 1152);
  CHECK(mha_elems_per_token(ds) / cache_elems_per_token(ds) == doctest::Approx(40960.0 / 576));
  // Against DeepSeek-V2's MHA (2 x 128 x 128 = 32,768) the saving is ~57x, not ~32x,
  // and 576 elements equal GQA with 2.25 groups of 2 x 128.
  CHECK(32768.0 / cache_elems_per_token(ds) == doctest::Approx(56.9).epsilon(0.01));
  CHECK(cache_elems_per_token(ds) / (2 * 128) == doctest::Approx(2.25));
}

TEST_CASE("cache table: decode intensity is 4 N H d FLOPs over the cache (not 2 N H d)") {
  ModelConfig mha = model("Llama-3.1-8B");
  mha.kv_heads = mha.heads;  // the same model with full MHA
  // bf16 MHA: 4 N H d FLOPs over 2 N H d elements of 2 bytes: 1 FLOP per byte, not 0.5.
  CHECK(decode_flops(mha, 1000) / decode_bytes(mha, 1000) == doctest::Approx(1.0));
  CHECK(decode_flops(mha, 1000) == doctest::Approx(4.0 * 1000 * 32 * 128));
  // GQA: about Hq / Hkv.
  const ModelConfig& l8 = model("Llama-3.1-8B");
  CHECK(decode_flops(l8, 1) / decode_bytes(l8, 1) == doctest::Approx(4.0));
  // MLA absorbed, H = 128: 2 x 128 x (576 + 512) FLOPs per 1152 bytes.
  const ModelConfig& ds = model("DeepSeek-V3");
  CHECK(decode_flops(ds, 1) / decode_bytes(ds, 1) == doctest::Approx(2.0 * 128 * 1088 / 1152));
  const std::string t = cache_table_text();
  for (const ModelConfig& m : model_configs()) CHECK(t.find(m.name) != std::string::npos);
}

TEST_CASE("packed GQA model: G in {1, 2, 4, 8} and MQA, Nq in {1, 4, 16, 64, 128}, against fp64") {
  for (int g : {1, 2, 4, 8, 16}) {
    const int hkv = g == 16 ? 1 : 2;  // g = 16 with one KV head: MQA
    for (int nq : {1, 4, 16, 64, 128}) {
      const Problem p = shape().heads(hkv * g, hkv).n(nq, 200).d(64);
      for (bool pack : {true, false}) {
        GroupedOptions o;
        o.pack = pack;
        o.n_tile = 64;
        CAPTURE(g);
        CAPTURE(nq);
        CAPTURE(pack);
        CHECK(run_checked(p, o).pass());
      }
    }
  }
}

TEST_CASE("packed GQA model: Nq = 4096 (prefill), where packing changes nothing") {
  const Problem p = shape().heads(4, 2).n(4096, 70).d(32);
  GroupedOptions pk, up;
  up.pack = false;
  pk.n_tile = up.n_tile = 64;
  GroupedResult a, b;
  CHECK(run_checked(p, pk, Dist::normal, &a).pass());
  CHECK(run_checked(p, up, Dist::normal, &b).pass());
  CHECK(a.kv_bytes == b.kv_bytes);
}

TEST_CASE("packed GQA model: awkward shapes (G Nq off the tile, Nk = 1, Nk off the block, causal Nq != Nk)") {
  struct Case { Problem p; int splits; Dist dist; };
  const Case cases[] = {
      {shape().heads(10, 2).n(3, 100).d(32), 1, Dist::normal},               // G = 5, 15 rows per group
      {shape().heads(6, 2).n(50, 1).d(32), 1, Dist::mean_shifted},           // Nk = 1
      {shape().batch(2).heads(8, 2).n(7, 131).d(64).causal(), 1, Dist::outliers},  // causal, bottom-right
      {shape().heads(12, 3).n(45, 300).d(32).causal(), 3, Dist::mean_shifted},     // tiles span heads, split-K
      {shape().heads(4, 4).n(129, 129).d(32).causal(), 2, Dist::normal},          // square causal, MHA
      {shape().heads(8, 1).n(1, 77).d(128).dv(64), 4, Dist::normal},             // d != dv, MQA, decode
  };
  for (const Case& c : cases) {
    for (bool pack : {true, false}) {
      GroupedOptions o;
      o.pack = pack;
      o.m_tile = 16;
      o.n_tile = 32;
      o.splits = c.splits;
      CAPTURE(c.p.describe());
      CAPTURE(pack);
      CHECK(run_checked(c.p, o, c.dist).pass());
    }
  }
}

TEST_CASE("packed GQA model: counted K/V bytes equal the closed form, G times fewer when G Nq <= Mt") {
  for (int nq : {1, 4, 16, 33, 128, 256}) {
    const Problem p = shape().heads(8, 2).n(nq, 150).d(32);
    const AttnInputs in = make_inputs(p, Dist::normal, 3);
    GroupedOptions pk, up;
    up.pack = false;
    pk.m_tile = up.m_tile = 128;
    const GroupedResult a = grouped_forward_model(p, in, pk), b = grouped_forward_model(p, in, up);
    CAPTURE(nq);
    CHECK(a.kv_bytes == grouped_kv_bytes(p, pk));
    CHECK(b.kv_bytes == grouped_kv_bytes(p, up));
    CHECK(a.tiles == grouped_tiles(p, true, 128));
    const double ratio = b.kv_bytes / a.kv_bytes;
    if (4 * nq <= 128) CHECK(ratio == doctest::Approx(4.0));
    if (nq % 128 == 0) CHECK(ratio == doctest::Approx(1.0));
    CHECK(ratio >= 1.0);
  }
}

TEST_CASE("exercise ch06.4: packed rows map to head hk G + m / Nq at position m % Nq") {
  // 3 query rows of 4 heads in one 16-row tile: every head and position must come out right.
  const Problem p = shape().batch(2).heads(8, 2).n(3, 40).d(32);
  GroupedOptions o;
  o.m_tile = 16;
  o.n_tile = 16;
  CHECK(run_checked(p, o).pass());
  const Problem c = shape().heads(4, 1).n(5, 9).d(32).causal();
  CHECK(run_checked(c, o).pass());
}

TEST_CASE("exercise ch06.6: split-K ranges merged with ⊕ give the unsplit answer") {
  const Problem p = shape().heads(4, 1).n(2, 300).d(64);
  for (int splits : {2, 3, 5}) {
    GroupedOptions o;
    o.n_tile = 32;
    o.splits = splits;
    CAPTURE(splits);
    CHECK(run_checked(p, o, Dist::mean_shifted).pass());
  }
  // A split whose keys are all masked (causal) contributes the identity (-inf, 0).
  GroupedOptions o;
  o.n_tile = 16;
  o.splits = 4;
  CHECK(run_checked(shape().heads(2, 1).n(40, 64).d(32).causal(), o).pass());
}
