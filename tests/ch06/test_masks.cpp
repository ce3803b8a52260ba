// Chapter 06, masks: every variant's policy agrees with its fp64 definition, classify()
// is conservative, the block map is consistent, and the CPU model (forward and
// backward) passes the acceptance rule at awkward shapes, for every variant.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <tuple>
#include <utility>
#include <type_traits>
#include <vector>

#include "chapters/06_variants/masks/mask_model.hpp"
#include "chapters/06_variants/masks/mask_spec.hpp"
#include "chapters/06_variants/masks/model_cases.hpp"
#include "common/check.hpp"
#include "common/errors.hpp"
#include "support/mask_specs.hpp"
#include "support/shapes.hpp"

using namespace attn;
using namespace attn::ch06;
using testing_support::composed_spec;
using testing_support::shape;

namespace {

constexpr std::size_t kSram = 224 * 1024;

MaskSpec spec_of(MaskKind k, const Problem& p, bool causal = false) {
  MaskSpec s;
  s.kind = k;
  s.causal = causal;
  s.left = 40, s.right = 7;  // a window that is neither 0 nor the whole row
  s.chunk = 48;
  s.prefix = 37;
  s.sinks = 3;
  s.softcap = 1.5;  // small, so tanh bends the scores and its derivative matters
  if (k == MaskKind::sink) s.left = 30, s.right = 0;
  if (k == MaskKind::document && p.nq == p.nk) s.doc_lens = random_doc_lens(p.nq, std::min(5, p.nq), 3);
  s.stride = 19, s.block = 23, s.summary = 5, s.globals = 2, s.random = 2;  // the sparse patterns: odd sizes
  finalize_spec(s, p);
  return s;
}

struct Outcome {
  CheckResult fwd, bwd;
  MaskForwardResult f;
  MaskBackwardResult g;
};

/// The model's forward and backward for `s`, judged against the fp64 reference on every row.
Outcome run_model(const MaskSpec& s, const Problem& user, Dist dist = Dist::normal, int Br = kModelBr,
                  int Bc = kModelBc) {
  const Problem p = masked_problem(user);
  const TokenLayout L = layout_for(s, p);
  const AttnInputs in = make_inputs(p, dist, 11, true);
  AttnInputs lin;
  lin.q = to_layout(in.q, p.heads, p.nq, p.d, L.packed);
  lin.k = to_layout(in.k, p.kv_heads, p.nk, p.d, L.packed);
  lin.v = to_layout(in.v, p.kv_heads, p.nk, p.dv, L.packed);
  lin.dout = to_layout(in.dout, p.heads, p.nq, p.dv, L.packed);
  const BlockMap map = build_block_map(s, p, Br, Bc);
  const auto mod = reference_mod(s, p);
  const ForwardOracle fo(p, in, CheckPlan::full(p), mod.get());
  const BackwardOracle bo(p, in, BackwardPlan::full(p), mod.get());
  Outcome r;
  r.f = mask_forward_model(p, s, L, lin, map, kSram);
  r.fwd = fo.judge(from_layout(r.f.o, p.heads, p.nq, p.dv, L.packed), &r.f.lse);
  r.g = mask_backward_model(p, s, L, lin, r.f.o, r.f.lse, map, kSram);
  r.bwd = bo.judge(from_layout(r.g.dq, p.heads, p.nq, p.d, L.packed),
                   from_layout(r.g.dk, p.kv_heads, p.nk, p.d, L.packed),
                   from_layout(r.g.dv, p.kv_heads, p.nk, p.dv, L.packed));
  return r;
}

void check_model(const MaskSpec& s, const Problem& p, Dist dist = Dist::normal, int Br = kModelBr,
                 int Bc = kModelBc) {
  CAPTURE(s.describe());
  CAPTURE(p.describe());
  CAPTURE(dist_name(dist));
  const Outcome r = run_model(s, p, dist, Br, Bc);
  CHECK_MESSAGE(r.fwd.pass(), r.fwd.failures());
  CHECK_MESSAGE(r.bwd.pass(), r.bwd.failures());
}

bool causal_family(MaskKind k) { return k != MaskKind::document; }

/// One tile shape's tiles of batch 0, heads [0, heads): how the block map's kind and the
/// policy's own classify() compare with the element-wise truth, and the pairs kept.
struct TileAudit {
  long map_unsafe = 0;            ///< the map says full or skip where the truth differs
  long map_inexact = 0;           ///< the map's kind is not the truth
  long classify_inexact = 0;      ///< the policy's classify() is not the truth
  long partial_without_need = 0;  ///< the map says partial where no pair is kept
  long kept_pairs = 0;            ///< pairs the policy keeps over these tiles
};

/// For each tile shape the tests use: builds `s`'s block map, audits its tiles against
/// the policy's keep() and hands both to `check` (with the spec, problem and tile shape captured).
template <class Check>
void audit_tile_shapes(const MaskSpec& s, const Problem& p, const PolicyData& data, int heads, Check&& check) {
  for (auto [Br, Bc] : {std::pair{16, 16}, std::pair{128, 64}, std::pair{64, 176}, std::pair{32, 8}}) {
    CAPTURE(s.describe());
    CAPTURE(p.describe());
    CAPTURE(Br);
    CAPTURE(Bc);
    const BlockMap m = build_block_map(s, p, Br, Bc);
    TileAudit a;
    visit_policy(s, p, data, [&](const auto& pol) {
      for (int h = 0; h < heads; ++h)
        for (int qb = 0; qb < m.tq; ++qb)
          for (int kb = 0; kb < m.tk; ++kb) {
            const TileRange t = tile_range(qb, kb, Br, Bc, p.nq, p.nk);
            const TileKind truth = classify_by_elements(pol, 0, h, t);
            const TileKind got = m.kind(0, h, qb, kb);
            if (got == TileKind::full && truth != TileKind::full) ++a.map_unsafe;
            if (got == TileKind::skip && truth != TileKind::skip) ++a.map_unsafe;
            if (got == TileKind::partial && truth == TileKind::skip) ++a.partial_without_need;
            a.map_inexact += got != truth;
            a.classify_inexact += pol.classify(0, h, t) != truth;
            for (int i = t.i0; i < t.i1; ++i)
              for (int j = t.j0; j < t.j1; ++j) a.kept_pairs += pol.keep(0, h, i, j);
          }
      return 0;
    });
    check(m, a);
  }
}

}  // namespace

TEST_CASE("every policy's keep() and score() agree with the fp64 definition") {
  for (const Problem p : {Problem(shape().heads(3).n(97).d(32)), Problem(shape().heads(2).n(40, 150).d(32)),
                          Problem(shape().heads(2).n(150, 40).d(32))}) {
    for (MaskKind k : all_mask_kinds()) {
      if (k == MaskKind::document && p.nq != p.nk) continue;
      for (bool causal : {false, true}) {
        const MaskSpec s = spec_of(k, p, causal);
        CAPTURE(s.describe());
        CAPTURE(p.describe());
        const auto ref = reference_mod(s, p);
        const std::vector<int> doc = k == MaskKind::document ? doc_of_tokens(s.doc_lens) : std::vector<int>{};
        visit_policy(s, p, PolicyData{doc.data(), s.sink_logits.data()}, [&](const auto& pol) {
          int wrong_keep = 0, wrong_score = 0, wrong_grad = 0;
          for (int h = 0; h < p.heads; ++h) {
            CHECK(double(pol.sink(h)) == (k == MaskKind::learned_sink ? ref->sink(p, 0, h) : 0.0));
            for (int i = 0; i < p.nq; ++i)
              for (int j = 0; j < p.nk; ++j) {
                wrong_keep += pol.keep(0, h, i, j) != ref->keep(p, 0, h, i, j);
                const double x = 0.37 * ((i * 7 + j * 3) % 11 - 5);
                wrong_score += std::abs(double(pol.score(x, 0, h, i, j)) - ref->apply(p, 0, h, i, j, x)) > 1e-5;
                wrong_grad += std::abs(double(pol.dscore(x, 0, h, i, j)) - ref->grad(p, 0, h, i, j, x)) > 1e-5;
              }
          }
          CHECK(wrong_keep == 0);
          CHECK(wrong_score == 0);
          CHECK(wrong_grad == 0);
          return 0;
        });
      }
    }
  }
}

