// Chapter 03's contrast: Performer FAVOR+ and Linformer against exact attention.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "chapters/03_fa1/linear_attention.hpp"
#include "common/check.hpp"
#include "common/reference.hpp"
#include "support/run_binary.hpp"

using namespace attn;
using namespace attn::ch03;
using testing_support::run_binary;

namespace {

/// Relative L2 distance of two matrices.
double rel_l2(const MatD& a, const MatD& ref) { return (a - ref).norm() / ref.norm(); }

/// Inputs whose scores are small (q, k scaled by `s`): the regime where FAVOR+'s variance,
/// e^{|x + y|^2} / m relative (the paper's Lemma 2), is small enough to see it fall with m.
void small_inputs(const Problem& p, uint64_t seed, double s, MatD* Q, MatD* K, MatD* V) {
  const AttnInputs in = make_inputs(p, Dist::normal, seed);
  *Q = s * q_matrix(p, in, 0, 0);
  *K = s * k_matrix(p, in, 0, 0);
  *V = v_matrix(p, in, 0, 0);
}

Problem one_head(int n, int d) {
  Problem p;
  p.batch = p.heads = p.kv_heads = 1;
  p.nq = p.nk = n;
  p.d = p.dv = d;
  p.dtype = DType::f32;
  return p;
}

}  // namespace

TEST_CASE("FAVOR+: phi(q).phi(k) is an unbiased estimate of exp(q.k / sqrt d) (Lemma 1)") {
  const int d = 16, m = 16, seeds = 4000;
  Rng rng(7);
  MatD q(1, d), k(1, d);
  for (int t = 0; t < d; ++t) q(0, t) = 0.6 * rng.normal(), k(0, t) = 0.6 * rng.normal();
  const double c = std::pow(double(d), -0.25);
  const double target = std::exp(q.row(0).dot(k.row(0)) / std::sqrt(double(d)));
  double sum = 0, sum2 = 0;
  for (int s = 0; s < seeds; ++s) {
    const MatD W = orthogonal_features(m, d, 1000 + s);
    const FavorFeatures fq = favor_features(c * q, W, true), fk = favor_features(c * k, W, false);
    // Undo the stabilising offsets: the estimator itself.
    const double est = fq.phi.row(0).dot(fk.phi.row(0)) * std::exp(fq.log_offset[0] + fk.log_offset[0]);
    sum += est;
    sum2 += est * est;
  }
  const double mean = sum / seeds, var = sum2 / seeds - mean * mean, se = std::sqrt(var / seeds);
  CAPTURE(target);
  CAPTURE(mean);
  CAPTURE(se);
  CHECK(se > 0);
  CHECK(std::abs(mean - target) < 4 * se);
}

TEST_CASE("orthogonal random features: orthogonal within a block of d, norms of N(0, I_d) vectors") {
  const int d = 32;
  const MatD W = orthogonal_features(80, d, 3);
  for (int a = 0; a < d; ++a)
    for (int b = a + 1; b < d; ++b) CHECK(std::abs(W.row(a).dot(W.row(b))) < 1e-9 * W.row(a).norm() * W.row(b).norm());
  double mean_n2 = 0;
  for (int r = 0; r < 80; ++r) mean_n2 += W.row(r).squaredNorm() / 80;
  CHECK(mean_n2 > 0.7 * d);
  CHECK(mean_n2 < 1.3 * d);
}

TEST_CASE("Performer's error falls about as 1/sqrt(m)") {
  const Problem p = one_head(256, 32);
  std::vector<double> err;
  const std::vector<int> ms = {16, 64, 256, 1024};
  for (const int m : ms) {
    double e = 0;
    for (uint64_t seed = 1; seed <= 6; ++seed) {
      MatD Q, K, V;
      small_inputs(p, seed, 0.3, &Q, &K, &V);
      e += rel_l2(performer_attention(Q, K, V, orthogonal_features(m, p.d, 77 + seed * 13 + m)),
                  exact_attention(Q, K, V)) / 6;
    }
    err.push_back(e);
  }
  // Least-squares slope of log(error) against log(m).
  double sx = 0, sy = 0, sxx = 0, sxy = 0;
  for (std::size_t i = 0; i < ms.size(); ++i) {
    const double x = std::log(double(ms[i])), y = std::log(err[i]);
    sx += x, sy += y, sxx += x * x, sxy += x * y;
  }
  const double n = double(ms.size()), slope = (n * sxy - sx * sy) / (n * sxx - sx * sx);
  CAPTURE(err[0]);
  CAPTURE(err[3]);
  CAPTURE(slope);
  CHECK(slope < -0.35);
  CHECK(slope > -0.75);
  for (std::size_t i = 1; i < err.size(); ++i) CHECK(err[i] < err[i - 1]);
}

