// Chapter 06, ring attention on the CPU: the schedule, the merge in LSE form, the
// threads ring against the fp64 reference (forward and backward, every P, layout and
// mask), tree decode, the precision study and the command line.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <set>
#include <string>
#include <vector>

#include "chapters/06_variants/ring/ring_cpu.hpp"
#include "chapters/06_variants/ring/ring_gpu.hpp"
#include "chapters/06_variants/ring/ring_merge.hpp"
#include "chapters/06_variants/ring/ring_schedule.hpp"
#include "common/check.hpp"
#include "common/errors.hpp"
#include "support/run_binary.hpp"
#include "support/shapes.hpp"

using namespace attn;
using namespace attn::ch06::ring;
using testing_support::shape;

namespace {

const Layout kLayouts[] = {Layout::contiguous, Layout::striped, Layout::zigzag};
const int kRanks[] = {1, 2, 3, 4, 8};

/// Every position 0..n-1 is held by exactly one chunk of exactly one rank.
void check_partition(Layout l, int n, int P) {
  std::vector<int> owner(std::size_t(n), -1);
  for (int r = 0; r < P; ++r)
    for (const Chunk& c : shard_chunks(l, n, P, r))
      for (int i = 0; i < c.count; ++i) {
        const int pos = c.position(i);
        REQUIRE(pos >= 0);
        REQUIRE(pos < n);
        CHECK(owner[pos] == -1);
        owner[pos] = r;
      }
  for (int pos = 0; pos < n; ++pos) CHECK(owner[pos] >= 0);
}

/// Brute force: the (query, key) pairs of two chunks that the causal mask keeps.
long long brute_visible(const Chunk& q, const Chunk& k) {
  long long c = 0;
  for (int i = 0; i < q.count; ++i)
    for (int j = 0; j < k.count; ++j) c += k.position(j) <= q.position(i);
  return c;
}

void check_ring(const Problem& p, const RingOptions& o, bool backward = true, Dist dist = Dist::normal) {
  CAPTURE(p.describe());
  CAPTURE(o.ranks);
  CAPTURE(layout_name(o.layout));
  const AttnInputs in = make_inputs(p, dist, 31, backward);
  const ForwardOracle fwd(p, in, CheckPlan::full(p));
  const RingForwardResult f = ring_forward_cpu(p, in, o);
  const CheckResult cf = fwd.judge(f.o, &f.lse);
  CHECK_MESSAGE(cf.pass(), cf.failures());
  if (!backward) return;
  const BackwardOracle bwd(p, in, BackwardPlan::full(p));
  const RingBackwardResult b = ring_backward_cpu(p, in, f.o, f.lse, o);
  const CheckResult cb = bwd.judge(b.dq, b.dk, b.dv);
  CHECK_MESSAGE(cb.pass(), cb.failures());
}

}  // namespace

TEST_CASE("every layout is a partition of the positions, for every P and awkward N") {
  for (Layout l : kLayouts)
    for (int P : {1, 2, 3, 4, 5, 8, 9})
      for (int n : {P, 2 * P - 1, 2 * P + 1, 100, 257}) {
        if (n < P) continue;
        CAPTURE(layout_name(l));
        CAPTURE(P);
        CAPTURE(n);
        check_partition(l, n, P);
      }
}

TEST_CASE("exercise ch06.7: the zigzag shard map holds runs r and 2P - 1 - r of 2P even runs") {
  for (int P : {1, 2, 3, 4, 8})
    for (int n : {16 * P, 16 * P + 3, 2 * P + 1}) {
      CAPTURE(P);
      CAPTURE(n);
      check_partition(Layout::zigzag, n, P);
      for (int r = 0; r < P; ++r) {
        const std::vector<Chunk> c = shard_chunks(Layout::zigzag, n, P, r);
        REQUIRE(c.size() == 2);
        // run r starts at r * (n / 2P) + min(r, n % 2P); its mirror ends where run 2P - 1 - r ends
        const int base = n / (2 * P), rem = n % (2 * P), m = 2 * P - 1 - r;
        CHECK(c[0].start == r * base + std::min(r, rem));
        CHECK(c[0].count == base + (r < rem ? 1 : 0));
        CHECK(c[1].start == m * base + std::min(m, rem));
        CHECK(c[1].count == base + (m < rem ? 1 : 0));
        CHECK(c[0].stride == 1);
        CHECK(c[1].stride == 1);
      }
    }
}

