#include "common/reference.hpp"

#include <Eigen/Dense>
#include <algorithm>
#include <cmath>
#include <limits>
#include <sstream>

#include "common/parallel.hpp"

namespace attn {
namespace {

using Mat = Eigen::Matrix<double, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
constexpr double kNegInf = -std::numeric_limits<double>::infinity();
constexpr int kRowChunk = 256;  // query rows per fp64 block: S chunk is kRowChunk x nk

/// rows x cols block of a float tensor starting at `off` (row stride cols), as fp64.
Mat load_rows(const std::vector<float>& x, std::size_t off, const std::vector<int>& rows, int cols) {
  Mat m(rows.size(), cols);
  for (std::size_t r = 0; r < rows.size(); ++r)
    for (int c = 0; c < cols; ++c) m(r, c) = x[off + std::size_t(rows[r]) * cols + c];
  return m;
}

Mat load_all(const std::vector<float>& x, std::size_t off, int rows, int cols) {
  Mat m(rows, cols);
  for (int r = 0; r < rows; ++r)
    for (int c = 0; c < cols; ++c) m(r, c) = x[off + std::size_t(r) * cols + c];
  return m;
}

std::vector<int> iota_rows(int n) {
  std::vector<int> r(n);
  for (int i = 0; i < n; ++i) r[i] = i;
  return r;
}

/// Scores of `rows` of head (b, h) against all keys, masked (-inf) and modified.
/// `raw` receives the unmodified tau*q.k (for the modifier's gradient).
void scores(const Problem& p, const ScoreMod* mod, int b, int h, const std::vector<int>& rows,
            const Mat& q, const Mat& k, Mat& x, Mat* raw) {
  const double tau = p.softmax_scale();
  x.noalias() = tau * q * k.transpose();
  if (raw) *raw = x;
  for (std::size_t r = 0; r < rows.size(); ++r) {
    const int i = rows[r];
    for (int j = 0; j < p.nk; ++j) {
      if (!p.visible(i, j) || (mod && !mod->keep(p, b, h, i, j)))
        x(r, j) = kNegInf;
      else if (mod)
        x(r, j) = mod->apply(p, b, h, i, j, x(r, j));
    }
  }
}

/// Row softmax in place; returns the LSE of each row (-inf for an empty row, whose P is 0).
/// A finite `sink` adds e^sink to every row's denominator (ScoreMod::sink).
Eigen::VectorXd softmax_rows(Mat& x, double sink = kNegInf) {
  Eigen::VectorXd lse(x.rows());
  for (Eigen::Index r = 0; r < x.rows(); ++r) {
    const double m = std::max(x.row(r).maxCoeff(), sink);
    if (m == kNegInf) {
      x.row(r).setZero();
      lse(r) = kNegInf;
      continue;
    }
    double l = sink == kNegInf ? 0.0 : std::exp(sink - m);
    for (Eigen::Index j = 0; j < x.cols(); ++j) {
      x(r, j) = std::exp(x(r, j) - m);
      l += x(r, j);
    }
    x.row(r) /= l;
    lse(r) = m + std::log(l);
  }
  return lse;
}

template <class T>
void init_rows(CheckedRows<T>& c, int width) {
  c.width = width;
  c.rows.clear();
  c.values.clear();
}

/// Global row indices of (b, h, rows) in a [B][H][N] tensor.
void append_rows(std::vector<std::size_t>& out, std::size_t head_base, const std::vector<int>& rows) {
  for (int i : rows) out.push_back(head_base + std::size_t(i));
}

/// The rows a backward plan covers: dQ rows of every query head of each KV group,
/// dK and dV rows of its KV head; values zeroed.
template <class T>
void backward_rows(const Problem& p, const BackwardPlan& plan, CheckedRows<T>& dq, CheckedRows<T>& dk,
                   CheckedRows<T>& dv) {
  init_rows(dq, p.d);
  init_rows(dk, p.d);
  init_rows(dv, p.dv);
  const int g = p.group();
  const std::vector<int> all_q = iota_rows(p.nq), all_k = iota_rows(p.nk);
  for (auto [b, hk] : plan.kv_groups) {
    for (int h = hk * g; h < (hk + 1) * g; ++h)
      append_rows(dq.rows, (std::size_t(b) * p.heads + h) * p.nq, all_q);
    append_rows(dk.rows, (std::size_t(b) * p.kv_heads + hk) * p.nk, all_k);
  }
  dv.rows = dk.rows;
  dq.values.assign(dq.rows.size() * p.d, T(0));
  dk.values.assign(dk.rows.size() * p.d, T(0));
  dv.values.assign(dv.rows.size() * p.dv, T(0));
}

std::vector<int> chunk(const std::vector<int>& rows, std::size_t begin) {
  const std::size_t end = std::min(rows.size(), begin + kRowChunk);
  return std::vector<int>(rows.begin() + begin, rows.begin() + end);
}

}  // namespace

// ----------------------------------------------------------------------------- plans

CheckPlan CheckPlan::full(const Problem& p) {
  CheckPlan c;
  for (int b = 0; b < p.batch; ++b)
    for (int h = 0; h < p.heads; ++h) c.heads.emplace_back(b, h);
  c.rows = iota_rows(p.nq);
  return c;
}

CheckPlan CheckPlan::sampled(const Problem& p, double budget_flops) {
  CheckPlan c = full(p);
  const double per_row = 2.0 * p.nk * (p.d + p.dv);
  if (per_row * double(c.heads.size()) * p.nq <= budget_flops) return c;
  // Every (batch, head) pair is checked, on the same rows: 0, 1, the last two, and evenly
  // spaced ones between, as many as the budget allows over all heads, never fewer than 8
  // a head (a problem with many heads may cost more than the budget; a head left out
  // would be checked for NaN only).
  const long nr = std::clamp<long>(long(budget_flops / (per_row * double(c.heads.size()))), std::min(8, p.nq), p.nq);
  std::vector<int> rows = {0, std::min(1, p.nq - 1), std::max(0, p.nq - 2), p.nq - 1};
  for (long k = 0; k < nr; ++k) rows.push_back(int((long(p.nq - 1) * k) / std::max(1L, nr - 1)));
  std::sort(rows.begin(), rows.end());
  rows.erase(std::unique(rows.begin(), rows.end()), rows.end());
  c.rows = rows;
  return c;
}

bool CheckPlan::covers_everything(const Problem& p) const {
  return int(heads.size()) == p.batch * p.heads && int(rows.size()) == p.nq;
}

std::string CheckPlan::describe(const Problem& p) const {
  if (covers_everything(p)) return "all rows checked";
  std::ostringstream s;
  s << rows.size() << " of " << p.nq << " rows (0, 1, " << p.nq - 2 << ", " << p.nq - 1 << " and spread between) in "
    << heads.size() << " of " << p.batch * p.heads << " (batch, head) pairs checked in fp64 (sampled); every element "
    << "checked for NaN";
  return s.str();
}

BackwardPlan BackwardPlan::full(const Problem& p) {
  BackwardPlan c;
  for (int b = 0; b < p.batch; ++b)
    for (int hk = 0; hk < p.kv_heads; ++hk) c.kv_groups.emplace_back(b, hk);
  return c;
}

BackwardPlan BackwardPlan::sampled(const Problem& p, double budget_flops) {
  BackwardPlan c = full(p);
  const double per_group = 2.0 * 5.0 * p.nq * double(p.nk) * p.d * p.group();
  const int total = int(c.kv_groups.size());
  // The first and the last KV group and one in the middle at least (each needs all N x N
  // pairs of its heads, so a large problem may cost more than the budget), more spread
  // evenly between them as the budget allows.
  const int keep = std::clamp(int(budget_flops / per_group), std::min(total, 3), total);
  if (keep == total) return c;
  BackwardPlan s;
  for (int k = 0; k < keep; ++k) {
    const int g = int((long(total - 1) * k) / (keep - 1));
    s.kv_groups.push_back(c.kv_groups[g]);
  }
  return s;
}

bool BackwardPlan::covers_everything(const Problem& p) const {
  return int(kv_groups.size()) == p.batch * p.kv_heads;
}

std::string BackwardPlan::describe(const Problem& p) const {
  if (covers_everything(p)) return "all KV groups checked";
  std::ostringstream s;
  s << kv_groups.size() << " of " << p.batch * p.kv_heads << " KV groups (batch, KV head) checked in fp64 (sampled: ";
  for (std::size_t k = 0; k < kv_groups.size(); ++k)
    s << (k ? ", " : "") << "(" << kv_groups[k].first << ", " << kv_groups[k].second << ")";
  s << "); every element checked for NaN";
  return s.str();
}

// ----------------------------------------------------------------------------- fp64 forward

RefForward reference_forward(const Problem& p, const AttnInputs& in, const CheckPlan& plan,
                             const ScoreMod* mod) {
  const std::size_t nh = plan.heads.size(), nr = plan.rows.size();
  RefForward r;
  init_rows(r.o, p.dv);
  init_rows(r.lse, 1);
  r.o.values.assign(nh * nr * p.dv, 0.0);
  r.lse.values.assign(nh * nr, 0.0);
  for (auto [b, h] : plan.heads) {
    append_rows(r.o.rows, (std::size_t(b) * p.heads + h) * p.nq, plan.rows);
  }
  r.lse.rows = r.o.rows;

  parallel_for(long(nh), [&](long hi) {
    const auto [b, h] = plan.heads[hi];
    const int hk = p.kv_head_of(h);
    const Mat k = load_all(in.k, p.k_off(b, hk), p.nk, p.d);
    const Mat v = load_all(in.v, p.v_off(b, hk), p.nk, p.dv);
    for (std::size_t c0 = 0; c0 < nr; c0 += kRowChunk) {
      const std::vector<int> rows = chunk(plan.rows, c0);
      const Mat q = load_rows(in.q, p.q_off(b, h), rows, p.d);
      Mat x;
      scores(p, mod, b, h, rows, q, k, x, nullptr);
      const Eigen::VectorXd lse = softmax_rows(x, mod ? mod->sink(p, b, h) : kNegInf);
      const Mat o = x * v;
      for (std::size_t rr = 0; rr < rows.size(); ++rr) {
        const std::size_t at = hi * nr + c0 + rr;
        r.lse.values[at] = lse(rr);
        for (int c = 0; c < p.dv; ++c) r.o.values[at * p.dv + c] = o(rr, c);
      }
    }
  });
  return r;
}

// ----------------------------------------------------------------------------- fp64 backward

RefBackward reference_backward(const Problem& p, const AttnInputs& in, const BackwardPlan& plan,
                               const ScoreMod* mod) {
  RefBackward r;
  backward_rows(p, plan, r.dq, r.dk, r.dv);
  const std::size_t ng = plan.kv_groups.size();
  const int g = p.group();
  const std::vector<int> all_q = iota_rows(p.nq);
  const double tau = p.softmax_scale();
  // A group's (head, row chunk) blocks are split into `parts` consecutive runs, each summing its
  // own dK and dV; the runs are then added in order. `parts` depends on the problem only (about
  // 16 work items in all, at most 1 GB of partial sums), so the numbers do not depend on the
  // machine's thread count.
  const int chunks = (p.nq + kRowChunk - 1) / kRowChunk;
  const int blocks = g * chunks;
  const double part_bytes = 8.0 * double(p.nk) * (p.d + p.dv) * double(ng);
  const int parts = std::max(1, std::min({blocks, int(std::max<std::size_t>(1, 16 / std::max<std::size_t>(1, ng))),
                                          int(std::max(1.0, 1e9 / std::max(1.0, part_bytes)))}));
  std::vector<Mat> dk_part(ng * parts), dv_part(ng * parts);
  // With a score modifier, dQ and dK also with its derivative taken as 1: their magnitude sets
  // the floor of the gradients' check (RefBackward::dq_unmodified_max).
  const bool modded = mod != nullptr;
  std::vector<Mat> dku_part(modded ? ng * parts : 0);
  std::vector<double> dqu_max(modded ? ng * parts : 0, 0.0);

  parallel_for(long(ng * parts), [&](long item) {
    const std::size_t gi = std::size_t(item) / parts;
    const int part = int(item % parts);
    const auto [b, hk] = plan.kv_groups[gi];
    const Mat k = load_all(in.k, p.k_off(b, hk), p.nk, p.d);
    const Mat v = load_all(in.v, p.v_off(b, hk), p.nk, p.dv);
    Mat& dk = dk_part[item];
    Mat& dv = dv_part[item];
    dk = Mat::Zero(p.nk, p.d);
    dv = Mat::Zero(p.nk, p.dv);
    if (modded) dku_part[item] = Mat::Zero(p.nk, p.d);
    const int first = int(long(blocks) * part / parts), last = int(long(blocks) * (part + 1) / parts);
    for (int blk = first; blk < last; ++blk) {
      const int hh = blk / chunks, c0 = (blk % chunks) * kRowChunk;
      const int h = hk * g + hh;
      const std::vector<int> rows = chunk(all_q, c0);
      const Mat q = load_rows(in.q, p.q_off(b, h), rows, p.d);
      const Mat dout = load_rows(in.dout, p.o_off(b, h), rows, p.dv);
      Mat x, s_raw;
      scores(p, mod, b, h, rows, q, k, x, &s_raw);
      softmax_rows(x, mod ? mod->sink(p, b, h) : kNegInf);  // x is now P
      const Mat o = x * v;                      // O for these rows
      const Eigen::VectorXd D = (dout.cwiseProduct(o)).rowwise().sum();
      dv.noalias() += x.transpose() * dout;     // dV = P^T dO
      Mat dp = dout * v.transpose();            // dP = dO V^T
      Mat ds = x.cwiseProduct(dp.colwise() - D);  // dX = P o (dP - D)
      if (modded) {
        dqu_max[item] = std::max(dqu_max[item], (tau * ds * k).cwiseAbs().maxCoeff());
        dku_part[item].noalias() += tau * ds.transpose() * q;
      }
      if (mod)
        for (std::size_t rr = 0; rr < rows.size(); ++rr)
          for (int j = 0; j < p.nk; ++j)
            if (x(rr, j) != 0.0) ds(rr, j) *= mod->grad(p, b, h, rows[rr], j, s_raw(rr, j));
      const Mat dq = tau * ds * k;              // dQ = tau dS K
      dk.noalias() += tau * ds.transpose() * q; // dK = tau dS^T Q
      const std::size_t base = (gi * g + hh) * std::size_t(p.nq) + c0;
      for (std::size_t rr = 0; rr < rows.size(); ++rr)
        for (int c = 0; c < p.d; ++c) r.dq.values[(base + rr) * p.d + c] = dq(rr, c);
    }
    if (parts == 1) {  // the group's whole sum: written now, nothing kept
      for (int j = 0; j < p.nk; ++j) {
        for (int c = 0; c < p.d; ++c) r.dk.values[(gi * p.nk + j) * p.d + c] = dk(j, c);
        for (int c = 0; c < p.dv; ++c) r.dv.values[(gi * p.nk + j) * p.dv + c] = dv(j, c);
      }
      dk.resize(0, 0);
      dv.resize(0, 0);
    }
  });
  if (modded) {
    for (long gi = 0; gi < long(ng); ++gi) {
      Mat& dku = dku_part[gi * parts];
      for (int part = 1; part < parts; ++part) dku += dku_part[gi * parts + part];
      if (dku.size()) r.dk_unmodified_max = std::max(r.dk_unmodified_max, dku.cwiseAbs().maxCoeff());
    }
    for (double x : dqu_max) r.dq_unmodified_max = std::max(r.dq_unmodified_max, x);
    dku_part.clear();
  }
  if (parts == 1) return r;
  parallel_for(long(ng), [&](long gi) {
    Mat& dk = dk_part[gi * parts];
    Mat& dv = dv_part[gi * parts];
    for (int part = 1; part < parts; ++part) {
      dk += dk_part[gi * parts + part];
      dv += dv_part[gi * parts + part];
    }
    for (int j = 0; j < p.nk; ++j) {
      for (int c = 0; c < p.d; ++c) r.dk.values[(gi * p.nk + j) * p.d + c] = dk(j, c);
      for (int c = 0; c < p.dv; ++c) r.dv.values[(gi * p.nk + j) * p.dv + c] = dv(j, c);
    }
  });
  return r;
}

// ----------------------------------------------------------------------------- same-precision naive

namespace {

/// The keys (or values) of one KV head as the fp32 loops read them: row-major, row j at y + j * n,
/// and, when `yT` is given, also transposed (yT[c * ld + j]), which lets a block of keys be dotted
/// with one query row as a vector loop over the keys. Either way every dot product is summed in
/// order c = 0..n-1 by its own accumulator, so the numbers do not depend on the layout.
struct KeyRows {
  const float* y = nullptr;
  const float* yT = nullptr;
  std::size_t ld = 0;
  int n = 0;
  static constexpr int kBlock = 64;  // keys per block of the transposed path
  int block() const { return yT ? kBlock : 4; }