namespace {

double max_abs(const MatD& a) { return a.size() ? a.cwiseAbs().maxCoeff() : 0.0; }

/// Q, K, V of one head with nq != nk allowed, fp64, from the seeded inputs.
void head(int nq, int nk, int d, uint64_t seed, double s, MatD* Q, MatD* K, MatD* V) {
  Problem p = one_head(nq, d);
  p.nk = nk;
  const AttnInputs in = make_inputs(p, Dist::normal, seed);
  *Q = s * q_matrix(p, in, 0, 0);
  *K = s * k_matrix(p, in, 0, 0);
  *V = v_matrix(p, in, 0, 0);
}

}  // namespace

TEST_CASE("causal Performer: the prefix sums equal the masked O(N^2) estimator to fp64 rounding") {
  // (nq, nk): square, one row, more keys than queries, and more queries than keys (the first
  // nq - nk rows see no key: 0 in both).
  for (const auto& [nq, nk] : std::vector<std::pair<int, int>>{{1, 1}, {7, 7}, {130, 130}, {50, 130}, {130, 50}}) {
    CAPTURE(nq);
    CAPTURE(nk);
    MatD Q, K, V;
    head(nq, nk, 32, 11 + nq, 1.0, &Q, &K, &V);
    const MatD W = orthogonal_features(96, 32, 5 + nk);
    const MatD prefix = performer_causal_attention(Q, K, V, W);
    const MatD masked = performer_masked_quadratic(Q, K, V, W, /*causal=*/true);
    REQUIRE(prefix.rows() == nq);
    REQUIRE(prefix.cols() == V.cols());
    CHECK(max_abs(prefix - masked) <= 1e-13 * max_abs(masked));
    // The O(N^2) loop is the non-causal Performer when nothing is masked.
    CHECK(max_abs(performer_masked_quadratic(Q, K, V, W, false) - performer_attention(Q, K, V, W)) <=
          1e-13 * max_abs(masked));
    const int off = nk - nq;
    for (int i = 0; i < nq; ++i) {
      CAPTURE(i);
      if (i + off < 0) {
        CHECK(prefix.row(i).norm() == 0.0);  // sees no key
      } else if (i + off == 0) {
        CHECK((prefix.row(i) - V.row(0)).norm() <= 1e-13 * V.row(0).norm());  // one key: its value
      }
    }
    // The last row sees every key: it is the non-causal Performer's last row.
    const MatD full = performer_attention(Q, K, V, W);
    CHECK((prefix.row(nq - 1) - full.row(nq - 1)).norm() <= 1e-13 * full.row(nq - 1).norm());
    if (nq == 130 && nk == 130) {  // and the mask matters: the early rows differ
      CHECK((prefix.row(10) - full.row(10)).norm() > 1e-3 * full.row(10).norm());
    }
  }
}

TEST_CASE("causal Performer: row i does not change when the keys and values after it do") {
  MatD Q, K, V;
  head(64, 64, 32, 21, 1.0, &Q, &K, &V);
  const MatD W = orthogonal_features(64, 32, 9);
  const MatD before = performer_causal_attention(Q, K, V, W);
  const int i0 = 40;
  for (int j = i0 + 1; j < 64; ++j) K.row(j) *= -2.0, V.row(j).array() += 3.0;
  const MatD after = performer_causal_attention(Q, K, V, W);
  // The keys' stabilising offset (a maximum over all keys) moves, but cancels: rounding only.
  CHECK(max_abs(after.topRows(i0 + 1) - before.topRows(i0 + 1)) <= 1e-13 * max_abs(before));
  CHECK(max_abs(after.bottomRows(64 - i0 - 1) - before.bottomRows(64 - i0 - 1)) > 1e-3);
}