TEST_CASE("at step s rank r holds the K/V of rank (r - s) mod P, and a contiguous causal rank skips s > r") {
  for (int P : {1, 2, 3, 4, 8})
    for (int r = 0; r < P; ++r) {
      std::set<int> seen;
      for (int s = 0; s < P; ++s) {
        const int src = kv_source(r, s, P);
        CHECK(src == ((r - s) % P + P) % P);
        seen.insert(src);
        // the message rank r receives for step s + 1 is what rank r - 1 holds at step s
        CHECK(kv_source(r, s + 1, P) == kv_source((r + P - 1) % P, s, P));
        const StepPlan plan = step_plan(Layout::contiguous, 64 * P + 5, P, r, s, true);
        CHECK(plan.pairs.empty() == (s > r));  // in the future exactly when s > r
        if (s == 0) {
          REQUIRE(plan.pairs.size() == 1);
          CHECK(plan.pairs[0].mask.kind == PairKind::diagonal);
        } else if (s <= r) {
          REQUIRE(plan.pairs.size() == 1);
          CHECK(plan.pairs[0].mask.kind == PairKind::full);
        }
      }
      CHECK(int(seen.size()) == P);  // P - 1 rotations visit every shard once
    }
}

TEST_CASE("exercise ch06.9: each pair's kind and its visible pairs match a brute-force count") {
  for (Layout l : kLayouts)
    for (int P : {1, 2, 3, 4, 8})
      for (int n : {8 * P, 8 * P + 5, 2 * P + 1}) {
        CAPTURE(layout_name(l));
        CAPTURE(P);
        CAPTURE(n);
        for (int r = 0; r < P; ++r)
          for (int s = 0; s < P; ++s) {
            const int src = kv_source(r, s, P);
            for (const Chunk& q : shard_chunks(l, n, P, r))
              for (const Chunk& k : shard_chunks(l, n, P, src)) {
                const PairMask m = classify(q, k, true);
                const long long brute = brute_visible(q, k);
                CHECK(visible_pairs(q, k, m) == brute);
                if (brute == 0) CHECK(m.kind == PairKind::skip);
                if (brute == (long long)q.count * k.count && brute > 0) CHECK(m.kind == PairKind::full);
                if (brute > 0 && brute < (long long)q.count * k.count) CHECK(m.kind == PairKind::diagonal);
                CHECK(classify(q, k, false).kind == PairKind::full);
              }
          }
      }
}

TEST_CASE("the work of every rank adds up to the causal triangle, and zigzag balances it") {
  const int n = 4096, P = 8;
  const long long triangle = (long long)n * (n + 1) / 2;
  double spread[3];
  int k = 0;
  for (Layout l : kLayouts) {
    const auto w = work_table(l, n, P, true);
    long long total = 0, lo = triangle, hi = 0;
    for (const auto& row : w) {
      long long t = 0;
      for (long long x : row) t += x;
      total += t;
      lo = std::min(lo, t);
      hi = std::max(hi, t);
    }
    CHECK(total == triangle);
    spread[k++] = double(hi) / double(lo);
  }
  CHECK(spread[0] > 10.0);   // contiguous: the last rank does ~2P - 1 times the first's work
  CHECK(spread[1] < 1.01);   // striped: within one key per row
  CHECK(spread[2] < 1.001);  // zigzag: exactly balanced when 2P divides N
}