TEST_CASE("classify() is conservative for every variant and tile shape: full keeps all, skip keeps none") {
  for (const Problem p : {Problem(shape().heads(2).n(300).d(32)), Problem(shape().heads(2).n(100, 333).d(32)),
                          Problem(shape().heads(2).n(333, 100).d(32))}) {
    for (MaskKind k : all_mask_kinds()) {
      if (k == MaskKind::document && p.nq != p.nk) continue;
      const MaskSpec s = spec_of(k, p, true);
      const std::vector<int> doc = k == MaskKind::document ? doc_of_tokens(s.doc_lens) : std::vector<int>{};
      audit_tile_shapes(s, p, PolicyData{doc.data(), s.sink_logits.data()}, p.heads,
                        [&](const BlockMap&, const TileAudit& a) {
                          CHECK(a.map_unsafe == 0);
                          // An analytic classify() never sends an all-masked tile to the kernel.
                          if (k != MaskKind::document) CHECK(a.partial_without_need == 0);
                        });
    }
  }
}

TEST_CASE("the sm90a backward's walk: each key block's non-skipped query blocks in ascending order, and its rank") {
  // hopper_backward.cu walks these lists; a wrong rank deadlocks or reorders the deterministic
  // mode, a wrong partial bit leaves a tile unmasked.
  for (const Problem p : {Problem(masked_problem(shape().batch(2).heads(3).n(700, 900).d(32))),
                          Problem(masked_problem(shape().heads(2).n(900, 333).d(32)))}) {
    for (MaskKind k : all_mask_kinds()) {
      if (k == MaskKind::document) continue;
      for (const bool causal : {false, true}) {
        const MaskSpec s = spec_of(k, p, causal);
        CAPTURE(s.describe());
        CAPTURE(p.describe());
        const BlockMap m = build_block_map(s, p, 80, 128);
        const BackwardWalks w = backward_walks(m);
        REQUIRE(w.maps == m.maps());
        int wrong = 0;
        for (int mi = 0; mi < m.maps(); ++mi)
          for (int kb = 0; kb < m.tk; ++kb) {
            const std::size_t f = std::size_t(mi) * m.tk + kb;
            int n = 0;
            for (int qb = 0; qb < m.tq; ++qb) {
              const TileKind t = m.kinds[(std::size_t(mi) * m.tq + qb) * m.tk + kb];
              if (t == TileKind::skip) continue;
              int lower = 0;  // key blocks below kb that visit qb
              for (int k2 = 0; k2 < kb; ++k2) lower += m.kinds[(std::size_t(mi) * m.tq + qb) * m.tk + k2] != TileKind::skip;
              wrong += n >= w.count[f] || w.list[f * m.tq + n] != (qb << 1 | (t == TileKind::partial ? 1 : 0)) ||
                       w.rank[f * m.tq + n] != lower;
              ++n;
            }
            wrong += n != w.count[f];
          }
        CHECK(wrong == 0);
      }
    }
  }
}

TEST_CASE("the block map's forward and backward lists describe the same tiles") {
  const Problem p = masked_problem(shape().batch(1).heads(3).n(700, 900).d(32));
  for (MaskKind k : all_mask_kinds()) {
    if (k == MaskKind::document) continue;
    const MaskSpec s = spec_of(k, p, true);
    CAPTURE(s.describe());
    const BlockMap m = build_block_map(s, p, 128, 64);
    double fwd = 0, bwd = 0;
    for (int mi = 0; mi < m.maps(); ++mi) {
      for (int qb = 0; qb < m.tq; ++qb) {
        const int f = mi * m.tq + qb;
        fwd += m.n_full[f] + m.n_part[f];
        for (int n = 1; n < m.n_full[f]; ++n) CHECK(m.full[f * m.tk + n - 1] < m.full[f * m.tk + n]);
        for (int n = 0; n < m.n_part[f]; ++n) CHECK(m.kinds[f * m.tk + m.part[f * m.tk + n]] == TileKind::partial);
      }
      for (int kb = 0; kb < m.tk; ++kb) bwd += m.q_n_full[mi * m.tk + kb] + m.q_n_part[mi * m.tk + kb];
    }
    CHECK(fwd == bwd);
    CHECK(m.kept_tiles() == doctest::Approx(fwd * (double(p.batch) * p.heads / m.maps())));
    // The scheduler's order: every (b, h, q block) once, heaviest first.
    CHECK(int(m.order.size()) == p.batch * p.heads * m.tq);
    for (std::size_t t = 1; t < m.order.size(); ++t) {
      auto work = [&](int it) {
        const int f = m.map_of(it / m.tq / p.heads, (it / m.tq) % p.heads) * m.tq + it % m.tq;
        return m.n_full[f] + m.n_part[f];
      };
      CHECK(work(m.order[t - 1]) >= work(m.order[t]));
    }
  }
}

TEST_CASE("a sliding window of 1K at N = 16K keeps 8.2x fewer pairs than causal, and its tiles follow") {
  const Problem p = masked_problem(shape().n(16384).d(128));
  MaskSpec c, w;
  c.kind = MaskKind::causal;
  w.kind = MaskKind::window;
  w.left = 1024, w.right = 0;
  finalize_spec(c, p);
  finalize_spec(w, p);
  const BlockMap mc = build_block_map(c, p, 128, 128), mw = build_block_map(w, p, 128, 128);
  const double pair_ratio = mc.kept_pairs / mw.kept_pairs, tile_ratio = mc.kept_tiles() / mw.kept_tiles();
  CHECK(mc.kept_pairs == doctest::Approx(16384.0 * 16385 / 2));
  CHECK(pair_ratio == doctest::Approx(8.25).epsilon(0.01));
  CHECK(tile_ratio > 7.0);  // 8256 tiles against 1144: the block map keeps the saving
  CHECK(mw.count(TileKind::partial) <= 2 * mw.tq);  // two band edges per query block at most
}

TEST_CASE("every variant's model passes the fp64 reference, forward and backward, at awkward shapes") {
  for (MaskKind k : all_mask_kinds()) {
    const Problem many = shape().batch(k == MaskKind::document ? 1 : 2).heads(4, 2).n(200).d(32);  // batches, GQA
    check_model(spec_of(k, many), many);
    check_model(spec_of(k, shape().heads(2).n(50).d(64)), shape().heads(2).n(50).d(64));  // N below one tile
    check_model(spec_of(k, shape().heads(2).n(140).d(32), true), shape().heads(2).n(140).d(32), Dist::mean_shifted);
    check_model(spec_of(k, shape().n(129).d(64)), shape().n(129).d(64).dtype(DType::f16), Dist::outliers);
  }
}

