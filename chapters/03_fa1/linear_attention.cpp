#include "linear_attention.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <sstream>

#include "common/check.hpp"
#include "common/cli.hpp"
#include "common/dtype.hpp"
#include "fa1_blocks.hpp"
#include "fa1_model.hpp"

namespace attn::ch03 {

namespace {

/// Seeds of the random matrices, apart from the inputs' (which use streams 1-4 of `seed`).
uint64_t mix(uint64_t seed, uint64_t a, uint64_t b) {
  Rng r(seed ^ (0x9E3779B97F4A7C15ull * (a + 1)) ^ (0xD1B54A32D192ED03ull * (b + 7)));
  return r.next_u64();
}

MatD rows_to_double(const std::vector<float>& x, std::size_t off, int rows, int cols) {
  MatD m(rows, cols);
  for (int i = 0; i < rows; ++i)
    for (int c = 0; c < cols; ++c) m(i, c) = double(x[off + std::size_t(i) * cols + c]);
  return m;
}

}  // namespace

MatD orthogonal_features(int m, int d, uint64_t seed) {
  Rng rng(seed);
  MatD W(m, d);
  for (int r0 = 0; r0 < m; r0 += d) {
    Eigen::MatrixXd G(d, d);
    for (int i = 0; i < d; ++i)
      for (int j = 0; j < d; ++j) G(i, j) = rng.normal();
    const Eigen::HouseholderQR<Eigen::MatrixXd> qr(G);
    Eigen::MatrixXd Qm = qr.householderQ();
    // Householder QR fixes the sign of R's diagonal by G's entries; undoing it (Q diag(sign R))
    // makes Q Haar-distributed, so that each column is uniform on the sphere. Without it
    // Q(0, 0) <= 0 always, and the estimator is biased (the unbiasedness test sees it).
    for (int j = 0; j < d; ++j)
      if (qr.matrixQR()(j, j) < 0) Qm.col(j) = -Qm.col(j);
    for (int r = r0; r < std::min(m, r0 + d); ++r) {
      double norm2 = 0;  // the norm of an independent N(0, I_d) vector
      for (int j = 0; j < d; ++j) {
        const double g = rng.normal();
        norm2 += g * g;
      }
      W.row(r) = std::sqrt(norm2) * Qm.col(r - r0).transpose();
    }
  }
  return W;
}

FavorFeatures favor_features(const MatD& X, const MatD& W, bool per_row) {
  const int m = int(W.rows());
  FavorFeatures f;
  MatD proj = X * W.transpose();  // w_r^T x
  const Eigen::VectorXd half_norm = 0.5 * X.rowwise().squaredNorm();
  f.log_offset.resize(X.rows());
  const double global = proj.size() ? proj.maxCoeff() : 0.0;
  for (Eigen::Index i = 0; i < X.rows(); ++i) f.log_offset[i] = per_row ? proj.row(i).maxCoeff() : global;
  f.phi.resize(X.rows(), m);
  const double inv_sqrt_m = 1.0 / std::sqrt(double(m));
  for (Eigen::Index i = 0; i < X.rows(); ++i)
    for (int r = 0; r < m; ++r) f.phi(i, r) = std::exp(proj(i, r) - half_norm[i] - f.log_offset[i]) * inv_sqrt_m;
  return f;
}

MatD performer_attention(const MatD& Q, const MatD& K, const MatD& V, const MatD& W) {
  const double c = std::pow(double(Q.cols()), -0.25);
  const FavorFeatures fq = favor_features(c * Q, W, /*per_row=*/true);
  const FavorFeatures fk = favor_features(c * K, W, /*per_row=*/false);
  const MatD kv = fk.phi.transpose() * V;                        // m x dv
  const Eigen::VectorXd z = fk.phi.transpose().rowwise().sum();  // m
  MatD O = fq.phi * kv;
  const Eigen::VectorXd den = fq.phi * z;
  for (Eigen::Index i = 0; i < O.rows(); ++i) O.row(i) /= den[i];
  return O;
}

MatD performer_causal_attention(const MatD& Q, const MatD& K, const MatD& V, const MatD& W) {
  const double c = std::pow(double(Q.cols()), -0.25);
  const FavorFeatures fq = favor_features(c * Q, W, /*per_row=*/true);
  const FavorFeatures fk = favor_features(c * K, W, /*per_row=*/false);
  const Eigen::Index nq = Q.rows(), nk = K.rows(), off = nk - nq;
  MatD S = MatD::Zero(W.rows(), V.cols());  // running sum of phi(k_j) v_j^T
  Eigen::VectorXd z = Eigen::VectorXd::Zero(W.rows());  // running sum of phi(k_j)
  MatD O = MatD::Zero(nq, V.cols());
  Eigen::Index next = 0;  // the first key not yet in S and z
  for (Eigen::Index i = 0; i < nq; ++i) {
    for (; next < nk && next <= i + off; ++next) {
      S.noalias() += fk.phi.row(next).transpose() * V.row(next);
      z += fk.phi.row(next).transpose();
    }
    if (next == 0) continue;  // sees no key
    O.row(i) = (fq.phi.row(i) * S) / fq.phi.row(i).dot(z);
  }
  return O;
}

MatD performer_masked_quadratic(const MatD& Q, const MatD& K, const MatD& V, const MatD& W, bool causal) {
  const double c = std::pow(double(Q.cols()), -0.25);
  const FavorFeatures fq = favor_features(c * Q, W, /*per_row=*/true);
  const FavorFeatures fk = favor_features(c * K, W, /*per_row=*/false);
  const Eigen::Index nq = Q.rows(), nk = K.rows(), off = nk - nq;
  MatD O = MatD::Zero(nq, V.cols());
  for (Eigen::Index i = 0; i < nq; ++i) {
    double den = 0;
    for (Eigen::Index j = 0; j < nk; ++j) {
      if (causal && j > i + off) continue;  // the mask, one entry at a time
      const double a = fq.phi.row(i).dot(fk.phi.row(j));
      O.row(i) += a * V.row(j);
      den += a;
    }
    if (den > 0) O.row(i) /= den;
  }
  return O;
}

MatD linformer_projection(int k, int n, uint64_t seed) {
  Rng rng(seed);
  MatD E(k, n);
  const double s = 1.0 / std::sqrt(double(k));
  for (int i = 0; i < k; ++i)
    for (int j = 0; j < n; ++j) E(i, j) = s * rng.normal();
  return E;
}

MatD exact_attention(const MatD& Q, const MatD& K, const MatD& V, bool causal) {
  const double tau = 1.0 / std::sqrt(double(Q.cols()));
  MatD S = tau * (Q * K.transpose());
  const Eigen::Index off = K.rows() - Q.rows();
  for (Eigen::Index i = 0; i < S.rows(); ++i) {
    const Eigen::Index seen = causal ? std::clamp<Eigen::Index>(i + off + 1, 0, S.cols()) : S.cols();
    S.row(i).tail(S.cols() - seen).setZero();
    if (seen == 0) continue;
    const double mx = S.row(i).head(seen).maxCoeff();
    double l = 0;
    for (Eigen::Index j = 0; j < seen; ++j) l += (S(i, j) = std::exp(S(i, j) - mx));
    S.row(i) /= l;
  }
  return S * V;
}

MatD linformer_attention(const MatD& Q, const MatD& K, const MatD& V, const MatD& E, const MatD& F) {
  return exact_attention(Q, E * K, F * V);
}

MatD q_matrix(const Problem& p, const AttnInputs& in, int b, int h) { return rows_to_double(in.q, p.q_off(b, h), p.nq, p.d); }
MatD k_matrix(const Problem& p, const AttnInputs& in, int b, int hk) { return rows_to_double(in.k, p.k_off(b, hk), p.nk, p.d); }
MatD v_matrix(const Problem& p, const AttnInputs& in, int b, int hk) { return rows_to_double(in.v, p.v_off(b, hk), p.nk, p.dv); }

AttnInputs make_planted_inputs(const Problem& p, uint64_t seed, double beta, std::vector<std::vector<int>>* planted) {
  AttnInputs in = make_inputs(p, Dist::normal, seed);
  Rng rng(mix(seed, 11, 0));
  const double sd = std::sqrt(double(p.d));
  for (int b = 0; b < p.batch; ++b)
    for (int h = 0; h < p.heads; ++h) {
      const std::size_t qo = p.q_off(b, h), ko = p.k_off(b, p.kv_head_of(h));
      for (int i = 0; i < p.nq; ++i) {
        const int c = std::min(rng.range(1, 4), p.nk);
        std::vector<int> chosen;
        while (int(chosen.size()) < c) {
          const int j = rng.range(0, p.nk - 1);
          if (std::find(chosen.begin(), chosen.end(), j) == chosen.end()) chosen.push_back(j);
        }
        if (planted) planted->push_back(chosen);
        std::vector<double> q(p.d);
        for (int t = 0; t < p.d; ++t) q[t] = in.q[qo + std::size_t(i) * p.d + t];
        for (const int j : chosen) {
          const float* kj = in.k.data() + ko + std::size_t(j) * p.d;
          double n2 = 0;
          for (int t = 0; t < p.d; ++t) n2 += double(kj[t]) * kj[t];
          if (n2 == 0) continue;
          for (int t = 0; t < p.d; ++t) q[t] += beta * sd * kj[t] / n2;
        }
        for (int t = 0; t < p.d; ++t) in.q[qo + std::size_t(i) * p.d + t] = round_to(p.dtype, float(q[t]));
      }
    }
  return in;
}

// ---- costs ----

double exact_flops(const Problem& p) { return flops_forward(p); }

double exact_bytes(const Problem& p, std::size_t sram_bytes) {
  return fa1_forward_traffic(p, forward_blocks(p, sram_bytes)).total();
}

double performer_flops(const Problem& p, int m) {
  const double bh = double(p.batch) * p.heads;
  return bh * (2.0 * p.nq * m * p.d + 2.0 * p.nk * m * p.d + 2.0 * p.nk * m * (p.dv + 1) + 2.0 * p.nq * m * (p.dv + 1));
}

double performer_bytes(const Problem& p, int m, std::size_t sram_bytes) {
  const double e = dtype_bytes(p.dtype), bh = double(p.batch) * p.heads;
  const int tiles = ceil_div(p.nq, forward_blocks(p, sram_bytes).Br);
  const double io = e * (double(p.nq) * (p.d + p.dv) + double(p.nk) * (p.d + p.dv));
  const double w = 2.0 * 4.0 * m * p.d;
  const double state = 4.0 * m * (p.dv + 1.0) * (1.0 + tiles);
  return bh * (io + w + state);
}

double performer_causal_flops(const Problem& p, int m) { return performer_flops(p, m); }

int performer_causal_state_rows(const Problem& p, std::size_t sram_bytes) {
  return int(sram_bytes / (4 * std::size_t(p.d + p.dv + 1)));
}

double performer_causal_bytes(const Problem& p, int m, std::size_t sram_bytes) {
  const double e = dtype_bytes(p.dtype), bh = double(p.batch) * p.heads;
  const int slices = ceil_div(m, std::max(1, performer_causal_state_rows(p, sram_bytes)));
  const double qkv = e * (double(p.nq) * p.d + double(p.nk) * (p.d + p.dv));  // every pass
  const double partials = 4.0 * double(p.nq) * (p.dv + 1.0);               // [O~ den], fp32
  return bh * (slices * qkv + 4.0 * m * p.d + e * double(p.nq) * p.dv + 2.0 * (slices - 1) * partials);
}

double linformer_flops(const Problem& p, int k) {
  Problem a = p;
  a.nk = k;
  const double bh = double(p.batch) * p.heads;
  return bh * 2.0 * k * double(p.nk) * (p.d + p.dv) + flops_forward(a);
}

double linformer_bytes(const Problem& p, int k, std::size_t sram_bytes) {
  const double e = dtype_bytes(p.dtype), bh = double(p.batch) * p.heads;
  Problem a = p;
  a.nk = k;
  const double pass1 = e * (double(p.nk) * (p.d + p.dv) + 2.0 * k * double(p.nk) + double(k) * (p.d + p.dv));
  return bh * pass1 + exact_bytes(a, sram_bytes);
}

// ---- the study ----

namespace {

StudyErrorRow judged(const std::string& method, int param, const std::string& family, const ForwardOracle& oracle,
                     const std::vector<float>& o) {
  const CheckResult c = oracle.judge(o);
  StudyErrorRow r;
  r.method = method;
  r.param = param;
  r.family = family;
  r.max_abs = c.max_abs();
  r.rel_l2 = c.rel_l2();
  r.tolerance = c.tensors.at(0).verdict.tolerance;
  r.margin = c.tensors.at(0).verdict.margin;
  r.pass = c.pass();
  return r;
}

/// The smallest N in [lo, limit] from which `cheaper(N)` holds up to the limit; -1 if none.
template <class F>
int crossover(int lo, int limit, F cheaper) {
  int n = limit;
  if (!cheaper(n)) return -1;
  while (n - 1 >= lo && cheaper(n - 1)) --n;
  return n;
}

}  // namespace

LinearStudy run_linear_study(const Problem& p, uint64_t seed, const LinearStudyOptions& o) {
  if (p.causal) throw UsageError("--linear-study takes a non-causal problem and adds the causal part itself: drop --causal");
  if (p.nq != p.nk) throw UsageError("--linear-study needs --nk equal to --n");
  for (const int k : o.projections)
    if (k > p.nk) throw UsageError("--linear-k " + std::to_string(k) + " exceeds N = " + std::to_string(p.nk));
  Problem pc = p;
  pc.causal = true;
  LinearStudy s;
  for (const std::string family : {"normal", "planted"}) {
    const AttnInputs in = family == "normal" ? make_inputs(p, Dist::normal, seed) : make_planted_inputs(p, seed);
    const ForwardOracle oracle(p, in, CheckPlan::full(p));
    // Exact and IO-aware: chapter 03's model of Algorithm 1, in the problem's precision.
    const Fa1ForwardResult fa1 = fa1_forward_model(p, in, o.sram_bytes);
    s.errors.push_back(judged("exact (FA1 model)", 0, family, oracle, fa1.o));
    auto approx = [&](const std::string& method, int param, const ForwardOracle& judge, auto&& one_head) {
      std::vector<float> out(p.o_elems());
      for (int b = 0; b < p.batch; ++b)
        for (int h = 0; h < p.heads; ++h) {
          const int hk = p.kv_head_of(h);
          const MatD O = one_head(q_matrix(p, in, b, h), k_matrix(p, in, b, hk), v_matrix(p, in, b, hk), b, h);
          for (int i = 0; i < p.nq; ++i)
            for (int c = 0; c < p.dv; ++c) out[p.o_off(b, h) + std::size_t(i) * p.dv + c] = float(O(i, c));
        }
      s.errors.push_back(judged(method, param, family, judge, out));
    };
    auto features = [&](int m, int b, int h) { return orthogonal_features(m, p.d, mix(seed, 1000 + b * p.heads + h, m)); };
    for (const int m : o.features)
      approx("Performer", m, oracle, [&](const MatD& Q, const MatD& K, const MatD& V, int b, int h) {
        return performer_attention(Q, K, V, features(m, b, h));
      });
    for (const int k : o.projections)
      approx("Linformer", k, oracle, [&](const MatD& Q, const MatD& K, const MatD& V, int b, int h) {
        const uint64_t key = 2000 + b * p.heads + h;
        return linformer_attention(Q, K, V, linformer_projection(k, p.nk, mix(seed, key, 2 * k)),
                                   linformer_projection(k, p.nk, mix(seed, key, 2 * k + 1)));
      });
    // Causal: the same inputs and the same random features, judged against the causal reference.
    const ForwardOracle causal_oracle(pc, in, CheckPlan::full(pc));
    s.errors.push_back(judged("exact causal (FA1 model)", 0, family, causal_oracle,
                              fa1_forward_model(pc, in, o.sram_bytes).o));
    for (const int m : o.features)
      approx("causal Performer", m, causal_oracle, [&](const MatD& Q, const MatD& K, const MatD& V, int b, int h) {
        return performer_causal_attention(Q, K, V, features(m, b, h));
      });
  }

  auto at = [&](int n, bool causal = false) {
    Problem a = p;
    a.nq = a.nk = n;
    a.causal = causal;
    return a;
  };
  for (int n = 64; n <= 65536; n *= 2) {
    const Problem a = at(n), ac = at(n, true);
    s.costs.push_back({"exact (FA1)", 0, n, exact_flops(a), exact_bytes(a, o.sram_bytes)});
    for (const int m : o.features)
      s.costs.push_back({"Performer", m, n, performer_flops(a, m), performer_bytes(a, m, o.sram_bytes)});
    for (const int k : o.projections)
      if (k <= n) s.costs.push_back({"Linformer", k, n, linformer_flops(a, k), linformer_bytes(a, k, o.sram_bytes)});
    s.costs.push_back({"exact causal (FA1)", 0, n, exact_flops(ac), exact_bytes(ac, o.sram_bytes)});
    for (const int m : o.features)
      s.costs.push_back({"causal Performer", m, n, performer_causal_flops(ac, m),
                         performer_causal_bytes(ac, m, o.sram_bytes)});
  }
  const int lim = o.crossover_limit;
  std::vector<double> ef(lim + 1), eb(lim + 1), cf(lim + 1), cb(lim + 1);
  for (int n = 1; n <= lim; ++n) {
    ef[n] = exact_flops(at(n));
    eb[n] = exact_bytes(at(n), o.sram_bytes);
    cf[n] = exact_flops(at(n, true));
    cb[n] = exact_bytes(at(n, true), o.sram_bytes);
  }
  for (const int m : o.features) {
    StudyCrossover c{"Performer", m};
    c.n_flops = crossover(1, lim, [&](int n) { return performer_flops(at(n), m) < ef[n]; });
    c.n_bytes = crossover(1, lim, [&](int n) { return performer_bytes(at(n), m, o.sram_bytes) < eb[n]; });
    s.crossovers.push_back(c);
  }
  for (const int k : o.projections) {
    StudyCrossover c{"Linformer", k};
    c.n_flops = crossover(k, lim, [&](int n) { return linformer_flops(at(n), k) < ef[n]; });
    c.n_bytes = crossover(k, lim, [&](int n) { return linformer_bytes(at(n), k, o.sram_bytes) < eb[n]; });
    s.crossovers.push_back(c);
  }
  for (const int m : o.features) {
    StudyCrossover c{"causal Performer", m};
    c.n_flops = crossover(1, lim, [&](int n) { return performer_causal_flops(at(n, true), m) < cf[n]; });
    c.n_bytes = crossover(1, lim, [&](int n) { return performer_causal_bytes(at(n, true), m, o.sram_bytes) < cb[n]; });
    s.crossovers.push_back(c);
  }
  return s;
}

std::string format_linear_study(const Problem& p, uint64_t seed, const LinearStudyOptions& o, const LinearStudy& s) {
  std::ostringstream out;
  char buf[512];
  out << "linear-attention study: " << p.describe() << ", seed " << seed << ", M = " << o.sram_bytes
      << " B; O against the fp64 reference on every row, judged by the acceptance rule\n";
  out << "planted: each query gets 1-4 keys whose score is raised by " << kPlantSigmas
      << " standard deviations (make_planted_inputs)\n";
  out << "causal: the same inputs and random features under the causal mask, against the causal fp64 reference; "
         "causal Performer by prefix sums\n\n";
  std::snprintf(buf, sizeof buf, "%-24s %6s %-8s %10s %10s %10s %8s %s\n", "method", "m|k", "inputs", "max abs",
                "rel L2", "tolerance", "margin", "rule");
  out << buf;
  for (const auto& r : s.errors) {
    std::snprintf(buf, sizeof buf, "%-24s %6d %-8s %10.3e %10.3e %10.3e %8.3g %s\n", r.method.c_str(), r.param,
                  r.family.c_str(), r.max_abs, r.rel_l2, r.tolerance, r.margin, r.pass ? "pass" : "FAIL");
    out << buf;
  }
  out << "\nFLOPs: exact 4 N^2 d (causal: halved); Performer and causal Performer 4 N m d + 4 N m (dv+1); "
         "Linformer 2 k N (d+dv) + 4 N k d\n";
  out << "bytes: exact = FA1's traffic model (causal: its visited blocks); Performer = Q, K, V, O once + W twice + "
         "state m(dv+1) fp32 written once, read per B_r query tile; Linformer = K, V, E, F read + EK, FV written + "
         "FA1 at Nk = k\n";
  const int ms = performer_causal_state_rows(p, o.sram_bytes);
  out << "causal Performer bytes: the state stays on chip in slices of m_s = " << ms
      << " feature rows; s = ceil(m / m_s) passes, each reads Q, K, V, fp32 partials [O den] (N(dv+1)) "
         "written and read between passes, W and O once (s:";
  for (std::size_t i = 0; i < o.features.size(); ++i)
    out << (i ? ", " : " ") << "m = " << o.features[i] << " -> " << ceil_div(o.features[i], std::max(1, ms));
  out << ")\n";
  out << "crossover (the smallest N from which it stays cheaper than exact, causal ones than exact causal, N <= "
      << o.crossover_limit << "):\n";
  for (const auto& c : s.crossovers) {
    std::snprintf(buf, sizeof buf, "  %-16s %5d  FLOPs from N = %d, bytes from N = %d\n", c.method.c_str(), c.param,
                  c.n_flops, c.n_bytes);
    out << buf;
  }
  out << "\n";
  for (const auto& r : s.errors) {
    std::snprintf(buf, sizeof buf, "csv,error,%s,%d,%s,%.6e,%.6e,%.6e,%.6e,%d\n", r.method.c_str(), r.param,
                  r.family.c_str(), r.max_abs, r.rel_l2, r.tolerance, r.margin, r.pass ? 1 : 0);
    out << buf;
  }
  for (const auto& r : s.costs) {
    std::snprintf(buf, sizeof buf, "csv,cost,%s,%d,%d,%.6e,%.6e\n", r.method.c_str(), r.param, r.n, r.flops, r.bytes);
    out << buf;
  }
  for (const auto& c : s.crossovers) {
    std::snprintf(buf, sizeof buf, "csv,crossover,%s,%d,%d,%d\n", c.method.c_str(), c.param, c.n_flops, c.n_bytes);
    out << buf;
  }
  return out.str();
}

}  // namespace attn::ch03
