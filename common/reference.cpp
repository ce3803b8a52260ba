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
  // Heads: first, last and a few evenly spaced (at most 4).
  const int total = p.batch * p.heads;
  const int nh = std::min(total, 4);
  c.heads.clear();
  for (int k = 0; k < nh; ++k) {
    const int g = nh == 1 ? 0 : int((long(total - 1) * k) / (nh - 1));
    c.heads.emplace_back(g / p.heads, g % p.heads);
  }
  // Rows: the budget split over the chosen heads, never fewer than 8.
  const long nr = std::clamp<long>(long(budget_flops / (per_row * nh)), 8, p.nq);
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
  s << rows.size() << " of " << p.nq << " rows in " << heads.size() << " of " << p.batch * p.heads
    << " heads checked in fp64 (sampled); every element checked for NaN";
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
  const int keep = std::clamp(int(budget_flops / per_group), 1, total);
  if (keep == total) return c;
  BackwardPlan s;
  for (int k = 0; k < keep; ++k) {
    const int g = keep == 1 ? 0 : int((long(total - 1) * k) / (keep - 1));
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
  s << kv_groups.size() << " of " << p.batch * p.kv_heads
    << " KV groups checked in fp64 (sampled); every element checked for NaN";
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

  parallel_for(long(ng), [&](long gi) {
    const auto [b, hk] = plan.kv_groups[gi];
    const Mat k = load_all(in.k, p.k_off(b, hk), p.nk, p.d);
    const Mat v = load_all(in.v, p.v_off(b, hk), p.nk, p.dv);
    Mat dk = Mat::Zero(p.nk, p.d), dv = Mat::Zero(p.nk, p.dv);
    for (int hh = 0; hh < g; ++hh) {
      const int h = hk * g + hh;
      for (int c0 = 0; c0 < p.nq; c0 += kRowChunk) {
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

/// s_j for one query row in fp32: tau * sum_k q_k k_jk accumulated in order, masked/modified.
/// `raw`, when given, receives the unmodified tau * q.k (for the modifier's gradient).
void scores_f32(const Problem& p, const ScoreMod* mod, int b, int h, int i, const float* q,
                const float* k, std::vector<float>& s, std::vector<float>* raw = nullptr) {
  const float tau = float(p.softmax_scale());
  s.resize(p.nk);
  if (raw) raw->assign(p.nk, 0.f);
  for (int j = 0; j < p.nk; ++j) {
    if (!p.visible(i, j) || (mod && !mod->keep(p, b, h, i, j))) {
      s[j] = -std::numeric_limits<float>::infinity();
      continue;
    }
    float acc = 0;
    for (int c = 0; c < p.d; ++c) acc += q[c] * k[std::size_t(j) * p.d + c];
    s[j] = acc * tau;
    if (raw) (*raw)[j] = s[j];
    if (mod) s[j] = float(mod->apply(p, b, h, i, j, s[j]));
  }
}

/// Safe softmax of one row in fp32; P rounded to the dtype. Returns the LSE.
/// A finite `sink` adds e^sink to the denominator (ScoreMod::sink).
float softmax_f32(const Problem& p, std::vector<float>& s, std::vector<float>& prob,
                  float sink = -std::numeric_limits<float>::infinity()) {
  float m = sink;
  for (float x : s) m = std::max(m, x);
  prob.assign(s.size(), 0.f);
  if (m == -std::numeric_limits<float>::infinity()) return m;
  float l = sink == -std::numeric_limits<float>::infinity() ? 0.f : std::exp(sink - m);
  for (std::size_t j = 0; j < s.size(); ++j) {
    prob[j] = std::exp(s[j] - m);
    l += prob[j];
  }
  for (float& x : prob) x = round_to(p.dtype, x / l);
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
  NaiveBackward r;
  backward_rows(p, plan, r.dq, r.dk, r.dv);
  const int g = p.group();
  const float tau = float(p.softmax_scale());

  parallel_for(long(plan.kv_groups.size()), [&](long gi) {
    const auto [b, hk] = plan.kv_groups[gi];
    const float* k = in.k.data() + p.k_off(b, hk);
    const float* v = in.v.data() + p.v_off(b, hk);
    std::vector<float> dk(std::size_t(p.nk) * p.d, 0.f), dv(std::size_t(p.nk) * p.dv, 0.f);
    std::vector<float> s, s_raw, prob, o(p.dv), dq(p.d);
    for (int hh = 0; hh < g; ++hh) {
      const int h = hk * g + hh;
      for (int i = 0; i < p.nq; ++i) {
        const float* q = in.q.data() + p.q_off(b, h) + std::size_t(i) * p.d;
        const float* dout = in.dout.data() + p.o_off(b, h) + std::size_t(i) * p.dv;
        scores_f32(p, mod, b, h, i, q, k, s, &s_raw);
        softmax_f32(p, s, prob, mod ? float(mod->sink(p, b, h)) : -INFINITY);
        // O in the dtype, as the forward would have stored it; D = dO . O
        std::fill(o.begin(), o.end(), 0.f);
        for (int j = 0; j < p.nk; ++j)
          for (int c = 0; c < p.dv; ++c) o[c] += prob[j] * v[std::size_t(j) * p.dv + c];
        float D = 0;
        for (int c = 0; c < p.dv; ++c) D += dout[c] * round_to(p.dtype, o[c]);
        std::fill(dq.begin(), dq.end(), 0.f);
        for (int j = 0; j < p.nk; ++j) {
          if (prob[j] == 0.f) continue;
          float dp = 0;
          for (int c = 0; c < p.dv; ++c) dp += dout[c] * v[std::size_t(j) * p.dv + c];
          float dsj = prob[j] * (dp - D);
          if (mod) dsj *= float(mod->grad(p, b, h, i, j, s_raw[j]));
          dsj = round_to(p.dtype, dsj);
          for (int c = 0; c < p.dv; ++c) dv[std::size_t(j) * p.dv + c] += prob[j] * dout[c];
          for (int c = 0; c < p.d; ++c) {
            dq[c] += dsj * k[std::size_t(j) * p.d + c];
            dk[std::size_t(j) * p.d + c] += dsj * q[c];
          }
        }
        const std::size_t row = (gi * g + hh) * std::size_t(p.nq) + i;
        for (int c = 0; c < p.d; ++c) r.dq.values[row * p.d + c] = round_to(p.dtype, tau * dq[c]);
      }
    }
    for (int j = 0; j < p.nk; ++j) {
      for (int c = 0; c < p.d; ++c)
        r.dk.values[(gi * p.nk + j) * p.d + c] = round_to(p.dtype, tau * dk[std::size_t(j) * p.d + c]);
      for (int c = 0; c < p.dv; ++c)
        r.dv.values[(gi * p.nk + j) * p.dv + c] = round_to(p.dtype, dv[std::size_t(j) * p.dv + c]);
    }
  });
  return r;
}

}  // namespace attn