TEST_CASE("the causal family with Nq != Nk (bottom-right), GQA, and other tile shapes") {
  for (MaskKind k : all_mask_kinds()) {
    if (!causal_family(k)) continue;
    for (const Problem p : {Problem(shape().heads(4, 1).n(70, 260).d(32)), Problem(shape().heads(4, 2).n(260, 70).d(32))}) {
      check_model(spec_of(k, p, true), p);
      check_model(spec_of(k, p, true), p, Dist::normal, 32, 16);
    }
  }
}

TEST_CASE("fully masked rows: O = 0, LSE = -inf, dQ = 0") {
  // Nq > Nk with a causal mask: the first Nq - Nk rows see no key.
  const Problem p = masked_problem(shape().heads(2).n(300, 100).d(32));
  for (MaskKind k : {MaskKind::causal, MaskKind::window, MaskKind::chunked, MaskKind::sink, MaskKind::alibi}) {
    MaskSpec s = spec_of(k, p, true);
    s.right = 0;  // a window reaching right of the diagonal would give the first rows keys
    CAPTURE(s.describe());
    const Outcome r = run_model(s, p);
    CHECK(r.fwd.pass());
    CHECK(r.bwd.pass());
    int bad = 0;
    for (int h = 0; h < p.heads; ++h)
      for (int i = 0; i < p.nq - p.nk; ++i) {
        bad += !(std::isinf(r.f.lse[p.lse_off(0, h) + i]) && r.f.lse[p.lse_off(0, h) + i] < 0);
        for (int c = 0; c < p.dv; ++c) bad += r.f.o[p.o_off(0, h) + std::size_t(i) * p.dv + c] != 0.f;
        for (int c = 0; c < p.d; ++c) bad += r.g.dq[p.q_off(0, h) + std::size_t(i) * p.d + c] != 0.f;
      }
    CHECK(bad == 0);
  }
}

TEST_CASE("window edge cases: window 0 sees only the diagonal, a window wider than the sequence sees everything") {
  const Problem p = masked_problem(shape().heads(2).n(150, 190).d(32));
  MaskSpec w0;
  w0.kind = MaskKind::window;
  w0.left = 0, w0.right = 0;
  finalize_spec(w0, p);
  const BlockMap m0 = build_block_map(w0, p, kModelBr, kModelBc);
  CHECK(m0.kept_pairs == doctest::Approx(2.0 * 150));
  check_model(w0, p);
  MaskSpec wide = w0;
  wide.left = wide.right = 100000;
  const BlockMap mw = build_block_map(wide, p, kModelBr, kModelBc);
  CHECK(mw.kept_pairs == doctest::Approx(2.0 * 150 * 190));
  CHECK(mw.count(TileKind::skip) == 0);
  check_model(wide, p);
  MaskSpec big_chunk;
  big_chunk.kind = MaskKind::chunked;
  big_chunk.chunk = 100000;  // one chunk: causal
  finalize_spec(big_chunk, p);
  check_model(big_chunk, p);
}

TEST_CASE("document masking: documents of length 1, and 1000 documents in one packed batch") {
  {
    const Problem p = masked_problem(shape().heads(2).n(40).d(32));
    MaskSpec s;
    s.kind = MaskKind::document;
    s.doc_lens = {1, 1, 5, 1, 30, 1, 1};
    finalize_spec(s, p);
    check_model(s, p);
    s.causal = true;
    check_model(s, p);
  }
  {
    const Problem p = masked_problem(shape().heads(2, 1).n(1500).d(32));
    MaskSpec s;
    s.kind = MaskKind::document;
    s.causal = true;
    s.doc_lens = random_doc_lens(1500, 1000, 5);
    REQUIRE(s.doc_lens.size() == 1000);
    finalize_spec(s, p);
    const BlockMap m = build_block_map(s, p, kModelBr, kModelBc);
    // Kept pairs: the sum over documents of l (l + 1) / 2, not of the padded batch.
    double pairs = 0;
    for (int l : s.doc_lens) pairs += 0.5 * l * (l + 1);
    CHECK(m.kept_pairs == doctest::Approx(pairs * p.heads));
    // Only tiles on the diagonal: a query block of 128 meets at most 3 key blocks of 64.
    CHECK(m.kept_tiles() <= double(m.tq) * p.heads * (kModelBr / kModelBc + 1));
    check_model(s, p);
  }
}

TEST_CASE("span(): every policy with row spans keeps exactly the keys keep() keeps") {
  int checked = 0;
  for (const auto& [nq, nk] : {std::pair{300, 300}, std::pair{130, 400}, std::pair{400, 130}, std::pair{64, 64}})
    for (const MaskKind k : all_mask_kinds()) {
      if (k == MaskKind::document && nq != nk) continue;
      const Problem p = masked_problem(shape().heads(3).n(nq, nk).d(64));
      MaskSpec s;
      s.kind = k;
      s.causal = k != MaskKind::learned_sink || nq != 130;  // both, across the shapes
      s.left = 70, s.right = 9, s.chunk = 48, s.prefix = 37, s.sinks = 5;
      if (k == MaskKind::sink) s.left = 40, s.right = 0;
      finalize_spec(s, p);
      const std::vector<int> doc = k == MaskKind::document ? doc_of_tokens(s.doc_lens) : std::vector<int>{};
      visit_policy(s, p, PolicyData{doc.data(), s.sink_logits.data()}, [&](const auto& pol) {
        using P = std::decay_t<decltype(pol)>;
        if constexpr (P::kSpans > 0) {
          long bad = 0;
          for (int h = 0; h < p.heads; ++h)
            for (int i = 0; i < nq; ++i) {
              const Span sp = pol.span(0, h, i);
              for (int j = 0; j < nk; ++j) {
                const bool in = (j >= sp.lo0 && j <= sp.hi0) || (P::kSpans == 2 && j >= sp.lo1 && j <= sp.hi1);
                bad += in != pol.keep(0, h, i, j);
              }
            }
          CAPTURE(s.describe());
          CAPTURE(p.describe());
          CHECK(bad == 0);
          ++checked;
        }
      });
    }
  CHECK(checked >= 4 * 8 - 1);  // eight of the variants have spans (not documents, custom or the sparse patterns)
}

TEST_CASE("the map's order puts the tiles with work first, and tiles_with_work() counts them") {
  const Problem p = masked_problem(shape().heads(3).n(700, 300).d(64));  // rows 0-399 see no key
  for (const MaskKind k : {MaskKind::causal, MaskKind::chunked, MaskKind::sink}) {  // (not the window: exercise ch06.1)
    MaskSpec s;
    s.kind = k;
    s.causal = true;
    finalize_spec(s, p);
    const BlockMap m = build_block_map(s, p, 128, 128);
    const int w = m.tiles_with_work();
    CAPTURE(s.describe());
    CHECK(w > 0);
    CHECK(w < int(m.order.size()));  // some tiles have no kept block
    for (std::size_t t = 0; t < m.order.size(); ++t) {
      const int bh = m.order[t] / m.tq, qb = m.order[t] % m.tq;
      const std::size_t f = std::size_t(m.map_of(bh / m.heads, bh % m.heads)) * m.tq + qb;
      CHECK((m.n_full[f] + m.n_part[f] > 0) == (int(t) < w));
    }
  }
}