TEST_CASE("exercise ch06.8: two partials merged in LSE form equal attention over the union") {
  // One query row against 12 keys, scores and values by hand, split at every point.
  const int n = 12, dv = 3;
  std::vector<double> x(n), v(n * dv);
  for (int j = 0; j < n; ++j) {
    x[j] = std::sin(1.7 * j) * 4.0 + (j == 5 ? 30.0 : 0.0);  // one dominant score
    for (int c = 0; c < dv; ++c) v[j * dv + c] = std::cos(0.3 * j + c);
  }
  auto attend = [&](int j0, int j1, std::vector<double>& o) {
    if (j0 == j1) {
      o.assign(dv, 0.0);
      return neg_inf<double>();
    }
    double m = neg_inf<double>(), l = 0;
    for (int j = j0; j < j1; ++j) m = std::max(m, x[j]);
    o.assign(dv, 0.0);
    for (int j = j0; j < j1; ++j) {
      const double p = std::exp(x[j] - m);
      l += p;
      for (int c = 0; c < dv; ++c) o[c] += p * v[j * dv + c];
    }
    for (double& oc : o) oc /= l;
    return m + std::log(l);
  };
  std::vector<double> whole;
  const double lse_whole = attend(0, n, whole);
  for (int cut = 0; cut <= n; ++cut) {
    std::vector<double> a, b;
    double la = attend(0, cut, a);
    const double lb = attend(cut, n, b);
    la = merge_lse(a.data(), la, b.data(), lb, dv);
    CHECK(la == doctest::Approx(lse_whole).epsilon(1e-13));
    for (int c = 0; c < dv; ++c) CHECK(a[c] == doctest::Approx(whole[c]).epsilon(1e-12));
  }
  // The identity: an empty partial changes nothing, and two empty ones stay empty (no NaN).
  std::vector<double> o = whole, none(dv, 0.0);
  CHECK(merge_lse(o.data(), lse_whole, none.data(), neg_inf<double>(), dv) == lse_whole);
  for (int c = 0; c < dv; ++c) CHECK(o[c] == whole[c]);
  std::vector<double> e(dv, 0.0);
  CHECK(merge_lse(e.data(), neg_inf<double>(), none.data(), neg_inf<double>(), dv) == neg_inf<double>());
  for (int c = 0; c < dv; ++c) CHECK(e[c] == 0.0);
  // fp32, the type the kernels merge in: the merged O and LSE keep fp32 accuracy.
  std::vector<float> af(whole.begin(), whole.end()), bf(dv);
  std::vector<double> a2, b2;
  const double l1 = attend(0, 7, a2), l2 = attend(7, n, b2);
  for (int c = 0; c < dv; ++c) {
    af[c] = float(a2[c]);
    bf[c] = float(b2[c]);
  }
  const float lf = merge_lse(af.data(), float(l1), bf.data(), float(l2), dv);
  CHECK(lf == doctest::Approx(lse_whole).epsilon(1e-6));
  for (int c = 0; c < dv; ++c) CHECK(af[c] == doctest::Approx(whole[c]).epsilon(1e-5));
}

TEST_CASE("ring equals single-device attention: forward and backward, P 1 2 3 4 8, causal and not") {
  // N = 77: not a multiple of 2P for any P above.
  for (bool causal : {true, false})
    for (Layout l : kLayouts)
      for (int P : kRanks) {
        RingOptions o;
        o.layout = l;
        o.ranks = P;
        check_ring(shape().heads(2).n(77).d(32).causal(causal), o);
      }
}

TEST_CASE("ring equals single-device attention: GQA, several batches, d 64, bf16 and fp16") {
  for (Layout l : kLayouts)
    for (int P : {3, 8}) {
      RingOptions o;
      o.layout = l;
      o.ranks = P;
      check_ring(shape().batch(2).heads(4, 2).n(101).d(64).causal(), o);
      check_ring(shape().heads(4, 1).n(90).d(32).causal().dtype(DType::f16), o);
    }
}

TEST_CASE("ring: awkward inputs and shapes (mean-shifted, outliers, P = N, one token per rank)") {
  RingOptions o;
  o.layout = Layout::zigzag;
  o.ranks = 4;
  check_ring(shape().heads(2).n(130).d(32).causal(), o, true, Dist::mean_shifted);
  check_ring(shape().heads(2).n(130).d(32).causal(), o, true, Dist::outliers);
  for (Layout l : kLayouts) {
    o.layout = l;
    o.ranks = 7;
    check_ring(shape().n(7).d(32).causal(), o);  // P = N
    o.ranks = 5;
    check_ring(shape().n(9).d(32).causal(), o);  // zigzag: N < 2P, some runs empty
  }
}

TEST_CASE("ring rejects what it cannot shard") {
  RingOptions o;
  o.ranks = 0;
  const Problem p = shape().n(16).d(32);
  const AttnInputs in = make_inputs(p, Dist::normal, 1);
  CHECK_THROWS_AS(ring_forward_cpu(p, in, o), UsageError);
  o.ranks = 17;
  CHECK_THROWS_AS(ring_forward_cpu(p, in, o), UsageError);
  o.ranks = 2;
  const Problem cross = shape().n(16, 20).d(32);
  CHECK_THROWS_AS(ring_forward_cpu(cross, make_inputs(cross, Dist::normal, 1), o), UsageError);
}

TEST_CASE("tree decode: one all-reduce of the partials with ⊕ equals attention, on every rank") {
  for (int P : {1, 2, 3, 8})
    for (bool causal : {false, true}) {
      const Problem p = shape().batch(2).heads(4, 2).n(3, 333).d(32).causal(causal);
      CAPTURE(P);
      CAPTURE(causal);
      const AttnInputs in = make_inputs(p, Dist::normal, 5);
      const ForwardOracle oracle(p, in, CheckPlan::full(p));
      const TreeDecodeResult t = tree_decode_cpu(p, in, P);
      const CheckResult c = oracle.judge(t.o, &t.lse);
      CHECK_MESSAGE(c.pass(), c.failures());
      CHECK(t.ranks_agree);
    }
}