TEST_CASE("causal Performer approaches exact causal attention as m grows (small scores)") {
  MatD Q, K, V;
  head(200, 200, 32, 4, 0.3, &Q, &K, &V);
  const MatD exact = exact_attention(Q, K, V, /*causal=*/true);
  double e_small = 0, e_large = 0;
  for (uint64_t seed = 1; seed <= 4; ++seed) {
    e_small += rel_l2(performer_causal_attention(Q, K, V, orthogonal_features(16, 32, 100 + seed)), exact);
    e_large += rel_l2(performer_causal_attention(Q, K, V, orthogonal_features(1024, 32, 200 + seed)), exact);
  }
  CAPTURE(e_small);
  CAPTURE(e_large);
  CHECK(e_large < 0.5 * e_small);  // 1/sqrt(m): 8x fewer at 64x the features, with noise
  CHECK(e_large > 0);
}

TEST_CASE("exact_attention(causal) is the causal fp64 reference") {
  for (const auto& [nq, nk] : std::vector<std::pair<int, int>>{{1, 1}, {33, 33}, {20, 45}, {45, 20}}) {
    CAPTURE(nq);
    CAPTURE(nk);
    Problem p = one_head(nq, 32);
    p.nk = nk;
    p.causal = true;
    const AttnInputs in = make_inputs(p, Dist::mean_shifted, 3);
    const MatD O = exact_attention(q_matrix(p, in, 0, 0), k_matrix(p, in, 0, 0), v_matrix(p, in, 0, 0), true);
    const RefForward ref = reference_forward(p, in, CheckPlan::full(p));
    double worst = 0, scale = 0;
    for (std::size_t r = 0; r < ref.o.rows.size(); ++r)
      for (int c = 0; c < p.dv; ++c) {
        worst = std::max(worst, std::abs(O(int(ref.o.rows[r]), c) - ref.o.row(r)[c]));
        scale = std::max(scale, std::abs(ref.o.row(r)[c]));
      }
    CHECK(scale > 0);
    CHECK(worst <= 1e-13 * scale);
  }
}

TEST_CASE("Linformer with k = N and E = F = I is exact attention, to fp64 precision") {
  for (const int n : {1, 7, 100}) {
    CAPTURE(n);
    const Problem p = one_head(n, 32);
    const AttnInputs in = make_inputs(p, Dist::mean_shifted, 5);
    const MatD Q = q_matrix(p, in, 0, 0), K = k_matrix(p, in, 0, 0), V = v_matrix(p, in, 0, 0);
    const MatD I = MatD::Identity(n, n);
    const MatD O = linformer_attention(Q, K, V, I, I);
    const RefForward ref = reference_forward(p, in, CheckPlan::full(p));
    double worst = 0, scale = 0;
    for (std::size_t r = 0; r < ref.o.rows.size(); ++r)
      for (int c = 0; c < p.dv; ++c) {
        worst = std::max(worst, std::abs(O(int(ref.o.rows[r]), c) - ref.o.row(r)[c]));
        scale = std::max(scale, std::abs(ref.o.row(r)[c]));
      }
    CHECK(worst <= 1e-13 * scale);
    // And with a random projection it is not.
    if (n == 100) {
      const MatD E = linformer_projection(n, n, 1), F = linformer_projection(n, n, 2);
      CHECK(rel_l2(linformer_attention(Q, K, V, E, F), O) > 1e-3);
    }
  }
}