TEST_CASE("the document map: tiles from each document's start cover every kept pair once, partial only where needed") {
  for (const bool causal : {true, false})
    for (const std::vector<int>& lens : {std::vector<int>{300, 200, 1, 128, 129, 42},
                                         random_doc_lens(3000, 9, 4), random_doc_lens(1500, 1000, 5)}) {
      int n = 0;
      for (int l : lens) n += l;
      const Problem p = masked_problem(shape().heads(2).n(n).d(128));
      MaskSpec s;
      s.kind = MaskKind::document;
      s.causal = causal;
      s.doc_lens = lens;
      finalize_spec(s, p);
      CAPTURE(s.describe());
      const int Br = 128, Bc = 128;
      const BlockMap m = build_document_block_map(s, p, Br, Bc);
      const std::vector<int> doc = doc_of_tokens(lens);
      auto keep = [&](int i, int j) { return j < n && doc[i] == doc[j] && (!causal || j <= i); };
      // Every row in exactly one query tile, which lies inside one document.
      std::vector<int> covered(n, 0);
      REQUIRE(int(m.q_row0.size()) == m.tq);
      for (int q = 0; q < m.tq; ++q) {
        REQUIRE(m.q_row0[q] < m.q_row1[q]);
        CHECK(m.q_row1[q] - m.q_row0[q] <= Br);
        CHECK(doc[m.q_row0[q]] == doc[m.q_row1[q] - 1]);
        for (int i = m.q_row0[q]; i < m.q_row1[q]; ++i) ++covered[i];
      }
      CHECK(std::count(covered.begin(), covered.end(), 1) == n);
      // Each kept pair in exactly one listed tile; full tiles keep every pair (no mask there).
      std::vector<long> seen(n, 0);
      long partial = 0, tiles = 0, bad_full = 0;
      for (int q = 0; q < m.tq; ++q)
        for (int part = 0; part < 2; ++part) {
          const int cnt = part ? m.n_part[q] : m.n_full[q];
          const int* list = (part ? m.part.data() : m.full.data()) + std::size_t(q) * m.tk;
          for (int t = 0; t < cnt; ++t, ++tiles) {
            partial += part;
            for (int i = m.q_row0[q]; i < m.q_row1[q]; ++i)
              for (int j = list[t]; j < list[t] + Bc; ++j) {
                seen[i] += keep(i, j);
                bad_full += !part && !keep(i, j);
              }
          }
        }
      CHECK(bad_full == 0);
      long lost = 0;
      for (int i = 0; i < n; ++i) {
        long want = 0;
        for (int j = 0; j < n; ++j) want += keep(i, j);
        lost += seen[i] != want;
      }
      CHECK(lost == 0);
      // The work of each document alone: T (T + 1) / 2 tiles causal, T^2 not, T = ceil(l / 128);
      // partial only on the diagonal (causal) or in the last key tile of a ragged document.
      long alone = 0, alone_partial = 0;
      for (int l : lens) {
        const long T = (l + Bc - 1) / Bc;
        alone += causal ? T * (T + 1) / 2 : T * T;
        alone_partial += causal ? T : (l % Bc ? T : 0);
      }
      CHECK(tiles == alone);
      CHECK(partial == alone_partial);
      CHECK(m.kept_tiles() == doctest::Approx(double(alone) * p.heads));
      CHECK(m.kept_pairs == doctest::Approx(build_block_map(s, p, Br, Bc).kept_pairs));
      CHECK(m.tiles_with_work() == m.tq * p.heads);  // every query tile of a document has its diagonal
    }
}

TEST_CASE("document masking reads the packed varlen layout [tokens][heads][d] (no padding)") {
  const Problem p = masked_problem(shape().heads(3).n(64).d(32));
  const TokenLayout L = TokenLayout::varlen(p);
  CHECK(L.packed);
  CHECK(L.q.row == 3 * 32);
  CHECK(L.q.head == 32);
  std::vector<float> x(std::size_t(3) * 64 * 32);
  for (std::size_t t = 0; t < x.size(); ++t) x[t] = float(t);
  const std::vector<float> packed = to_layout(x, 3, 64, 32, true);
  CHECK(packed[L.q.at(0, 2, 5) + 7] == x[(2 * 64 + 5) * 32 + 7]);  // head 2, token 5, dim 7
  CHECK(from_layout(packed, 3, 64, 32, true) == x);
  CHECK(cu_seqlens({3, 1, 4}) == std::vector<int>{0, 3, 4, 8});
  CHECK(doc_of_tokens({2, 1}) == std::vector<int>{0, 0, 1});
}

TEST_CASE("the learnable sink's gradient matches a finite difference of the fp64 reference") {
  const Problem p = masked_problem(shape().heads(2).n(90).d(32).causal());
  MaskSpec s = spec_of(MaskKind::learned_sink, p, true);
  const Outcome r = run_model(s, p);
  REQUIRE(r.g.dsink.size() == 2);
  const AttnInputs in = make_inputs(p, Dist::normal, 11, true);
  for (int h = 0; h < 2; ++h) {
    // Loss = sum dO . O; d Loss / d sink_h by central differences in fp64.
    auto loss = [&](double delta) {
      MaskSpec t = s;
      t.sink_logits[h] += float(delta);
      const auto mod = reference_mod(t, p);
      const RefForward f = reference_forward(p, in, CheckPlan::full(p), mod.get());
      double l = 0;
      for (std::size_t k = 0; k < f.o.rows.size(); ++k)
        for (int c = 0; c < p.dv; ++c) l += in.dout[f.o.rows[k] * p.dv + c] * f.o.row(k)[c];
      return l;
    };
    const double eps = 1.0 / 64;  // exactly representable in the fp32 logits
    const double fd = (loss(eps) - loss(-eps)) / (2 * eps);
    CAPTURE(h);
    CHECK(r.g.dsink[h] == doctest::Approx(fd).epsilon(0.02));
    CHECK(std::abs(fd) > 1e-3);
  }
}

TEST_CASE("the model visits only listed tiles and masks only the partial ones") {
  const Problem p = masked_problem(shape().heads(2).n(1000).d(32));
  MaskSpec s = spec_of(MaskKind::window, p);
  s.left = 200, s.right = 0;
  const Outcome r = run_model(s, p);
  const BlockMap m = build_block_map(s, p, kModelBr, kModelBc);
  CHECK(r.f.tiles_visited == m.kept_tiles());
  CHECK(r.f.tiles_masked == m.count(TileKind::partial));
  CHECK(r.g.tiles_visited == m.kept_tiles());
  // Bytes: Q, O, LSE once; K and V once per visited tile.
  const double e = dtype_bytes(p.dtype);
  const double expect_read = e * (p.q_elems() + m.kept_tiles() * kModelBc * (p.d + p.dv));
  CHECK(r.f.traffic.bytes_read <= expect_read);
  CHECK(r.f.traffic.bytes_read > 0.9 * expect_read);
}

// ------------------------------------------------------------------ exercises