TEST_CASE("precision: fp32 accumulators stay within the rule up to P = 64, bf16 merging loses accuracy as P grows") {
  const Problem p = shape().n(512).d(32);
  const auto rows = precision_study(p, {1, 64}, 7);
  REQUIRE(rows.size() == 2);
  CHECK(rows[0].pass_f32);
  CHECK(rows[1].pass_f32);
  // At P = 1 nothing is merged: both accumulators give the same O.
  CHECK(rows[0].o_bf16 == rows[0].o_f32);
  // At P = 64 the bf16 accumulator has rounded O 63 times.
  CHECK(rows[1].o_bf16 > 2.0 * rows[1].o_f32);
  CHECK(rows[1].dkv_bf16 > 2.0 * rows[1].dkv_f32);
}

TEST_CASE("ch06_variants ring: the default run passes, bad --ranks exit 2 with one line") {
  const auto ok = testing_support::run_binary(CH06_BINARY, "ring --device cpu");
  CHECK(ok.exit_code == 0);
  CHECK(ok.out.find("ring forward (threads, P=4, zigzag)") != std::string::npos);
  CHECK(ok.out.find("ring backward") != std::string::npos);
  CHECK(ok.out.find("tree decode") != std::string::npos);
  for (const char* bad : {"--ranks 0", "--ranks -3", "--ranks 101 --n 100", "--layout diagonal", "--n 64 --nk 80",
                          "--backend streams"}) {
    CAPTURE(bad);
    const auto r = testing_support::run_binary(CH06_BINARY, std::string("ring --device cpu ") + bad);
    CHECK(r.exit_code == 2);
    CHECK(r.err_lines() == 1);
  }
  const auto t = testing_support::run_binary(CH06_BINARY, "ring --table --n 64 --ranks 4");
  CHECK(t.exit_code == 0);
  CHECK(t.out.find("zigzag") != std::string::npos);
  const auto j = testing_support::run_binary(CH06_BINARY, "ring --device cpu --n 40 --ranks 3 --layout striped --json");
  CHECK(j.exit_code == 0);
  CHECK(j.out.find("\"pass\": true") != std::string::npos);
  CHECK(j.out.find("\"pass\": false") == std::string::npos);
}

TEST_CASE("the timeline SVG has a lane per rank and stream and an interval per event") {
  std::vector<TimelineEvent> ev = {{0, "compute", 0, "fwd", 0.0, 1.0}, {0, "copy", 0, "kv", 0.1, 0.3},
                                   {1, "compute", 0, "fwd", 0.0, 0.9}, {1, "copy", 1, "dkv", 1.0, 1.2}};
  const std::string svg = timeline_svg(ev, 2, "test");
  CHECK(svg.rfind("<svg", 0) == 0);
  CHECK(svg.find("</svg>") != std::string::npos);
  CHECK(svg.find("rank 1 copy") != std::string::npos);
  std::size_t rects = 0;
  for (std::size_t at = svg.find("<title>rank"); at != std::string::npos; at = svg.find("<title>rank", at + 1)) ++rects;
  CHECK(rects == ev.size());
}

TEST_CASE("a copy is exposed only for as long as the step that needs it waits for it") {
  const std::vector<TimelineEvent> ev = {
      {0, "compute", 0, "fwd", 0.0, 1.0}, {0, "compute", 1, "fwd", 1.2, 2.0},
      {0, "copy", 0, "kv", 0.5, 1.1},  // ends 0.1 after forward step 0: 0.1 exposed
      {1, "compute", 0, "fwd", 0.3, 1.0},
      {1, "copy", 0, "kv", 0.0, 0.2},  // done before its step even started: hidden
      {0, "compute", 0, "bwd", 3.0, 4.0}, {0, "compute", 1, "bwd", 4.5, 5.5},
      {0, "copy", 0, "kv-bwd", 3.1, 3.5},  // hidden behind backward step 0
      {0, "copy", 0, "dkv", 4.1, 4.6},     // waited for after step 1: hidden
      {0, "copy", 1, "dkv", 5.5, 5.8},     // home after the last step: all exposed
  };
  const CopyHiding h = copy_hiding(ev);
  CHECK(h.fwd_copy_ms == doctest::Approx(0.8));
  CHECK(h.fwd_exposed_ms == doctest::Approx(0.1));
  CHECK(h.bwd_copy_ms == doctest::Approx(0.4 + 0.5 + 0.3));
  CHECK(h.bwd_exposed_ms == doctest::Approx(0.3));
}
