#include "gqa_mla/mla_model.hpp"

#include <Eigen/Dense>

#include <algorithm>
#include <cmath>
#include <limits>
#include <sstream>

#include "common/compare.hpp"
#include "common/errors.hpp"
#include "common/parallel.hpp"
#include "common/reference.hpp"

namespace attn::ch06 {
namespace {

using Mat = Eigen::Matrix<double, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;

/// Rows [r0, r0 + rows) x cols of a row-major host tensor, as fp64.
Mat block(const std::vector<float>& x, std::size_t off, int rows, int cols) {
  Mat m(rows, cols);
  for (int r = 0; r < rows; ++r)
    for (int c = 0; c < cols; ++c) m(r, c) = x[off + std::size_t(r) * cols + c];
  return m;
}

/// Row-wise safe softmax of tau * s with the causal mask of `p`, for query positions `rows`.
void masked_softmax(const Problem& p, const std::vector<int>& rows, Mat& s) {
  const double tau = p.softmax_scale();
  for (std::size_t r = 0; r < rows.size(); ++r) {
    double m = -std::numeric_limits<double>::infinity();
    for (int j = 0; j < p.nk; ++j) {
      s(r, j) = p.visible(rows[r], j) ? tau * s(r, j) : -std::numeric_limits<double>::infinity();
      m = std::max(m, s(r, j));
    }
    double l = 0;
    for (int j = 0; j < p.nk; ++j) {
      s(r, j) = m == -std::numeric_limits<double>::infinity() ? 0.0 : std::exp(s(r, j) - m);
      l += s(r, j);
    }
    if (l > 0) s.row(r) /= l;
  }
}

std::size_t latent_off(const MlaShape& s, int b, int t) { return (std::size_t(b) * s.nk + t) * kDC; }
std::size_t krope_off(const MlaShape& s, int b, int t) { return (std::size_t(b) * s.nk + t) * kDRope; }
std::size_t qrow(const MlaShape& s, int b, int h, int i) { return (std::size_t(b) * s.heads + h) * s.nq + i; }
std::size_t w_off(int h) { return std::size_t(h) * kDC * kDNope; }

}  // namespace

double MlaShape::scale() const { return 1.0 / std::sqrt(double(kDQK)); }

Problem MlaShape::decompressed() const {
  Problem p;
  p.batch = batch;
  p.heads = p.kv_heads = heads;
  p.nq = nq;
  p.nk = nk;
  p.d = kDQK;
  p.dv = kDV;
  p.scale = scale();
  p.causal = causal;
  p.dtype = DType::bf16;
  return p;
}

Problem MlaShape::absorbed() const {
  Problem p = decompressed();
  p.kv_heads = 1;
  p.d = kDLatentKey;
  p.dv = kDC;
  return p;
}

std::string MlaShape::describe() const {
  std::ostringstream o;
  o << "B=" << batch << " H=" << heads << " Nq=" << nq << " Nk=" << nk << (causal ? " causal" : "")
    << " pos0=" << pos0 << " (d_c=512, d_rope=64, d_nope=128, d_v=128, bf16)";
  return o.str();
}

void validate(const MlaShape& s) {
  if (s.batch < 1) throw UsageError("--batch must be >= 1");
  if (s.heads < 1) throw UsageError("--heads must be >= 1");
  if (s.nq < 1 || s.nk < 1) throw UsageError("--n and --nk must be >= 1");
  if (s.causal && s.nq > s.nk) throw UsageError("causal MLA needs Nq <= Nk (the new tokens are the last Nq keys)");
  if (s.pos0 < 0) throw UsageError("positions must be >= 0");
}

void rope_rotate(double* x, int dim, long pos, double base) {
  for (int k = 0; k < dim / 2; ++k) {
    const double theta = double(pos) * std::pow(base, -2.0 * k / dim);
    const double c = std::cos(theta), sn = std::sin(theta);
    const double a = x[2 * k], b = x[2 * k + 1];
    x[2 * k] = a * c - b * sn;
    x[2 * k + 1] = a * sn + b * c;
  }
}

MlaInputs make_mla_inputs(const MlaShape& s, Dist dist, uint64_t seed) {
  validate(s);
  MlaInputs in;
  const DType bf = DType::bf16;
  fill(in.c, std::size_t(s.batch) * s.nk * kDC, dist, seed, 11, bf);
  fill(in.q_nope, std::size_t(s.batch) * s.heads * s.nq * kDNope, dist, seed, 12, bf);
  // Weights ~ N(0, 1/256) (a power of two keeps them exact in bf16): k_nope and v come
  // out with a standard deviation of about sqrt(512)/16 = 1.4.
  fill(in.w_uk, std::size_t(s.heads) * kDC * kDNope, Dist::normal, seed, 13, bf);
  fill(in.w_uv, std::size_t(s.heads) * kDC * kDV, Dist::normal, seed, 14, bf);
  for (float& w : in.w_uk) w *= 1.f / 16;
  for (float& w : in.w_uv) w *= 1.f / 16;
  // The RoPE parts: drawn unrotated, rotated to their positions in fp64, stored in bf16.
  std::vector<float> kr, qr;
  fill(kr, std::size_t(s.batch) * s.nk * kDRope, dist, seed, 15, bf);
  fill(qr, std::size_t(s.batch) * s.heads * s.nq * kDRope, dist, seed, 16, bf);
  double tmp[kDRope];
  auto rotate_into = [&](std::vector<float>& x, std::size_t off, long pos) {
    for (int c = 0; c < kDRope; ++c) tmp[c] = x[off + c];
    rope_rotate(tmp, kDRope, pos);
    for (int c = 0; c < kDRope; ++c) x[off + c] = round_to(bf, float(tmp[c]));
  };
  for (int b = 0; b < s.batch; ++b)
    for (int t = 0; t < s.nk; ++t) rotate_into(kr, krope_off(s, b, t), s.key_pos(t));
  for (int b = 0; b < s.batch; ++b)
    for (int h = 0; h < s.heads; ++h)
      for (int i = 0; i < s.nq; ++i) rotate_into(qr, qrow(s, b, h, i) * kDRope, s.query_pos(i));
  in.k_rope = std::move(kr);
  in.q_rope = std::move(qr);
  return in;
}

AttnInputs decompress(const MlaShape& s, const MlaInputs& in, const std::vector<std::pair<int, int>>* only) {
  const Problem p = s.decompressed();
  AttnInputs out;
  out.q.resize(p.q_elems());
  out.k.resize(p.k_elems());
  out.v.resize(p.v_elems());
  for (int b = 0; b < s.batch; ++b)
    for (int h = 0; h < s.heads; ++h)
      for (int i = 0; i < s.nq; ++i) {
        float* q = &out.q[p.q_off(b, h) + std::size_t(i) * kDQK];
        std::copy_n(&in.q_nope[qrow(s, b, h, i) * kDNope], kDNope, q);
        std::copy_n(&in.q_rope[qrow(s, b, h, i) * kDRope], kDRope, q + kDNope);
      }
  std::vector<std::pair<int, int>> all;
  if (!only) {
    for (int b = 0; b < s.batch; ++b)
      for (int h = 0; h < s.heads; ++h) all.emplace_back(b, h);
    only = &all;
  }
  parallel_for(long(only->size()), [&](long item) {
    const auto [b, h] = (*only)[item];
    float kn[kDNope], vv[kDV];
    for (int t = 0; t < s.nk; ++t) {
      std::fill_n(kn, kDNope, 0.f);
      std::fill_n(vv, kDV, 0.f);
      const float* c = &in.c[latent_off(s, b, t)];
      for (int r = 0; r < kDC; ++r) {
        const float* wk = &in.w_uk[w_off(h) + std::size_t(r) * kDNope];
        const float* wv = &in.w_uv[w_off(h) + std::size_t(r) * kDV];
        for (int j = 0; j < kDNope; ++j) kn[j] += c[r] * wk[j];
        for (int j = 0; j < kDV; ++j) vv[j] += c[r] * wv[j];
      }
      float* k = &out.k[p.k_off(b, h) + std::size_t(t) * kDQK];
      for (int j = 0; j < kDNope; ++j) k[j] = round_to(DType::bf16, kn[j]);
      std::copy_n(&in.k_rope[krope_off(s, b, t)], kDRope, k + kDNope);
      float* v = &out.v[p.v_off(b, h) + std::size_t(t) * kDV];
      for (int j = 0; j < kDV; ++j) v[j] = round_to(DType::bf16, vv[j]);
    }
  });
  return out;
}

AttnInputs absorb(const MlaShape& s, const MlaInputs& in) {
  const Problem p = s.absorbed();
  AttnInputs out;
  out.q.resize(p.q_elems());
  out.k.resize(p.k_elems());
  out.v.resize(p.v_elems());
  // q_c = q_nope W_UK^T: for each of the 512 latent dims r, sum_j q_nope[j] W_UK[r][j].
  parallel_for(long(s.batch) * s.heads, [&](long bh) {
    const int b = int(bh / s.heads), h = int(bh % s.heads);
    for (int i = 0; i < s.nq; ++i) {
      const float* qn = &in.q_nope[qrow(s, b, h, i) * kDNope];
      float* q = &out.q[p.q_off(b, h) + std::size_t(i) * kDLatentKey];
      for (int r = 0; r < kDC; ++r) {
        // EXERCISE ch06.5: latent dim r of q_c = q_nope W_UK^T
        //| const float acc = r < kDNope ? qn[r] : 0.f;  // TODO: project q_nope through row r of W_UK
        const float* wk = &in.w_uk[w_off(h) + std::size_t(r) * kDNope];
        float acc = 0;
        for (int j = 0; j < kDNope; ++j) acc += qn[j] * wk[j];
        // END EXERCISE
        q[r] = round_to(DType::bf16, acc);
      }
      std::copy_n(&in.q_rope[qrow(s, b, h, i) * kDRope], kDRope, q + kDC);
    }
  });
  for (int b = 0; b < s.batch; ++b)
    for (int t = 0; t < s.nk; ++t) {
      float* k = &out.k[p.k_off(b, 0) + std::size_t(t) * kDLatentKey];
      std::copy_n(&in.c[latent_off(s, b, t)], kDC, k);
      std::copy_n(&in.k_rope[krope_off(s, b, t)], kDRope, k + kDC);
      std::copy_n(&in.c[latent_off(s, b, t)], kDC, &out.v[p.v_off(b, 0) + std::size_t(t) * kDC]);
    }
  return out;
}

std::vector<float> project_out(const MlaShape& s, const std::vector<float>& o_c, const MlaInputs& in) {
  std::vector<float> o(std::size_t(s.batch) * s.heads * s.nq * kDV);
  parallel_for(long(s.batch) * s.heads, [&](long bh) {
    const int h = int(bh % s.heads);
    for (int i = 0; i < s.nq; ++i) {
      const std::size_t row = std::size_t(bh) * s.nq + i;
      float acc[kDV] = {};
      for (int r = 0; r < kDC; ++r) {
        const float a = o_c[row * kDC + r];
        const float* wv = &in.w_uv[w_off(h) + std::size_t(r) * kDV];
        for (int j = 0; j < kDV; ++j) acc[j] += a * wv[j];
      }
      for (int j = 0; j < kDV; ++j) o[row * kDV + j] = round_to(DType::bf16, acc[j]);
    }
  });
  return o;
}

CheckPlan mla_check_plan(const MlaShape& s, bool all, double budget) {
  const Problem out = s.output();
  if (all) return CheckPlan::full(out);
  // CheckPlan::sampled() prices a row at 2 Nk (d + dv): with the absorbed dims that is
  // what a row of the fp64 reference costs at a long context (mla_reference()).
  Problem priced = out;
  priced.d = kDLatentKey;
  priced.dv = kDC;
  return CheckPlan::sampled(priced, budget);
}

std::vector<std::pair<int, int>> mla_yardstick_pairs(const MlaShape& s, const CheckPlan& plan, double budget) {
  const double per_pair = 2.0 * s.nk * kDC * (kDNope + kDV);
  const std::size_t keep = std::max<std::size_t>(2, std::size_t(budget / per_pair));
  if (plan.heads.size() <= keep) return plan.heads;
  std::vector<std::pair<int, int>> thinned;
  for (std::size_t k = 0; k < keep; ++k) thinned.push_back(plan.heads[(plan.heads.size() - 1) * k / (keep - 1)]);
  thinned.erase(std::unique(thinned.begin(), thinned.end()), thinned.end());
  return thinned;
}

std::string mla_check_describe(const MlaShape& s, const CheckPlan& plan, double budget) {
  const std::size_t yard = mla_yardstick_pairs(s, plan, budget).size();
  std::string d = plan.describe(s.output()) + "; reference: fp64 MLA";
  if (yard < plan.heads.size())
    d += "; yardstick (bf16, decompressed) on " + std::to_string(yard) + " of the " +
         std::to_string(plan.heads.size()) + " pairs (first, last, spread), its L2 scaled to all";
  return d;
}

CheckedRows<double> mla_reference(const MlaShape& s, const MlaInputs& in, const CheckPlan& plan, MlaRefPath path) {
  const Problem p = s.output();
  CheckedRows<double> ref;
  ref.width = kDV;
  for (auto [b, h] : plan.heads)
    for (int i : plan.rows) ref.rows.push_back((std::size_t(b) * s.heads + h) * s.nq + i);
  ref.values.assign(ref.rows.size() * kDV, 0.0);
  if (path == MlaRefPath::automatic) {
    const double cost = double(plan.heads.size()) * s.nk * kDC * (kDNope + kDV) * 2.0;
    path = cost <= 4e9 ? MlaRefPath::definition : MlaRefPath::absorbed;
  }
  const std::size_t nr = plan.rows.size();
  // One batch at a time: its latent cache is read into fp64 once and shared by its heads.
  for (int b = 0; b < s.batch; ++b) {
    std::vector<long> items;
    for (std::size_t hi = 0; hi < plan.heads.size(); ++hi)
      if (plan.heads[hi].first == b) items.push_back(long(hi));
    if (items.empty()) continue;
    const Mat c = block(in.c, latent_off(s, b, 0), s.nk, kDC);
    const Mat kr = block(in.k_rope, krope_off(s, b, 0), s.nk, kDRope);
    parallel_for(long(items.size()), [&](long item) {
      const long hi = items[item];
      const int h = plan.heads[hi].second;
      const Mat wuk = block(in.w_uk, w_off(h), kDC, kDNope), wuv = block(in.w_uv, w_off(h), kDC, kDV);
      Mat qn(nr, kDNope), qr(nr, kDRope);
      for (std::size_t r = 0; r < nr; ++r) {
        for (int j = 0; j < kDNope; ++j) qn(r, j) = in.q_nope[qrow(s, b, h, plan.rows[r]) * kDNope + j];
        for (int j = 0; j < kDRope; ++j) qr(r, j) = in.q_rope[qrow(s, b, h, plan.rows[r]) * kDRope + j];
      }
      Mat o;
      if (path == MlaRefPath::definition) {
        const Mat k_nope = c * wuk;  // [Nk][128]
        const Mat v = c * wuv;       // [Nk][128]
        Mat sc = qn * k_nope.transpose() + qr * kr.transpose();
        masked_softmax(p, plan.rows, sc);
        o = sc * v;
      } else {
        const Mat qc = qn * wuk.transpose();  // [rows][512]: q_c = q_nope W_UK^T
        Mat sc = qc * c.transpose() + qr * kr.transpose();
        masked_softmax(p, plan.rows, sc);
        const Mat oc = sc * c;  // [rows][512]
        o = oc * wuv;           // o = o_c W_UV
      }
      for (std::size_t r = 0; r < nr; ++r)
        for (int j = 0; j < kDV; ++j) ref.values[(hi * nr + r) * kDV + j] = o(r, j);
    });
  }
  return ref;
}

ErrorStats mla_naive_error(const MlaShape& s, const MlaInputs& in, const CheckPlan& plan,
                           const CheckedRows<double>& ref, double budget) {
  // The pairs the yardstick computes, and their rows of `ref` (pair-major, as the plan).
  CheckPlan sub;
  sub.heads = mla_yardstick_pairs(s, plan, budget);
  sub.rows = plan.rows;
  const std::size_t nr = plan.rows.size(), w = std::size_t(ref.width);
  CheckedRows<double> sub_ref;
  sub_ref.width = ref.width;
  std::size_t k = 0;
  for (std::size_t hi = 0; hi < plan.heads.size() && k < sub.heads.size(); ++hi) {
    if (plan.heads[hi] != sub.heads[k]) continue;
    sub_ref.rows.insert(sub_ref.rows.end(), ref.rows.begin() + hi * nr, ref.rows.begin() + (hi + 1) * nr);
    sub_ref.values.insert(sub_ref.values.end(), ref.values.begin() + hi * nr * w,
                          ref.values.begin() + (hi + 1) * nr * w);
    ++k;
  }
  const AttnInputs dec = decompress(s, in, &sub.heads);
  const NaiveForward naive = naive_forward_same_precision(s.decompressed(), dec, sub);
  ErrorStats e = compact_error(naive.o, sub_ref);
  if (sub.heads.size() < plan.heads.size()) e.l2 *= std::sqrt(double(plan.heads.size()) / double(sub.heads.size()));
  return e;
}

int mla_pick_splits(int tiles, int batch, int nblocks, int slots, int min_blocks_per_range) {
  const int max_splits = std::max(1, std::min(nblocks / std::max(1, min_blocks_per_range), kMlaMaxSplits));
  int splits = 1;
  double best = -1;
  for (int c0 = 1; c0 <= max_splits; ++c0) {
    const int per_range = (nblocks + c0 - 1) / c0;
    const int c = (nblocks + per_range - 1) / per_range;  // ranges of whole blocks: c0 may round down
    const long ctas = long(tiles) * batch * c;
    const long waves = (ctas + slots - 1) / slots;
    const double fill = double(ctas) / (double(waves) * slots);
    if (fill >= 0.95 && ctas >= 0.95 * slots) return c;
    if (fill > best + 1e-9) best = fill, splits = c;
  }
  return splits;
}

MlaCost mla_cost_absorb(const MlaShape& s, int head_tile) {
  const double e = 2, B = s.batch, H = s.heads, nq = s.nq, nk = s.nk;
  const double rows = H * nq;
  const double tiles = std::ceil(rows / head_tile);
  MlaCost c;
  // q_c = q_nope W_UK^T (one batched GEMM): read q_nope, q_rope, W_UK; write the 576-wide q.
  c.bytes += B * rows * (kDNope + kDRope) * e + H * kDC * kDNope * e + B * rows * kDLatentKey * e;
  // decode: the cache once per tile of packed (head, query) rows, q once, o_c out.
  c.cache_bytes = B * tiles * nk * kDLatentKey * e;
  c.bytes += c.cache_bytes + B * rows * kDLatentKey * e + B * rows * kDC * e;
  // o = o_c W_UV: read o_c and W_UV, write o.
  c.bytes += B * rows * kDC * e + H * kDC * kDV * e + B * rows * kDV * e;
  c.flops = 2.0 * B * rows * nk * (kDLatentKey + kDC) + 2.0 * B * rows * kDC * (kDNope + kDV);
  return c;
}

MlaCost mla_cost_decompress(const MlaShape& s) {
  const double e = 2, B = s.batch, H = s.heads, nq = s.nq, nk = s.nk;
  MlaCost c;
  // K = [c W_UK ; k_rope], V = c W_UV for every head; Q = [q_nope ; q_rope].
  c.bytes += B * nk * (kDC + kDRope) * e + 2 * H * kDC * kDNope * e + B * H * nk * (kDQK + kDV) * e;
  c.bytes += B * H * nq * kDQK * e * 2;
  // attention: K and V once per tile of 128 query rows, Q in, O out.
  c.cache_bytes = B * H * std::ceil(nq / 128.0) * nk * (kDQK + kDV) * e;
  c.bytes += c.cache_bytes + B * H * nq * (kDQK + kDV) * e;
  c.flops = 2.0 * B * H * nk * kDC * (kDNope + kDV) + 2.0 * B * H * nq * nk * (kDQK + kDV);
  return c;
}

}  // namespace attn::ch06
