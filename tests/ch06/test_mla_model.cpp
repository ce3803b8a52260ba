// Chapter 06 (gqa_mla): MLA on the CPU. RoPE, why it is decoupled, the absorb identity
// in fp64, and both bf16 forms against the fp64 reference at awkward shapes.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <utility>
#include <vector>

#include "chapters/06_variants/gqa_mla/grouped_model.hpp"
#include "chapters/06_variants/gqa_mla/mla_model.hpp"
#include "common/check.hpp"
#include "common/compare.hpp"

using namespace attn;
using namespace attn::ch06;

namespace {

double dot(const double* a, const double* b, int n) {
  double s = 0;
  for (int i = 0; i < n; ++i) s += a[i] * b[i];
  return s;
}

std::vector<double> random_vec(int n, uint64_t seed) {
  Rng r(seed);
  std::vector<double> v(n);
  for (double& x : v) x = r.normal();
  return v;
}

MlaShape mla(int b, int h, int nq, int nk, long pos0 = 1000) {
  MlaShape s;
  s.batch = b, s.heads = h, s.nq = nq, s.nk = nk, s.pos0 = pos0;
  return s;
}

/// The absorbed form on the CPU model: q_c, packed MQA over the latent cache, o_c W_UV.
std::vector<float> absorb_form(const MlaShape& s, const MlaInputs& in, int splits, int m_tile = 64) {
  GroupedOptions o;
  o.pack = true;
  o.m_tile = m_tile;
  o.n_tile = 64;
  o.splits = splits;
  o.v_in_k = true;
  const GroupedResult r = grouped_forward_model(s.absorbed(), absorb(s, in), o);
  return project_out(s, r.o, in);
}

/// The decompressed form on the CPU model: K, V materialised in bf16, then attention.
std::vector<float> decompress_form(const MlaShape& s, const MlaInputs& in) {
  GroupedOptions o;
  o.pack = false;
  const GroupedResult r = grouped_forward_model(s.decompressed(), decompress(s, in), o);
  return r.o;
}

struct Judged {
  Verdict absorb, decompress;
  ErrorStats abs_err, dec_err, naive;
};

Judged judge_both(const MlaShape& s, Dist dist, int splits = 3) {
  const MlaInputs in = make_mla_inputs(s, dist, 5);
  const CheckPlan plan = CheckPlan::full(s.output());
  const CheckedRows<double> ref = mla_reference(s, in, plan, MlaRefPath::definition);
  Judged j;
  j.naive = mla_naive_error(s, in, plan, ref);
  const std::vector<float> a = absorb_form(s, in, splits), d = decompress_form(s, in);
  j.abs_err = compare_rows(a.data(), ref);
  j.dec_err = compare_rows(d.data(), ref);
  j.absorb = accept(j.abs_err, j.naive, DType::bf16, count_unwritten(a.data(), a.size()));
  j.decompress = accept(j.dec_err, j.naive, DType::bf16, count_unwritten(d.data(), d.size()));
  return j;
}

}  // namespace

TEST_CASE("RoPE: a rotation (norm kept) whose dot products see only relative positions") {
  const std::vector<double> x0 = random_vec(64, 1), y0 = random_vec(64, 2);
  for (long a : {0L, 5L, 1000L, 65536L})
    for (long b : {0L, 3L, 1007L, 131072L}) {
      std::vector<double> x = x0, y = y0, y_rel = y0;
      rope_rotate(x.data(), 64, a);
      rope_rotate(y.data(), 64, b);
      rope_rotate(y_rel.data(), 64, b - a);
      CHECK(dot(x.data(), x.data(), 64) == doctest::Approx(dot(x0.data(), x0.data(), 64)).epsilon(1e-12));
      // (R_a x) . (R_b y) = x . (R_{b-a} y)
      CHECK(dot(x.data(), y.data(), 64) == doctest::Approx(dot(x0.data(), y_rel.data(), 64)).epsilon(1e-9));
    }
  // and it does rotate: position 1 is not position 0
  std::vector<double> x = x0;
  rope_rotate(x.data(), 64, 1);
  CHECK(std::abs(x[0] - x0[0]) + std::abs(x[1] - x0[1]) > 1e-3);
}