TEST_CASE("exercise ch06.1: the window's classify() skips and keeps whole tiles") {
  Window w;
  w.diag = 0, w.left = 256, w.right = 0;
  CHECK(w.classify(0, 0, {512, 640, 0, 64}) == TileKind::skip);       // far left of the band
  CHECK(w.classify(0, 0, {512, 640, 704, 768}) == TileKind::skip);    // right of the diagonal
  CHECK(w.classify(0, 0, {512, 640, 384, 448}) == TileKind::full);    // inside every row's band
  CHECK(w.classify(0, 0, {512, 640, 576, 640}) == TileKind::partial); // the diagonal crosses it
  CHECK(w.classify(0, 0, {512, 640, 256, 320}) == TileKind::partial); // the left edge crosses it
  const Problem p = masked_problem(shape().heads(2).n(300).d(32));
  MaskSpec s;
  s.kind = MaskKind::window;
  s.left = 60, s.right = 5;
  finalize_spec(s, p);
  check_model(s, p, Dist::normal, 32, 16);
}

TEST_CASE("exercise ch06.2: the learnable sink sits in every row's denominator") {
  for (const Problem p : {Problem(shape().heads(3).n(150).d(32)), Problem(shape().heads(2).n(200, 80).d(32))}) {
    check_model(spec_of(MaskKind::learned_sink, p, false), p);
    check_model(spec_of(MaskKind::learned_sink, p, true), p);  // rows that see no key: O = 0, LSE = sink
  }
}

TEST_CASE("exercise ch06.3: the custom block-sparse mask keeps a random quarter of the off-diagonal blocks") {
  BlockSparse m;
  m.diag = 0, m.seed = 7;
  int off = 0, kept = 0;
  for (int bq = 2; bq < 40; ++bq)
    for (int bk = 1; bk < bq; ++bk) {
      ++off;
      kept += m.keep(0, 0, bq * 128 + 5, bk * 128 + 3);
      CHECK(m.keep(0, 0, bq * 128 + 5, bk * 128 + 3) == m.keep(0, 0, bq * 128 + 100, bk * 128 + 77));  // per block
    }
  CHECK(m.keep(0, 0, 900, 3));             // block 0 is global
  CHECK(m.keep(0, 0, 900, 899));           // its own block
  CHECK(!m.keep(0, 0, 900, 901));          // causal
  CHECK(double(kept) / off > 0.15);
  CHECK(double(kept) / off < 0.35);
  const Problem p = masked_problem(shape().heads(2).n(600).d(32));
  MaskSpec s;
  s.kind = MaskKind::custom;
  finalize_spec(s, p);
  check_model(s, p);
}

// ------------------------------------------------------------------ compositions and model cases

namespace {

/// The window a policy holds: LearnedSink's and Softcap's; -100 for the others
/// (visit_policy instantiates its function for every policy).
template <class P>
int window_of(const P& pol) {
  if constexpr (std::is_same_v<P, LearnedSink> || std::is_same_v<P, Softcap>) return pol.window;
  (void)pol;
  return -100;
}

/// A policy's span of row i (empty for a policy without one).
template <class P>
Span span_of(const P& pol, int h, int i) {
  if constexpr (P::kSpans > 0) return pol.span(0, h, i);
  (void)pol, (void)h, (void)i;
  return Span{1, 0};
}

}  // namespace

TEST_CASE("composed masks: a sliding window on learned-sink and softcap keeps what the definition and Window keep") {
  int checked = 0;
  for (const auto& [nq, nk] : {std::pair{97, 97}, std::pair{40, 150}, std::pair{150, 40}, std::pair{130, 400}})
    for (const MaskKind k : {MaskKind::learned_sink, MaskKind::softcap})
      for (const int w : {0, 1, 37, 64, 1000}) {
        const Problem p = masked_problem(shape().heads(2).n(nq, nk).d(32));
        const MaskSpec s = composed_spec(k, p, w, 1.5);
        CAPTURE(s.describe());
        CAPTURE(p.describe());
        CHECK(s.causal);
        const auto ref = reference_mod(s, p);
        Window win;  // the causal sliding window (left w, right 0): the same keys
        win.diag = nk - nq, win.left = w, win.right = 0;
        visit_policy(s, p, PolicyData{nullptr, s.sink_logits.data()}, [&](const auto& pol) {
          REQUIRE(window_of(pol) == w);
          long bad_def = 0, bad_ref = 0, bad_win = 0, bad_span = 0, kept = 0;
          for (int i = 0; i < nq; ++i) {
            const Span sp = span_of(pol, 1, i);
            for (int j = 0; j < nk; ++j) {
              const int q = i + (nk - nq);
              const bool want = j <= q && q - j <= w;  // the definition
              const bool got = pol.keep(0, 1, i, j);
              kept += got;
              bad_def += got != want;
              bad_ref += got != ref->keep(p, 0, 1, i, j);
              bad_win += got != win.keep(0, 1, i, j);
              bad_span += (j >= sp.lo0 && j <= sp.hi0) != got;
            }
          }
          CHECK(bad_def == 0);
          CHECK(bad_ref == 0);
          CHECK(bad_win == 0);
          CHECK(bad_span == 0);
          CHECK(kept > 0);
          ++checked;
        });
      }
  CHECK(checked == 4 * 2 * 5);
}

TEST_CASE("composed masks: classify() is exact per tile (full only if every pair is kept, skip only if none)") {
  for (const auto& [nq, nk] : {std::pair{300, 300}, std::pair{100, 333}, std::pair{333, 100}})
    for (const MaskKind k : {MaskKind::learned_sink, MaskKind::softcap})
      for (const int w : {0, 15, 16, 63, 64, 100, 5000}) {
        const Problem p = masked_problem(shape().heads(2).n(nq, nk).d(32));
        const MaskSpec s = composed_spec(k, p, w, 1.5);
        audit_tile_shapes(s, p, PolicyData{nullptr, s.sink_logits.data()}, 1,
                          [&](const BlockMap& m, const TileAudit& a) {
                            CHECK(a.classify_inexact + a.map_inexact == 0);
                            // The FLOPs count kept pairs (head 0's, times the heads).
                            CHECK(m.kept_pairs == doctest::Approx(double(a.kept_pairs) * p.heads));
                          });
      }
}

TEST_CASE("composed masks: the CPU model passes the fp64 reference at awkward shapes") {
  for (const MaskKind k : {MaskKind::learned_sink, MaskKind::softcap})
    for (const int w : {0, 70, 1000}) {
      const Problem many = shape().batch(2).heads(4, 2).n(200).d(32);  // batches, GQA, N off the tile
      check_model(composed_spec(k, many, w, 1.5), many);
      for (const Problem p : {Problem(shape().heads(4, 1).n(70, 260).d(32)), Problem(shape().heads(2).n(260, 70).d(32)),
                              Problem(shape().heads(2).n(50).d(64))}) {
        check_model(composed_spec(k, p, w, 1.5), p);
        check_model(composed_spec(k, p, w, 1.5), p, Dist::mean_shifted, 32, 16);
      }
    }
}