  /// out[t] = x . y_{jb + t} for t < count (count <= block()) where need[t]; others unspecified.
  void dots(const float* x, int jb, int count, const bool* need, float* out) const {
    if (yT) {
      float a[kBlock];
      for (int t = 0; t < count; ++t) a[t] = 0.f;
      for (int c = 0; c < n; ++c) {
        const float xc = x[c];
        const float* r = yT + std::size_t(c) * ld + jb;
        for (int t = 0; t < count; ++t) a[t] += xc * r[t];
      }
      for (int t = 0; t < count; ++t) out[t] = a[t];
      return;
    }
    if (count == 4) {  // four independent chains
      const float *y0 = y + std::size_t(jb) * n, *y1 = y0 + n, *y2 = y1 + n, *y3 = y2 + n;
      float a0 = 0, a1 = 0, a2 = 0, a3 = 0;
      for (int c = 0; c < n; ++c) {
        a0 += x[c] * y0[c];
        a1 += x[c] * y1[c];
        a2 += x[c] * y2[c];
        a3 += x[c] * y3[c];
      }
      out[0] = a0, out[1] = a1, out[2] = a2, out[3] = a3;
      return;
    }
    for (int t = 0; t < count; ++t) {
      if (!need[t]) continue;
      const float* yj = y + std::size_t(jb + t) * n;
      float a = 0;
      for (int c = 0; c < n; ++c) a += x[c] * yj[c];
      out[t] = a;
    }
  }
};

/// [rows][cols] -> [cols][rows].
std::vector<float> transposed(const float* x, int rows, int cols) {
  std::vector<float> t(std::size_t(rows) * cols);
  for (int r = 0; r < rows; ++r)
    for (int c = 0; c < cols; ++c) t[std::size_t(c) * rows + r] = x[std::size_t(r) * cols + c];
  return t;
}

/// Scores of query row i in fp32 for the keys [j0, j1): s[j - j0] = tau * sum_k q_k k_jk
/// accumulated in order, then modified; -inf where the mask hides the pair. `raw`, when given,
/// receives the unmodified tau * q.k (0 where hidden), for the modifier's gradient.
void row_scores_f32(const Problem& p, const ScoreMod* mod, int b, int h, int i, const float* q, const KeyRows& k,
                    int j0, int j1, float* s, float* raw) {
  const float tau = float(p.softmax_scale());
  const int step = k.block();
  bool vis[KeyRows::kBlock];
  float acc[KeyRows::kBlock];
  for (int jb = j0; jb < j1; jb += step) {
    const int count = std::min(step, j1 - jb);
    bool any = false;
    for (int t = 0; t < count; ++t) {
      vis[t] = p.visible(i, jb + t) && (!mod || mod->keep(p, b, h, i, jb + t));
      any = any || vis[t];
    }
    if (any) k.dots(q, jb, count, vis, acc);
    for (int t = 0; t < count; ++t) {
      float* out = s + (jb + t - j0);
      if (raw) raw[jb + t - j0] = 0.f;
      if (!vis[t]) {
        *out = -std::numeric_limits<float>::infinity();
        continue;
      }
      *out = acc[t] * tau;
      if (raw) raw[jb + t - j0] = *out;
      if (mod) *out = float(mod->apply(p, b, h, i, jb + t, *out));
    }
  }
}

/// s_j for one query row in fp32, every key (row_scores_f32).
void scores_f32(const Problem& p, const ScoreMod* mod, int b, int h, int i, const float* q,
                const float* k, std::vector<float>& s, std::vector<float>* raw = nullptr) {
  s.resize(p.nk);
  if (raw) raw->resize(p.nk);
  KeyRows kr;
  kr.y = k;
  kr.n = p.d;
  row_scores_f32(p, mod, b, h, i, q, kr, 0, p.nk, s.data(), raw ? raw->data() : nullptr);
}

/// dP_ij = dO_i . V_j in fp32, in order, for the keys [j0, j1) whose P_ij is not 0 (others: 0).
void row_dp_f32(const float* dout, const KeyRows& v, int j0, int j1, const float* prob, float* dp) {
  const int step = v.block();
  bool need[KeyRows::kBlock];
  float acc[KeyRows::kBlock];
  for (int jb = j0; jb < j1; jb += step) {
    const int count = std::min(step, j1 - jb);
    bool any = false;
    for (int t = 0; t < count; ++t) {
      need[t] = prob[jb + t - j0] != 0.f;
      any = any || need[t];
    }
    if (any) v.dots(dout, jb, count, need, acc);
    for (int t = 0; t < count; ++t) dp[jb + t - j0] = need[t] ? acc[t] : 0.f;
  }
}

/// Safe softmax of one row in fp32; P rounded to the dtype. Returns the LSE. `m_out` and
/// `l_out`, when given, receive the row's maximum and denominator: P_j is then
/// round_to(dtype, exp(s_j - m) / l) exactly, which lets the backward recompute it.
/// A finite `sink` adds e^sink to the denominator (ScoreMod::sink).
float softmax_f32(const Problem& p, std::vector<float>& s, std::vector<float>& prob,
                  float sink = -std::numeric_limits<float>::infinity(), float* m_out = nullptr,
                  float* l_out = nullptr) {
  float m = sink;
  for (float x : s) m = std::max(m, x);
  prob.assign(s.size(), 0.f);
  if (m_out) *m_out = m;
  if (l_out) *l_out = 0.f;
  if (m == -std::numeric_limits<float>::infinity()) return m;
  float l = sink == -std::numeric_limits<float>::infinity() ? 0.f : std::exp(sink - m);
  for (std::size_t j = 0; j < s.size(); ++j) {
    prob[j] = std::exp(s[j] - m);
    l += prob[j];
  }
  for (float& x : prob) x = round_to(p.dtype, x / l);
  if (l_out) *l_out = l;
  return m + std::log(l);
}

}  // namespace

NaiveForward naive_forward_same_precision(const Problem& p, const AttnInputs& in,
                                          const CheckPlan& plan, const ScoreMod* mod) {
  const std::size_t nh = plan.heads.size(), nr = plan.rows.size();
  NaiveForward r;
  init_rows(r.o, p.dv);
  init_rows(r.lse, 1);
  for (auto [b, h] : plan.heads) append_rows(r.o.rows, (std::size_t(b) * p.heads + h) * p.nq, plan.rows);
  r.lse.rows = r.o.rows;
  r.o.values.assign(nh * nr * p.dv, 0.f);
  r.lse.values.assign(nh * nr, 0.f);
  parallel_for(long(nh), [&](long hi) {
    const auto [b, h] = plan.heads[hi];
    const int hk = p.kv_head_of(h);
    const float* k = in.k.data() + p.k_off(b, hk);
    const float* v = in.v.data() + p.v_off(b, hk);
    std::vector<float> s, prob, acc(p.dv);
    for (std::size_t rr = 0; rr < nr; ++rr) {
      const int i = plan.rows[rr];
      scores_f32(p, mod, b, h, i, in.q.data() + p.q_off(b, h) + std::size_t(i) * p.d, k, s);
      const std::size_t at = hi * nr + rr;
      r.lse.values[at] = softmax_f32(p, s, prob, mod ? float(mod->sink(p, b, h)) : -INFINITY);
      std::fill(acc.begin(), acc.end(), 0.f);
      for (int j = 0; j < p.nk; ++j)
        if (prob[j] != 0.f)
          for (int c = 0; c < p.dv; ++c) acc[c] += prob[j] * v[std::size_t(j) * p.dv + c];
      for (int c = 0; c < p.dv; ++c) r.o.values[at * p.dv + c] = round_to(p.dtype, acc[c]);
    }
  });
  return r;
}

NaiveBackward naive_backward_same_precision(const Problem& p, const AttnInputs& in,
                                            const BackwardPlan& plan, const ScoreMod* mod) {
  // The yardstick is the textbook loop: for each query row i (in order), P_i, O_i, D_i, then for
  // each key j: dS_ij, dQ_i += dS_ij K_j, dV_j += P_ij dO_i, dK_j += dS_ij Q_i. It runs in two
  // parallel passes that give the same fp32 numbers as that serial loop: pass 1 over query rows
  // (dQ, and each row's max m_i, denominator l_i and D_i), pass 2 over key blocks (dK and dV,
  // summed over the rows in the same order, with P_ij and dS_ij recomputed from m_i, l_i, D_i).
  NaiveBackward r;
  backward_rows(p, plan, r.dq, r.dk, r.dv);
  const int g = p.group();
  const float tau = float(p.softmax_scale());
  const long ng = long(plan.kv_groups.size());
  const std::size_t rows_per_group = std::size_t(g) * p.nq;
  std::vector<float> row_m(ng * rows_per_group), row_l(ng * rows_per_group), row_d(ng * rows_per_group);
  constexpr int kBlock = 64;  // query rows (pass 1) or keys (pass 2) per work item
  // K and V of each group also transposed, for the vector loops over keys (KeyRows)
  std::vector<std::vector<float>> kt(ng), vt(ng);
  parallel_for(2 * ng, [&](long x) {
    const auto [b, hk] = plan.kv_groups[x / 2];
    if (x % 2 == 0)
      kt[x / 2] = transposed(in.k.data() + p.k_off(b, hk), p.nk, p.d);
    else
      vt[x / 2] = transposed(in.v.data() + p.v_off(b, hk), p.nk, p.dv);
  });
  const auto key_rows = [&](long gi, bool values) {
    const auto [b, hk] = plan.kv_groups[gi];
    KeyRows kr;
    kr.y = values ? in.v.data() + p.v_off(b, hk) : in.k.data() + p.k_off(b, hk);
    kr.yT = values ? vt[gi].data() : kt[gi].data();
    kr.ld = std::size_t(p.nk);
    kr.n = values ? p.dv : p.d;
    return kr;
  };

  // Pass 1: per query row, P, O (rounded as the forward stores it), D = dO . O, and dQ.
  const long qblocks = (p.nq + kBlock - 1) / kBlock;
  parallel_for(ng * g * qblocks, [&](long item) {
    const long gi = item / (g * qblocks), hh = (item / qblocks) % g, i0 = (item % qblocks) * kBlock;
    const auto [b, hk] = plan.kv_groups[gi];
    const int h = hk * g + int(hh);
    const float* k = in.k.data() + p.k_off(b, hk);
    const float* v = in.v.data() + p.v_off(b, hk);
    const KeyRows krows = key_rows(gi, false), vrows = key_rows(gi, true);
    std::vector<float> s(p.nk), s_raw(p.nk), prob, o(p.dv), dq(p.d), dp(p.nk);
    for (int i = int(i0); i < std::min<long>(p.nq, i0 + kBlock); ++i) {
      const float* q = in.q.data() + p.q_off(b, h) + std::size_t(i) * p.d;
      const float* dout = in.dout.data() + p.o_off(b, h) + std::size_t(i) * p.dv;
      const std::size_t row = std::size_t(gi) * rows_per_group + std::size_t(hh) * p.nq + i;
      row_scores_f32(p, mod, b, h, i, q, krows, 0, p.nk, s.data(), s_raw.data());
      softmax_f32(p, s, prob, mod ? float(mod->sink(p, b, h)) : -INFINITY, &row_m[row], &row_l[row]);
      std::fill(o.begin(), o.end(), 0.f);
      for (int j = 0; j < p.nk; ++j)
        for (int c = 0; c < p.dv; ++c) o[c] += prob[j] * v[std::size_t(j) * p.dv + c];
      float D = 0;
      for (int c = 0; c < p.dv; ++c) D += dout[c] * round_to(p.dtype, o[c]);
      row_d[row] = D;
      std::fill(dq.begin(), dq.end(), 0.f);
      row_dp_f32(dout, vrows, 0, p.nk, prob.data(), dp.data());
      for (int j = 0; j < p.nk; ++j) {
        if (prob[j] == 0.f) continue;
        float dsj = prob[j] * (dp[j] - D);
        if (mod) dsj *= float(mod->grad(p, b, h, i, j, s_raw[j]));
        dsj = round_to(p.dtype, dsj);
        for (int c = 0; c < p.d; ++c) dq[c] += dsj * k[std::size_t(j) * p.d + c];
      }
      for (int c = 0; c < p.d; ++c) r.dq.values[row * p.d + c] = round_to(p.dtype, tau * dq[c]);
    }
  });

  // Pass 2: per key block, dV_j and dK_j summed over every query row of the group, in order.
  const long kblocks = (p.nk + kBlock - 1) / kBlock;
  parallel_for(ng * kblocks, [&](long item) {
    const long gi = item / kblocks;
    const int j0 = int((item % kblocks) * kBlock), j1 = std::min(p.nk, j0 + kBlock);
    const auto [b, hk] = plan.kv_groups[gi];
    const KeyRows krows = key_rows(gi, false), vrows = key_rows(gi, true);
    std::vector<float> dk(std::size_t(j1 - j0) * p.d, 0.f), dv(std::size_t(j1 - j0) * p.dv, 0.f);
    std::vector<float> s(j1 - j0), raw(j1 - j0), prob(j1 - j0), dp(j1 - j0);
    for (int hh = 0; hh < g; ++hh) {
      const int h = hk * g + hh;
      for (int i = 0; i < p.nq; ++i) {
        const std::size_t row = std::size_t(gi) * rows_per_group + std::size_t(hh) * p.nq + i;
        const float m = row_m[row], l = row_l[row], D = row_d[row];
        if (m == -std::numeric_limits<float>::infinity()) continue;  // an empty row: P = 0
        const float* q = in.q.data() + p.q_off(b, h) + std::size_t(i) * p.d;
        const float* dout = in.dout.data() + p.o_off(b, h) + std::size_t(i) * p.dv;
        row_scores_f32(p, mod, b, h, i, q, krows, j0, j1, s.data(), raw.data());
        for (int j = j0; j < j1; ++j) prob[j - j0] = round_to(p.dtype, std::exp(s[j - j0] - m) / l);
        row_dp_f32(dout, vrows, j0, j1, prob.data(), dp.data());
        for (int j = j0; j < j1; ++j) {
          const float prob_j = prob[j - j0];
          if (prob_j == 0.f) continue;
          float dsj = prob_j * (dp[j - j0] - D);
          if (mod) dsj *= float(mod->grad(p, b, h, i, j, raw[j - j0]));
          dsj = round_to(p.dtype, dsj);
          float* dvj = dv.data() + std::size_t(j - j0) * p.dv;
          float* dkj = dk.data() + std::size_t(j - j0) * p.d;
          for (int c = 0; c < p.dv; ++c) dvj[c] += prob_j * dout[c];
          for (int c = 0; c < p.d; ++c) dkj[c] += dsj * q[c];
        }
      }
    }
    for (int j = j0; j < j1; ++j) {
      for (int c = 0; c < p.d; ++c)
        r.dk.values[(gi * p.nk + j) * p.d + c] = round_to(p.dtype, tau * dk[std::size_t(j - j0) * p.d + c]);
      for (int c = 0; c < p.dv; ++c)
        r.dv.values[(gi * p.nk + j) * p.dv + c] = round_to(p.dtype, dv[std::size_t(j - j0) * p.dv + c]);
    }
  });
  return r;
}

}  // namespace attn