TEST_CASE("RoPE forbids absorbing W_UK into a rotated key: the decoupled rope part is why") {
  // A toy head: latent dim 16, nope dim 8. Had RoPE rotated k_nope = W^T c, the score
  // (R_i q) . (R_t W^T c_t) = q^T R_{t-i} W^T c_t needs a different q_c for every key t.
  const int dc = 16, dn = 8;
  const std::vector<double> w = random_vec(dc * dn, 3), q = random_vec(dn, 4);
  const long qpos = 50;
  auto k_nope = [&](const std::vector<double>& c, long pos, bool rotate) {
    std::vector<double> k(dn, 0.0);
    for (int r = 0; r < dc; ++r)
      for (int j = 0; j < dn; ++j) k[j] += c[r] * w[r * dn + j];
    if (rotate) rope_rotate(k.data(), dn, pos);
    return k;
  };
  // q_c built to be exact for the key at t0 = 10: W R_{t0}^T (R_i q).
  auto absorbed_query = [&](long t0, bool rotate) {
    std::vector<double> qr = q, qc(dc, 0.0);
    if (rotate) {
      rope_rotate(qr.data(), dn, qpos);
      rope_rotate(qr.data(), dn, -t0);  // R_{t0}^T = R_{-t0}
    }
    for (int r = 0; r < dc; ++r) qc[r] = dot(&w[r * dn], qr.data(), dn);
    return qc;
  };
  for (bool rotate : {true, false}) {
    const std::vector<double> qc = absorbed_query(10, rotate);
    double worst = 0;
    for (long t : {10L, 11L, 30L, 49L}) {
      const std::vector<double> c = random_vec(dc, 100 + t);
      std::vector<double> qi = q;
      if (rotate) rope_rotate(qi.data(), dn, qpos);
      const double exact = dot(qi.data(), k_nope(c, t, rotate).data(), dn);
      const double absorbed = dot(qc.data(), c.data(), dc);
      if (t == 10) CHECK(absorbed == doctest::Approx(exact).epsilon(1e-9));  // exact at the key it was built for
      worst = std::max(worst, std::abs(absorbed - exact) / (1e-9 + std::abs(exact)));
    }
    if (rotate) CHECK(worst > 1e-2);   // ... and wrong for every other key position
    else CHECK(worst < 1e-9);          // without RoPE one q_c serves every key
  }
}

TEST_CASE("absorb identity in fp64: both reference paths agree, positions that make RoPE matter") {
  for (const MlaShape& s : {mla(2, 3, 1, 67), mla(1, 5, 3, 130, 100000), mla(1, 2, 1, 1, 0), mla(2, 16, 2, 65, 7)}) {
    const MlaInputs in = make_mla_inputs(s, Dist::normal, 9);
    const CheckPlan plan = CheckPlan::full(s.output());
    const CheckedRows<double> a = mla_reference(s, in, plan, MlaRefPath::definition);
    const CheckedRows<double> b = mla_reference(s, in, plan, MlaRefPath::absorbed);
    double worst = 0, scale = 0;
    for (std::size_t k = 0; k < a.values.size(); ++k) {
      worst = std::max(worst, std::abs(a.values[k] - b.values[k]));
      scale = std::max(scale, std::abs(a.values[k]));
    }
    CAPTURE(s.describe());
    CHECK(worst <= 1e-12 * std::max(1.0, scale));
    CHECK(scale > 0.1);  // a real signal, not zeros
  }
}

TEST_CASE("MLA forms against the fp64 reference: decode, MTP, Nk = 1, H off the tile, long positions") {
  struct Case { MlaShape s; Dist dist; };
  const Case cases[] = {
      {mla(2, 16, 1, 300), Dist::normal},              // DeepSeek-V3 decode, 16 heads (TP = 8)
      {mla(1, 3, 1, 1), Dist::normal},                 // Nk = 1, H = 3 (not a multiple of any tile)
      {mla(3, 5, 2, 67, 100000), Dist::mean_shifted},  // two new tokens (MTP), causal, far positions
      {mla(1, 20, 3, 129, 0), Dist::outliers},         // 60 packed rows, Nk one past a block
      {mla(1, 70, 1, 40), Dist::normal},               // H = 70: two 64-row tiles, the second 6 rows
  };
  for (const Case& c : cases) {
    const Judged j = judge_both(c.s, c.dist);
    CAPTURE(c.s.describe());
    CAPTURE(j.naive.max_abs);
    CAPTURE(j.abs_err.max_abs);
    CAPTURE(j.dec_err.max_abs);
    CHECK(j.absorb.pass);
    CHECK(j.decompress.pass);
    CHECK(j.naive.max_abs > 0);
  }
}