TEST_CASE("composed masks: the default of every variant is unchanged, and a bad window is a usage error") {
  const Problem p = masked_problem(shape().heads(2).n(100).d(32));
  CHECK(MaskSpec{}.sliding == -1);
  for (const MaskKind k : {MaskKind::learned_sink, MaskKind::softcap}) {
    MaskSpec s;
    s.kind = k;
    finalize_spec(s, p);
    CHECK(!s.causal);  // no window: neither causal nor windowed, as before
    CHECK(s.describe().find("window") == std::string::npos);
    visit_policy(s, p, PolicyData{nullptr, s.sink_logits.data()}, [&](const auto& pol) {
      CHECK(window_of(pol) == -1);
      CHECK(pol.keep(0, 0, 3, 90));  // a key after the query: kept (no mask)
    });
    MaskSpec w = s;
    w.sliding = 12;
    finalize_spec(w, p);
    CHECK(w.causal);
    CHECK(w.describe().find("sliding window 12 (causal)") != std::string::npos);
    MaskSpec bad = s;
    bad.sliding = -2;
    CHECK_THROWS_AS(finalize_spec(bad, p), UsageError);
  }
  MaskSpec other;
  other.kind = MaskKind::alibi;
  other.sliding = 5;  // only learned-sink and softcap take a sliding window
  CHECK_THROWS_AS(finalize_spec(other, p), UsageError);
}

TEST_CASE("model cases: each sets the head dim, heads and mask of its published config") {
  struct Want {
    const char* name;
    int d, heads, kv_heads;
    MaskKind kind;
    int left;  // the chapter's left bound: the config's sliding_window W less one
    double softcap;
  };
  const std::vector<Want> want = {{"gpt-oss", 64, 64, 8, MaskKind::learned_sink, 127, 0},
                                  {"gemma2", 256, 16, 8, MaskKind::softcap, 4095, 50.0},
                                  {"mistral", 128, 32, 8, MaskKind::window, 4095, 0},
                                  {"packed-docs", 128, 32, 8, MaskKind::document, -1, 0}};
  REQUIRE(model_cases().size() == want.size());
  CHECK(find_model_case("llama") == nullptr);
  for (const Want& w : want) {
    CAPTURE(w.name);
    const ModelCase* m = find_model_case(w.name);
    REQUIRE(m != nullptr);
    CHECK(std::string(m->source).size() > 20);
    Problem p = shape().batch(1).heads(4, 2).n(5000).d(32);
    apply_model_problem(*m, &p);
    CHECK(p.d == w.d);
    CHECK(p.dv == w.d);
    CHECK(p.heads == w.heads);
    CHECK(p.kv_heads == w.kv_heads);
    CHECK(p.nq == 5000);  // N stays as given
    const MaskSpec s = model_spec(*m, p, 9);
    CAPTURE(s.describe());
    CHECK(s.kind == w.kind);
    CHECK(s.causal);
    if (w.kind == MaskKind::window) {
      CHECK(s.left == w.left);
      CHECK(s.right == 0);
    } else if (w.kind == MaskKind::document) {
      CHECK(int(s.doc_lens.size()) == default_model_docs(5000));
      int sum = 0;
      for (int l : s.doc_lens) sum += l;
      CHECK(sum == 5000);
      CHECK(model_spec(*m, p, 9).doc_lens == s.doc_lens);  // seeded
      CHECK(model_spec(*m, p, 10).doc_lens != s.doc_lens);
      CHECK(model_spec(*m, p, 9, 7).doc_lens.size() == 7);
    } else {
      CHECK(s.sliding == w.left);
    }
    if (w.kind == MaskKind::softcap) CHECK(s.softcap == w.softcap);
  }
}

TEST_CASE("model cases: the CPU model passes the fp64 reference at a small N for each case") {
  for (const ModelCase& m : model_cases()) {
    for (const int n : {300, 130}) {
      Problem p = shape().n(n).d(32);
      apply_model_problem(m, &p);
      p = masked_problem(p);
      MaskSpec s = model_spec(m, p, 3);
      if (s.kind == MaskKind::window) s.left = 70;           // a window shorter than N, so it masks
      if (s.sliding >= 0) s.sliding = n == 300 ? 70 : 4095;  // and one longer than N
      const ModelTiles t = model_tiles(p.d);
      CAPTURE(m.name);
      check_model(s, p, Dist::normal, t.Br, t.Bc);
    }
  }
}

// ------------------------------------------------------------------ the sparse patterns

namespace {

/// Each pattern from its paper, written again here (loops, sets) apart from the policy
/// and the reference: q = i + diag, diag = Nk - Nq.
struct SparseDefinition {
  MaskSpec s;
  int nq, nk;
  std::vector<std::vector<char>> bigbird_random;  // [query block + 1][key block]: one of its r draws

  SparseDefinition(const MaskSpec& spec, int nq_, int nk_) : s(spec), nq(nq_), nk(nk_) {
    if (s.kind != MaskKind::bigbird) return;
    const int b = s.block, nkb = (nk + b - 1) / b;
    const int first = block_of(0 + nk - nq), last = block_of(nq - 1 + nk - nq);
    for (int qb = first; qb <= last; ++qb) {
      std::vector<char> r(nkb, 0);
      for (int k = 0; k < s.random; ++k) r[mask_math::hash3(unsigned(s.seed), unsigned(qb), unsigned(k)) % unsigned(nkb)] = 1;
      bigbird_random.push_back(r);
    }
  }
  int block_of(int pos) const {  // floor(pos / b), for negative positions too
    int qb = 0;
    while (qb * s.block > pos) --qb;
    while ((qb + 1) * s.block <= pos) ++qb;
    return qb;
  }
  bool keep(int i, int j) const {
    const int q = i + nk - nq;
    switch (s.kind) {
      case MaskKind::strided: {  // the local head (the last l positions) and the strided head
        if (j > q) return false;
        for (int d = 0; d < s.stride; ++d)
          if (q - d == j) return true;
        for (int t = q; t >= 0; t -= s.stride)
          if (t == j) return true;
        return false;
      }
      case MaskKind::fixed: {  // A1: the own block; A2: the last c columns of every block
        if (j > q) return false;
        const int l = s.block;
        const bool same_block = block_of(j) == block_of(q);
        bool summary = false;
        for (int blk = 0; blk * l <= j; ++blk)
          summary |= j >= blk * l + l - s.summary && j < blk * l + l;
        return same_block || summary;
      }
      case MaskKind::longformer: {
        std::vector<int> global;
        for (int t = 0; t < s.globals; ++t) global.push_back(t);
        const bool q_global = std::find(global.begin(), global.end(), q) != global.end();
        const bool k_global = std::find(global.begin(), global.end(), j) != global.end();
        return q_global || k_global || (j >= q - s.left && j <= q + s.left);
      }
      case MaskKind::bigbird: {
        const int qb = block_of(q), kb = block_of(j);
        const bool window = kb == qb - 1 || kb == qb || kb == qb + 1;
        const bool global = kb < s.globals || (qb >= 0 && qb < s.globals);
        const int first = block_of(0 + nk - nq);
        return window || global || bigbird_random[qb - first][kb];
      }
      default: return false;
    }
  }
};

MaskSpec sparse_spec(MaskKind k, const Problem& p, int stride, int block, int summary, int globals, int random, int w) {
  MaskSpec s;
  s.kind = k;
  s.stride = stride, s.block = block, s.summary = summary, s.globals = globals, s.random = random, s.left = w;
  s.seed = 5;
  finalize_spec(s, p);
  return s;
}

/// Several parameter sets of each pattern, sizes of 1 included.
std::vector<MaskSpec> sparse_specs(const Problem& p) {
  std::vector<MaskSpec> v;
  for (int l : {1, 3, 19, 64}) v.push_back(sparse_spec(MaskKind::strided, p, l, 64, 8, -1, 3, 0));
  for (auto [l, c] : {std::pair{1, 0}, std::pair{1, 1}, std::pair{7, 0}, std::pair{7, 3}, std::pair{23, 23}, std::pair{64, 8}})
    v.push_back(sparse_spec(MaskKind::fixed, p, 64, l, c, -1, 3, 0));
  for (auto [w, g] : {std::pair{0, 0}, std::pair{0, 3}, std::pair{5, 1}, std::pair{40, 7}, std::pair{1000, 2}})
    v.push_back(sparse_spec(MaskKind::longformer, p, 64, 64, 8, g, 3, w));
  for (auto [b, g, r] : {std::tuple{1, 0, 0}, std::tuple{4, 1, 2}, std::tuple{23, 2, 3}, std::tuple{64, 0, 1}, std::tuple{16, 3, 5}})
    v.push_back(sparse_spec(MaskKind::bigbird, p, 64, b, 8, g, r, 0));
  return v;
}

}  // namespace