TEST_CASE("planted inputs: each query's chosen keys stand about beta above the row and take most of its weight") {
  Problem p = one_head(512, 64);
  p.dtype = DType::bf16;
  std::vector<std::vector<int>> planted;
  const AttnInputs in = make_planted_inputs(p, 9, kPlantSigmas, &planted);
  REQUIRE(int(planted.size()) == p.nq);
  const MatD Q = q_matrix(p, in, 0, 0), K = k_matrix(p, in, 0, 0);
  const MatD S = (Q * K.transpose()) / 8.0;
  double gap = 0, weight = 0, count = 0;
  for (int i = 0; i < p.nq; ++i) {
    const auto& c = planted[i];
    CHECK(c.size() >= 1);
    CHECK(c.size() <= 4);
    count += double(c.size()) / p.nq;
    double in_sum = 0, out_sum = 0, in_mean = 0;
    for (int j = 0; j < p.nk; ++j) {
      const bool chosen = std::find(c.begin(), c.end(), j) != c.end();
      (chosen ? in_sum : out_sum) += std::exp(S(i, j));
      if (chosen) in_mean += S(i, j) / double(c.size());
    }
    gap += (in_mean - (S.row(i).sum() - in_mean * double(c.size())) / double(p.nk - c.size())) / p.nq;
    weight += in_sum / (in_sum + out_sum) / p.nq;
  }
  CAPTURE(gap);
  CAPTURE(weight);
  CHECK(count > 2.2);  // c uniform in 1..4: 2.5 on average
  CHECK(count < 2.8);
  CHECK(gap > kPlantSigmas - 0.5);
  CHECK(gap < kPlantSigmas + 0.5);
  CHECK(weight > 0.5);
}

TEST_CASE("the study: the exact FA1 model passes the acceptance rule, the approximations fail it") {
  Problem p = one_head(256, 64);
  p.dtype = DType::bf16;
  LinearStudyOptions o;
  o.features = {64};
  o.projections = {64};
  o.crossover_limit = 4096;
  const LinearStudy s = run_linear_study(p, 1, o);
  REQUIRE(s.errors.size() == 10);  // per family: exact, Performer, Linformer, exact causal, causal Performer
  for (const auto& r : s.errors) {
    CAPTURE(r.method);
    CAPTURE(r.family);
    CAPTURE(r.max_abs);
    CAPTURE(r.tolerance);
    CHECK(r.pass == (r.margin <= 1.0));  // the verdict comes from the rule's own numbers
    CHECK(r.pass == (r.param == 0));
    CHECK(r.tolerance > 0);
  }
  // The same outputs judged directly: the study's verdict is the oracle's.
  const AttnInputs in = make_inputs(p, Dist::normal, 1);
  const ForwardOracle oracle(p, in, CheckPlan::full(p));
  std::vector<float> exact(p.o_elems());
  const MatD O = exact_attention(q_matrix(p, in, 0, 0), k_matrix(p, in, 0, 0), v_matrix(p, in, 0, 0));
  for (int i = 0; i < p.nq; ++i)
    for (int c = 0; c < p.dv; ++c) exact[std::size_t(i) * p.dv + c] = float(O(i, c));
  CHECK(oracle.judge(exact).pass());  // fp64 exact attention, rounded once, passes
  // Crossovers: FLOPs at N = 2m + a little (8 N m d against 4 N^2 d, plus 4 N m); causal at
  // N = 4m + a little (the same Performer FLOPs against half of exact's).
  REQUIRE(s.crossovers.size() == 3);
  for (const auto& c : s.crossovers) {
    CAPTURE(c.method);
    const int f = c.method == "causal Performer" ? 4 : 2;
    CHECK(c.n_flops > f * c.param);
    CHECK(c.n_flops < f * c.param + 8);
    CHECK(c.n_bytes > 0);
  }
  CHECK(s.crossovers.back().method == "causal Performer");
}

TEST_CASE("costs: the formulas the README states") {
  const Problem p = one_head(1024, 64);
  CHECK(exact_flops(p) == 4.0 * 1024 * 1024 * 64);
  CHECK(performer_flops(p, 256) == 4.0 * 1024 * 256 * 64 + 4.0 * 1024 * 256 * 65);
  CHECK(linformer_flops(p, 256) == 2.0 * 256 * 1024 * 128 + 4.0 * 1024 * 256 * 64);
  CHECK(exact_bytes(p, 96 * 1024) > performer_bytes(p, 256, 96 * 1024));
  // Causal: the same FLOPs; bytes by slices of the state that fit on chip.
  Problem c = p;
  c.causal = true;
  CHECK(exact_flops(c) == 2.0 * 1024 * 1024 * 64);
  CHECK(performer_causal_flops(c, 256) == performer_flops(p, 256));
  const std::size_t M = 96 * 1024;
  CHECK(performer_causal_state_rows(c, M) == 190);  // 98304 / (4 (64 + 64 + 1))
  const double e = 2.0;                              // bf16 (one_head is f32: set below)
  c.dtype = DType::bf16;
  // m = 64: one pass, Q, K, V, O once and W once.
  CHECK(performer_causal_bytes(c, 64, M) == e * 1024 * 4 * 64 + 4.0 * 64 * 64);
  // m = 1024: 6 passes of Q, K, V, and fp32 partials [O den] out and back between them.
  CHECK(performer_causal_bytes(c, 1024, M) ==
        6 * e * 1024 * 3 * 64 + 4.0 * 1024 * 64 + e * 1024 * 64 + 2.0 * 5 * 4.0 * 1024 * 65);
  // Exact causal bytes: FA1's blocks below the diagonal, fewer than non-causal's.
  Problem cb = c;
  cb.causal = false;
  CHECK(exact_bytes(c, M) < exact_bytes(cb, M));
}