TEST_CASE("exercise ch06.5: the absorbed form (q_c = q_nope W_UK^T) equals the decompressed one") {
  const MlaShape s = mla(2, 4, 1, 90);
  const MlaInputs in = make_mla_inputs(s, Dist::normal, 2);
  const CheckPlan plan = CheckPlan::full(s.output());
  const CheckedRows<double> ref = mla_reference(s, in, plan, MlaRefPath::definition);
  const ErrorStats naive = mla_naive_error(s, in, plan, ref);
  const std::vector<float> a = absorb_form(s, in, 1), d = decompress_form(s, in);
  CHECK(accept(compare_rows(a.data(), ref), naive, DType::bf16).pass);
  // and the two bf16 forms agree with each other within both tolerances
  double worst = 0;
  for (std::size_t k = 0; k < a.size(); ++k) worst = std::max(worst, double(std::abs(a[k] - d[k])));
  const double tol = accept(compare_rows(a.data(), ref), naive, DType::bf16).tolerance;
  CHECK(worst <= 2 * tol);
}

TEST_CASE("MLA check plan: every (batch, head) pair, a long prefill thins its rows, never its pairs") {
  // A prefill of 200 rows at Nk = 4096: over the budget, so rows are sampled, in every pair.
  const MlaShape p = mla(2, 16, 200, 4096);
  const CheckPlan pp = mla_check_plan(p, false);
  CHECK(pp.heads.size() == 32);
  CHECK(pp.rows.size() >= 8);
  CHECK(pp.rows.size() < 200);
  for (int r : {0, 1, 198, 199}) CHECK(std::find(pp.rows.begin(), pp.rows.end(), r) != pp.rows.end());
  // A decode whose yardstick (K and V decompressed per pair) is over its budget: the
  // yardstick thins its pairs, the check does not.
  const MlaShape s = mla(2, 16, 1, 1024);
  const double budget = 2e9;  // 7 pairs' decompression at Nk = 1024
  const CheckPlan plan = mla_check_plan(s, false, budget);
  CHECK(plan.covers_everything(s.output()));
  const std::vector<std::pair<int, int>> yard = mla_yardstick_pairs(s, plan, budget);
  REQUIRE(yard.size() < plan.heads.size());
  CHECK(yard.front() == std::make_pair(0, 0));
  CHECK(yard.back() == std::make_pair(1, 15));
  CHECK(mla_check_describe(s, plan, budget).find("yardstick") != std::string::npos);

  // Outputs that are the fp64 reference rounded to bf16 pass; one row of a pair the
  // yardstick left out, off by a tenth of its magnitude, fails.
  const MlaInputs in = make_mla_inputs(s, Dist::normal, 3);
  const CheckedRows<double> ref = mla_reference(s, in, plan);
  const ErrorStats naive = mla_naive_error(s, in, plan, ref, budget);
  std::vector<float> o(s.output().o_elems(), 0.f);
  for (std::size_t k = 0; k < ref.rows.size(); ++k)
    for (int j = 0; j < ref.width; ++j) o[ref.rows[k] * ref.width + j] = round_to(DType::bf16, float(ref.row(k)[j]));
  CHECK(accept(compare_rows(o.data(), ref), naive, DType::bf16).pass);
  std::pair<int, int> outside{-1, -1};
  for (const auto& bh : plan.heads)
    if (std::find(yard.begin(), yard.end(), bh) == yard.end()) outside = bh;
  REQUIRE(outside.first >= 0);
  CAPTURE(outside.first);
  CAPTURE(outside.second);
  // Row `row` (nq = 1: one row a pair) off by a tenth of its magnitude plus 10 x the yardstick.
  auto off = [&](std::size_t row) {
    std::vector<float> x = o;
    double mag = 0;
    for (int j = 0; j < kDV; ++j) mag = std::max(mag, double(std::abs(x[row * kDV + j])));
    x[row * kDV + 5] += float(0.1 * mag + 10 * naive.max_abs);
    return accept(compare_rows(x.data(), ref), naive, DType::bf16).pass;
  };
  CHECK_FALSE(off(std::size_t(outside.first) * s.heads + outside.second));
  CHECK_FALSE(off(std::size_t(s.batch) * s.heads - 1));  // the last head of the last batch
}