TEST_CASE("the sparse patterns: keep() and the reference are each paper's definition, written again here") {
  int checked = 0;
  for (const auto& [nq, nk] : {std::pair{97, 97}, std::pair{40, 150}, std::pair{150, 40}, std::pair{1, 1},
                               std::pair{3, 7}, std::pair{7, 2}})
    for (const MaskSpec& s : sparse_specs(shape().n(nq, nk).d(32))) {
      const Problem p = masked_problem(shape().n(nq, nk).d(32));
      CAPTURE(s.describe());
      CAPTURE(p.describe());
      const SparseDefinition def(s, nq, nk);
      const auto ref = reference_mod(s, p);
      visit_policy(s, p, PolicyData{}, [&](const auto& pol) {
        REQUIRE(std::is_same_v<std::decay_t<decltype(pol)>, StructuredSparse>);
        long bad_pol = 0, bad_ref = 0;
        for (int i = 0; i < nq; ++i)
          for (int j = 0; j < nk; ++j) {
            const bool want = def.keep(i, j);
            bad_pol += pol.keep(0, 0, i, j) != want;
            bad_ref += ref->keep(p, 0, 0, i, j) != want;
          }
        CHECK(bad_pol == 0);
        CHECK(bad_ref == 0);
        ++checked;
      });
    }
  CHECK(checked == 6 * 20);
}

TEST_CASE("the sparse patterns: a few pairs by hand") {
  const Problem p = masked_problem(shape().n(200).d(32));
  auto keeps = [&](const MaskSpec& s, int i, int j) {
    return visit_policy(s, p, PolicyData{}, [&](const auto& pol) { return pol.keep(0, 0, i, j); });
  };
  const MaskSpec st = sparse_spec(MaskKind::strided, p, 10, 64, 8, -1, 3, 0);
  CHECK(keeps(st, 50, 41));   // 9 back: the local head
  CHECK(!keeps(st, 50, 39));  // 11 back: neither head
  CHECK(keeps(st, 50, 30));   // 20 back: the strided head
  CHECK(keeps(st, 50, 0));    // 50 back
  CHECK(!keeps(st, 50, 51));  // causal
  const MaskSpec fx = sparse_spec(MaskKind::fixed, p, 64, 16, 2, -1, 3, 0);
  CHECK(keeps(fx, 40, 32));   // its own block [32, 47]
  CHECK(keeps(fx, 40, 14));   // a summary column of block 0 (14, 15)
  CHECK(keeps(fx, 40, 31));   // and of block 1 (30, 31)
  CHECK(!keeps(fx, 40, 13));
  CHECK(!keeps(fx, 20, 30));  // causal, though a summary column
  const MaskSpec lf = sparse_spec(MaskKind::longformer, p, 64, 64, 8, 2, 3, 5);
  CHECK(keeps(lf, 100, 95));
  CHECK(keeps(lf, 100, 105));
  CHECK(!keeps(lf, 100, 106));
  CHECK(keeps(lf, 100, 1));   // a global key
  CHECK(keeps(lf, 1, 199));   // a global query sees every key
  CHECK(!keeps(lf, 2, 199));
  const MaskSpec bb = sparse_spec(MaskKind::bigbird, p, 64, 10, 8, 1, 0, 0);
  CHECK(keeps(bb, 55, 40));   // block 5 sees blocks 4, 5, 6
  CHECK(keeps(bb, 55, 69));
  CHECK(!keeps(bb, 55, 70));
  CHECK(keeps(bb, 55, 9));    // block 0 is global
  CHECK(keeps(bb, 5, 199));
}

TEST_CASE("exercise ch06.10: the strided and fixed patterns keep the keys of Child et al.'s definitions") {
  // By hand, l = 4 (strided) and l = 4, c = 1 (fixed), the query at position 10:
  //   strided: the last 4 keys 7..10, and 6 and 2 (10 - j a multiple of 4)
  //   fixed:   its own block 8..10, and the last column of every block before it: 3, 7
  const Problem p = masked_problem(shape().n(16).d(32));
  auto kept = [&](const MaskSpec& s, int i) {
    std::vector<int> v;
    visit_policy(s, p, PolicyData{}, [&](const auto& pol) {
      for (int j = 0; j < 16; ++j)
        if (pol.keep(0, 0, i, j)) v.push_back(j);
    });
    return v;
  };
  const MaskSpec st = sparse_spec(MaskKind::strided, p, 4, 64, 8, -1, 3, 0);
  const MaskSpec fx = sparse_spec(MaskKind::fixed, p, 64, 4, 1, -1, 3, 0);
  CHECK(kept(st, 10) == std::vector<int>{2, 6, 7, 8, 9, 10});
  CHECK(kept(st, 2) == std::vector<int>{0, 1, 2});
  CHECK(kept(fx, 10) == std::vector<int>{3, 7, 8, 9, 10});
  CHECK(kept(fx, 4) == std::vector<int>{3, 4});
  // Every pair of several shapes against the definitions written again in this file.
  int checked = 0;
  for (const auto& [nq, nk] : {std::pair{97, 97}, std::pair{40, 150}, std::pair{150, 40}})
    for (const MaskSpec& s : sparse_specs(shape().n(nq, nk).d(32))) {
      if (s.kind != MaskKind::strided && s.kind != MaskKind::fixed) continue;
      const Problem q = masked_problem(shape().n(nq, nk).d(32));
      CAPTURE(s.describe());
      const SparseDefinition def(s, nq, nk);
      long bad = 0;
      visit_policy(s, q, PolicyData{}, [&](const auto& pol) {
        for (int i = 0; i < nq; ++i)
          for (int j = 0; j < nk; ++j) bad += pol.keep(0, 0, i, j) != def.keep(i, j);
      });
      CHECK(bad == 0);
      ++checked;
    }
  CHECK(checked == 3 * 10);
  // And the chapter's CPU model with the pattern, against the fp64 reference, on an awkward shape.
  const Problem m = masked_problem(shape().heads(2).n(300, 200).d(32));
  check_model(sparse_spec(MaskKind::strided, m, 19, 64, 8, -1, 3, 0), m);
  check_model(sparse_spec(MaskKind::fixed, m, 64, 23, 5, -1, 3, 0), m);
}