TEST_CASE("ch03_fa1 --linear-study: runs, prints the table and csv lines, and bad input exits 2") {
  const auto r = run_binary(CH03_BINARY, "--linear-study --n 256 --heads 1 --kv-heads 1 --linear-m 64 --linear-k 32");
  CHECK(r.exit_code == 0);
  for (const char* s : {"csv,error,Performer,64,normal", "csv,error,Linformer,32,planted", "csv,crossover,Performer,64",
                        "csv,error,causal Performer,64,planted", "csv,error,exact causal (FA1 model),0,normal",
                        "csv,crossover,causal Performer,64", "csv,cost,causal Performer,64,1024",
                        "csv,cost,exact (FA1),0,1024", "FAIL", "pass"}) {
    CAPTURE(s);
    CHECK(r.out.find(s) != std::string::npos);
  }
  for (const char* args : {"--linear-study --causal --n 256", "--linear-study --n 256 --nk 512",
                           "--linear-study --n 128 --linear-k 256", "--linear-study --linear-m 0",
                           "--linear-study --linear-k x", "--linear-study --linear-m 64,64",
                           "--linear-study --n 256 --linear-m 20000"}) {
    CAPTURE(args);
    const auto b = run_binary(CH03_BINARY, args);
    CHECK(b.exit_code == 2);
    CHECK(b.err_lines() == 1);
  }
}

TEST_CASE("the recorded study (bench/recorded/cpu/ch03_linear_study.txt) is what the binary prints now") {
  const std::string rec = testing_support::slurp(CH03_LINEAR_RECORD);
  REQUIRE(rec.rfind("$ ch03_fa1 ", 0) == 0);
  const std::string args = rec.substr(11, rec.find('\n') - 11);
  const auto r = run_binary(CH03_BINARY, args);
  REQUIRE(r.exit_code == 0);
  // The csv lines, field by field: numbers to 1e-6 relative (another compiler may round an
  // fp64 sum in another order), everything else exactly.
  auto csv = [](const std::string& text) {
    std::vector<std::vector<std::string>> rows;
    std::istringstream in(text);
    for (std::string line; std::getline(in, line);) {
      if (line.rfind("csv,", 0) != 0) continue;
      std::vector<std::string> f;
      std::istringstream ls(line);
      for (std::string x; std::getline(ls, x, ',');) f.push_back(x);
      rows.push_back(f);
    }
    return rows;
  };
  const auto want = csv(rec), got = csv(r.out);
  REQUIRE(want.size() > 20);
  REQUIRE(got.size() == want.size());
  for (std::size_t i = 0; i < want.size(); ++i) {
    REQUIRE(got[i].size() == want[i].size());
    for (std::size_t j = 0; j < want[i].size(); ++j) {
      CAPTURE(i);
      CAPTURE(want[i][j]);
      CAPTURE(got[i][j]);
      char* end = nullptr;
      const double a = std::strtod(want[i][j].c_str(), &end);
      if (want[i][j].find('e') != std::string::npos && end && *end == '\0') {  // a %.6e number
        const double b = std::strtod(got[i][j].c_str(), nullptr);
        CHECK(std::abs(a - b) <= 1e-6 * std::abs(a));
      } else {
        CHECK(got[i][j] == want[i][j]);
      }
    }
  }
}