TEST_CASE("MLA costs: the absorb model reads the latent cache once per 64-row tile, decompress writes H x 320") {
  const MlaShape s = mla(2, 16, 1, 300);
  const MlaInputs in = make_mla_inputs(s, Dist::normal, 1);
  GroupedOptions o;
  o.pack = true;
  o.m_tile = 64;
  o.n_tile = 64;
  o.v_in_k = true;
  const GroupedResult r = grouped_forward_model(s.absorbed(), absorb(s, in), o);
  const MlaCost ca = mla_cost_absorb(s, 64), cd = mla_cost_decompress(s);
  CHECK(r.kv_bytes == ca.cache_bytes);
  CHECK(ca.cache_bytes == 2.0 * 300 * 1152);  // once per sequence: 16 heads fit one tile
  // decompressed: K (192) and V (128) of every head, 16 x 640 B per token, read by attention
  CHECK(cd.cache_bytes == 2.0 * 16 * 300 * 640);
  CHECK(cd.cache_bytes / ca.cache_bytes == doctest::Approx(16 * 640.0 / 1152));
  // and in decode absorb does more FLOPs than decompress's attention, for far fewer bytes
  CHECK(ca.bytes < cd.bytes);
  // prefill (Nq = Nk = 4096, H = 128): absorb's FLOPs are 3.4x decompress's attention
  const MlaShape pre = mla(1, 128, 4096, 4096);
  CHECK(mla_cost_absorb(pre, 64).flops > 3 * 2.0 * 128 * 4096.0 * 4096 * 320);
}

TEST_CASE("MLA decode split count: whole waves of blocks, the fewest ranges, whole key blocks") {
  // H = 128 (two 64-row tiles), B = 64, one block per SM on 132 SMs: one range fills 0.97 of a wave.
  CHECK(mla_pick_splits(2, 64, 128, 132) == 1);
  // H = 16 (one 16-row tile), B = 64, two blocks per SM: 4 ranges = 256 blocks, 0.97 of 264.
  CHECK(mla_pick_splits(1, 64, 512, 264) == 4);
  // B = 8 at H = 128: 2 x 8 x 8 = 128 blocks.
  CHECK(mla_pick_splits(2, 8, 64, 132) == 8);
  // One short sequence cannot fill the machine: one range per key block.
  CHECK(mla_pick_splits(1, 1, 128, 264) == 128);
  // One long sequence at H = 16 (64K keys, 1024 blocks, one block per SM): 128 ranges of 8
  // blocks, so that 128 of the 132 SMs read (at most 64 ranges left half of them idle).
  CHECK(mla_pick_splits(1, 1, 1024, 132) == 128);
  CHECK(mla_pick_splits(1, 1, 3, 264) == 3);
  // 8 sequences of 64K at H = 16: 16 ranges (128 blocks, 0.97), not 15 (120 blocks, 0.91).
  CHECK(mla_pick_splits(1, 8, 1024, 132) == 16);
  // One sequence of 4K at H = 128: the 64-row tile takes 2 blocks a range, so 32 ranges, not 64.
  CHECK(mla_pick_splits(2, 1, 64, 132, 2) == 32);
  CHECK(mla_pick_splits(2, 1, 64, 132) == 64);
  CHECK(mla_pick_splits(2, 1, 1, 132, 2) == 1);  // fewer blocks than asked for: one range
  for (int tiles : {1, 2, 3})
    for (int batch : {1, 5, 17, 64})
      for (int nblocks : {1, 7, 64, 1000}) {
        const int c = mla_pick_splits(tiles, batch, nblocks, 132, tiles > 1 ? 2 : 1);
        CAPTURE(tiles);
        CAPTURE(batch);
        CAPTURE(nblocks);
        CHECK(c >= 1);
        CHECK(c <= std::min(nblocks, kMlaMaxSplits));
        const int per_range = (nblocks + c - 1) / c;
        CHECK((nblocks + per_range - 1) / per_range == c);  // no empty range
      }
}