TEST_CASE("the sparse patterns: row() equals keep() on every key of every tile, where it is exact") {
  // Every (row, tile) of many parameter sets, aligned tiles of 64 and 128 keys and unaligned
  // ones: where row() says `exact`, its keep(j) must be keep() on the tile's keys and false
  // past them. Rows that must have the form: strided and fixed with l a power of two, every
  // longformer row, and bigbird's where the tile spans at most two key blocks.
  std::vector<MaskSpec> specs;
  const Problem any = masked_problem(shape().n(64).d(32));
  for (int l : {1, 3, 16, 64, 100}) specs.push_back(sparse_spec(MaskKind::strided, any, l, 64, 8, -1, 3, 0));
  for (auto [l, c] : {std::pair{1, 0}, std::pair{1, 1}, std::pair{3, 2}, std::pair{16, 0}, std::pair{16, 5},
                      std::pair{16, 16}, std::pair{64, 8}, std::pair{100, 30}})
    specs.push_back(sparse_spec(MaskKind::fixed, any, 64, l, c, -1, 3, 0));
  for (auto [w, g] : {std::pair{0, 0}, std::pair{0, 3}, std::pair{5, 1}, std::pair{40, 7}, std::pair{1000, 2},
                      std::pair{1 << 30, 0}})
    specs.push_back(sparse_spec(MaskKind::longformer, any, 64, 64, 8, g, 3, w));
  for (auto [b, g, r] : {std::tuple{1, 0, 0}, std::tuple{3, 1, 2}, std::tuple{16, 2, 3}, std::tuple{64, 1, 3},
                         std::tuple{64, 0, 8}, std::tuple{100, 0, 2}, std::tuple{128, 2, 3}})
    for (int seed : {5, 11}) {
      MaskSpec s = sparse_spec(MaskKind::bigbird, any, 64, b, 8, g, r, 0);
      s.seed = seed;
      specs.push_back(s);
    }
  long exact = 0, missing = 0, wrong = 0, bigbird_exact = 0;
  for (const auto& [nq, nk] : {std::pair{97, 97}, std::pair{150, 40}, std::pair{40, 150}, std::pair{300, 257},
                               std::pair{257, 300}, std::pair{1, 1}, std::pair{3, 7}, std::pair{7, 2}})
    for (const MaskSpec& spec : specs) {
      const Problem p = masked_problem(shape().n(nq, nk).d(32));
      MaskSpec s = spec;
      finalize_spec(s, p);  // bigbird's key blocks for this Nk
      CAPTURE(s.describe());
      CAPTURE(p.describe());
      visit_policy(s, p, PolicyData{}, [&](const auto& pol) {
        if constexpr (std::is_same_v<std::decay_t<decltype(pol)>, StructuredSparse>) {
          const bool pow2 = (pol.l & (pol.l - 1)) == 0;
          for (auto [bc, offset] : {std::pair{64, 0}, std::pair{128, 0}, std::pair{128, 37}, std::pair{50, 13}})
            for (int j0 = offset; j0 < nk; j0 += bc) {
              const int j1 = std::min(j0 + bc, nk) - 1;
              const bool two_blocks = j1 / pol.l - j0 / pol.l <= 1;
              const bool must = pol.pattern == SparsePattern::longformer ||
                                (pol.pattern == SparsePattern::bigbird ? two_blocks : pow2);
              for (int i = 0; i < nq; ++i) {
                const SparseRow r = pol.row(i, j0, j1);
                missing += must && !r.exact;
                if (!r.exact) continue;
                ++exact;
                bigbird_exact += pol.pattern == SparsePattern::bigbird;
                for (int j = j0; j < j0 + bc + 8; ++j) wrong += r.keep(j) != (j <= j1 && pol.keep_at(i + pol.diag, j));
              }
            }
        } else {
          FAIL("the sparse patterns are one policy type, StructuredSparse");
        }
      });
    }
  CHECK(wrong == 0);
  CHECK(missing == 0);
  CHECK(bigbird_exact > 1000);  // bigbird's rows are not all left to keep()
  CHECK(exact > 100000);
}

TEST_CASE("the sparse patterns: classify() is exact on every tile, and the map counts the kept pairs") {
  for (const auto& [nq, nk] : {std::pair{300, 300}, std::pair{100, 333}, std::pair{333, 100}})
    for (const MaskSpec& s : sparse_specs(shape().n(nq, nk).d(32))) {
      const Problem p = masked_problem(shape().n(nq, nk).d(32));
      for (auto [Br, Bc] : {std::pair{64, 32}, std::pair{128, 64}, std::pair{128, 128}, std::pair{16, 16}}) {
        CAPTURE(s.describe());
        CAPTURE(p.describe());
        CAPTURE(Br);
        CAPTURE(Bc);
        const BlockMap m = build_block_map(s, p, Br, Bc);
        long wrong = 0, pairs = 0;
        visit_policy(s, p, PolicyData{}, [&](const auto& pol) {
          for (int qb = 0; qb < m.tq; ++qb)
            for (int kb = 0; kb < m.tk; ++kb) {
              const TileRange t = tile_range(qb, kb, Br, Bc, p.nq, p.nk);
              wrong += pol.classify(0, 0, t) != classify_by_elements(pol, 0, 0, t);
              for (int i = t.i0; i < t.i1; ++i)
                for (int j = t.j0; j < t.j1; ++j) pairs += pol.keep(0, 0, i, j);
            }
        });
        CHECK(wrong == 0);
        CHECK(m.kept_pairs == doctest::Approx(double(pairs) * p.heads));
        CHECK(mask_flops_forward(s, p, m) == doctest::Approx(2.0 * pairs * p.heads * (p.d + p.dv)));
      }
    }
}

TEST_CASE("the sparse patterns: the CPU model passes the fp64 reference, forward and backward") {
  for (const Problem p : {Problem(shape().batch(2).heads(4, 2).n(200).d(32)), Problem(shape().heads(2).n(70, 260).d(32)),
                          Problem(shape().heads(2).n(260, 70).d(32)), Problem(shape().heads(2).n(5).d(32))})
    for (const MaskSpec& s : sparse_specs(p)) {
      check_model(s, p);
      check_model(s, p, Dist::mean_shifted, 32, 16);
    }
}

TEST_CASE("the sparse patterns: bad parameters are usage errors") {
  const Problem p = masked_problem(shape().n(100).d(32));
  auto bad = [&](MaskKind k, auto set) {
    MaskSpec s;
    s.kind = k;
    set(s);
    CHECK_THROWS_AS(finalize_spec(s, p), UsageError);
  };
  bad(MaskKind::strided, [](MaskSpec& s) { s.stride = 0; });
  bad(MaskKind::fixed, [](MaskSpec& s) { s.block = 0; });
  bad(MaskKind::fixed, [](MaskSpec& s) { s.summary = 65; });
  bad(MaskKind::fixed, [](MaskSpec& s) { s.summary = -1; });
  bad(MaskKind::longformer, [](MaskSpec& s) { s.globals = -2; });
  bad(MaskKind::longformer, [](MaskSpec& s) { s.left = -1; });
  bad(MaskKind::bigbird, [](MaskSpec& s) { s.random = 65; });
  bad(MaskKind::bigbird, [](MaskSpec& s) { s.block = -3; });
  MaskSpec d;
  d.kind = MaskKind::bigbird;
  finalize_spec(d, p);
  CHECK(d.globals == 2);
  d.kind = MaskKind::longformer, d.globals = -1;
  finalize_spec(d, p);
  CHECK(d.globals == 1);
}
