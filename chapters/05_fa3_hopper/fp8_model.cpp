// Chapter 05's FP8 numerics on the CPU (see fp8_model.hpp).
#include "fp8_model.hpp"

#include <algorithm>
#include <cmath>
#include <limits>

#include "common/compare.hpp"
#include "common/errors.hpp"
#include "common/hadamard.hpp"
#include "common/online_softmax.hpp"
#include "common/parallel.hpp"

namespace attn::ch05 {

// ----------------------------------------------------------------------------- E4M3

uint8_t e4m3_bits(float x) {
  if (std::isnan(x)) return 0x7f;
  const uint8_t sign = std::signbit(x) ? 0x80 : 0x00;
  const double a = std::fabs(double(x));
  if (a >= kE4M3Max) return sign | 0x7e;  // saturate (satfinite): 1.1111.110 = 448
  if (a < std::ldexp(1.0, -6)) {
    // Subnormal: m * 2^-9, m = 0..7; m = 8 rounds up into the smallest normal.
    const double m = std::nearbyint(a * 512.0);  // round half to even
    return sign | uint8_t(m);                    // m = 8 is 0.0001.000, the smallest normal
  }
  int e = 0;
  const double f = std::frexp(a, &e);  // a = f 2^e, f in [0.5, 1)
  int exp = e - 1;                     // a = (2f) 2^exp, 2f in [1, 2)
  double mant = std::nearbyint((2.0 * f - 1.0) * 8.0);
  if (mant == 8.0) {
    mant = 0;
    ++exp;
  }
  const int field = exp + 7;
  if (field > 15 || (field == 15 && mant == 7.0)) return sign | 0x7e;
  return sign | uint8_t(field << 3) | uint8_t(mant);
}

float e4m3_value(uint8_t b) {
  const int sign = b >> 7, field = (b >> 3) & 0xf, mant = b & 0x7;
  if (field == 15 && mant == 7) return std::numeric_limits<float>::quiet_NaN();
  const double v = field == 0 ? std::ldexp(double(mant), -9) : std::ldexp(1.0 + mant / 8.0, field - 7);
  return float(sign ? -v : v);
}

// ----------------------------------------------------------------------------- Hadamard

void hadamard_inplace(float* x, int d) {
  if (d <= 0 || (d & (d - 1)) != 0) throw UsageError("the Hadamard rotation needs a power-of-two head dim");
  walsh_hadamard(x, d, [](float& x_k, float& x_kh) {
    // EXERCISE ch05.2: one butterfly of the fast Walsh-Hadamard transform
    //| const float a = x_k, b = x_kh;  // TODO: x_k and x_kh from a and b
    //| (void)a, (void)b;
    const float a = x_k, b = x_kh;
    x_k = a + b;
    x_kh = a - b;
    // END EXERCISE
  });
}

// ----------------------------------------------------------------------------- quantisation

namespace {

/// s = amax / 448 (1 for an all-zero block), in fp32 as the GPU computes it.
float scale_of(float amax) { return amax > 0.f ? amax / kE4M3Max : 1.f; }

/// Quantises rows [r0, r1) of an n x d matrix x (in place into out) with scale s.
void quantize_rows(const float* x, float* out, int r0, int r1, int d, float s) {
  for (int r = r0; r < r1; ++r)
    for (int k = 0; k < d; ++k) out[std::size_t(r) * d + k] = round_e4m3(x[std::size_t(r) * d + k] / s);
}

/// Q or K of one head: optionally rotated, then quantised with per-block or one scale.
void quantize_head(const float* x, int n, int d, const Fp8Options& opt, float* out, float* scales, int blocks) {
  std::vector<float> rot(x, x + std::size_t(n) * d);
  if (opt.hadamard)
    for (int r = 0; r < n; ++r) hadamard_inplace(rot.data() + std::size_t(r) * d, d);
  auto amax_rows = [&](int r0, int r1) {
    float m = 0.f;
    for (std::size_t i = std::size_t(r0) * d; i < std::size_t(r1) * d; ++i) m = std::max(m, std::fabs(rot[i]));
    return m;
  };
  if (opt.scaling == Fp8Scaling::per_tensor) {
    const float s = scale_of(amax_rows(0, n));
    quantize_rows(rot.data(), out, 0, n, d, s);
    for (int b = 0; b < blocks; ++b) scales[b] = s;
    return;
  }
  for (int b = 0; b < blocks; ++b) {
    const int r0 = b * kFp8ScaleRows, r1 = std::min(n, r0 + kFp8ScaleRows);
    const float s = scale_of(amax_rows(r0, r1));
    quantize_rows(rot.data(), out, r0, r1, d, s);
    scales[b] = s;
  }
}

}  // namespace

Fp8Inputs quantize_fp8(const Problem& p, const AttnInputs& in, Fp8Options opt) {
  if (p.d != p.dv) throw UsageError("the FP8 path needs d == dv");
  Fp8Inputs f;
  f.options = opt;
  f.q_blocks = (p.nq + kFp8ScaleRows - 1) / kFp8ScaleRows;
  f.k_blocks = (p.nk + kFp8ScaleRows - 1) / kFp8ScaleRows;
  f.q8.resize(p.q_elems());
  f.k8.resize(p.k_elems());
  f.v8.resize(p.v_elems());
  f.q_scale.resize(std::size_t(p.batch) * p.heads * f.q_blocks);
  f.k_scale.resize(std::size_t(p.batch) * p.kv_heads * f.k_blocks);
  f.v_scale.resize(std::size_t(p.batch) * p.kv_heads * p.dv);
  parallel_for(long(p.batch) * p.heads, [&](long bh) {
    const int b = int(bh / p.heads), h = int(bh % p.heads);
    quantize_head(in.q.data() + p.q_off(b, h), p.nq, p.d, opt, f.q8.data() + p.q_off(b, h),
                  f.q_scale.data() + bh * f.q_blocks, f.q_blocks);
  });
  parallel_for(long(p.batch) * p.kv_heads, [&](long bhk) {
    const int b = int(bhk / p.kv_heads), hk = int(bhk % p.kv_heads);
    quantize_head(in.k.data() + p.k_off(b, hk), p.nk, p.d, opt, f.k8.data() + p.k_off(b, hk),
                  f.k_scale.data() + bhk * f.k_blocks, f.k_blocks);
    // V: one scale per channel (per-block), or one for the tensor; never rotated.
    const float* v = in.v.data() + p.v_off(b, hk);
    float* v8 = f.v8.data() + p.v_off(b, hk);
    float* vs = f.v_scale.data() + bhk * p.dv;
    float all = 0.f;
    for (int c = 0; c < p.dv; ++c) {
      float m = 0.f;
      for (int j = 0; j < p.nk; ++j) m = std::max(m, std::fabs(v[std::size_t(j) * p.dv + c]));
      vs[c] = m;
      all = std::max(all, m);
    }
    for (int c = 0; c < p.dv; ++c) vs[c] = scale_of(opt.scaling == Fp8Scaling::per_tensor ? all : vs[c]);
    for (int j = 0; j < p.nk; ++j)
      for (int c = 0; c < p.dv; ++c) v8[std::size_t(j) * p.dv + c] = round_e4m3(v[std::size_t(j) * p.dv + c] / vs[c]);
  });
  return f;
}

// ----------------------------------------------------------------------------- the yardstick

NaiveForward naive_fp8_forward(const Problem& p, const Fp8Inputs& f, const CheckPlan& plan) {
  NaiveForward r;
  r.o.width = p.dv;
  r.lse.width = 1;
  const float c = float(p.softmax_scale() * kLog2e);
  struct Item {
    int b, h, i;
  };
  std::vector<Item> items;
  for (const auto& [b, h] : plan.heads)
    for (int i : plan.rows) items.push_back({b, h, i});
  r.o.rows.resize(items.size());
  r.lse.rows.resize(items.size());
  r.o.values.assign(items.size() * std::size_t(p.dv), 0.f);
  r.lse.values.assign(items.size(), 0.f);
  parallel_for(long(items.size()), [&](long n) {
    const auto [b, h, i] = items[std::size_t(n)];
    const int hk = p.kv_head_of(h);
    const float* q = f.q8.data() + p.q_off(b, h) + std::size_t(i) * p.d;
    const float* kb = f.k8.data() + p.k_off(b, hk);
    const float* vb = f.v8.data() + p.v_off(b, hk);
    const float qc = f.q_scale[(std::size_t(b) * p.heads + h) * f.q_blocks + i / kFp8ScaleRows] * c;
    const float* ks = f.k_scale.data() + (std::size_t(b) * p.kv_heads + hk) * f.k_blocks;
    std::vector<float> x(std::size_t(p.nk));
    float m = neg_inf<float>();
    for (int j = 0; j < p.nk; ++j) {
      if (!p.visible(i, j)) {
        x[j] = neg_inf<float>();
        continue;
      }
      float dot = 0.f;
      for (int k = 0; k < p.d; ++k) dot += q[k] * kb[std::size_t(j) * p.d + k];
      x[j] = dot * (qc * ks[j / kFp8ScaleRows]);
      m = std::max(m, x[j]);
    }
    const float shift = finite_max(m);
    float l = 0.f;
    std::vector<float> acc(std::size_t(p.dv), 0.f);
    for (int j = 0; j < p.nk; ++j) {
      const float pj = std::exp2(x[j] - shift);
      l += pj;
      const float p8 = round_e4m3(pj);
      if (p8 == 0.f) continue;
      for (int k = 0; k < p.dv; ++k) acc[k] += p8 * vb[std::size_t(j) * p.dv + k];
    }
    const float* vs = f.v_scale.data() + (std::size_t(b) * p.kv_heads + hk) * p.dv;
    r.o.rows[std::size_t(n)] = (std::size_t(p.lse_off(b, h)) + i);
    r.lse.rows[std::size_t(n)] = r.o.rows[std::size_t(n)];
    for (int k = 0; k < p.dv; ++k)
      r.o.values[std::size_t(n) * p.dv + k] = l > 0.f ? round_to(p.dtype, acc[k] * vs[k] / l) : 0.f;
    r.lse.values[std::size_t(n)] = l > 0.f ? (m + std::log2(l)) * float(kLn2) : neg_inf<float>();
  });
  return r;
}

Fp8Oracle::Fp8Oracle(const Problem& p, const AttnInputs& in, CheckPlan plan, Fp8Options opt)
    : p_(p), plan_(std::move(plan)) {
  fp8_ = quantize_fp8(p_, in, opt);
  ref_ = reference_forward(p_, in, plan_);
  const NaiveForward naive = naive_fp8_forward(p_, fp8_, plan_);
  naive_o_ = compact_error(naive.o, ref_.o);
  naive_lse_ = compact_error(naive.lse, ref_.lse);
}

CheckResult Fp8Oracle::judge(const std::vector<float>& o, const std::vector<float>* lse) const {
  CheckResult r;
  r.tensors.push_back(judge_tensor("O", o, p_.o_elems(), ref_.o, naive_o_, p_.dtype, false));
  if (lse) r.tensors.push_back(judge_tensor("LSE", *lse, p_.lse_elems(), ref_.lse, naive_lse_, DType::f32, true));
  return r;
}

// ----------------------------------------------------------------------------- the table

std::vector<Fp8AccuracyRow> fp8_accuracy_table(const Problem& p, const AttnInputs& in, const CheckPlan& plan) {
  const RefForward ref = reference_forward(p, in, plan);
  std::vector<Fp8AccuracyRow> rows;
  {
    const NaiveForward nb = naive_forward_same_precision(p, in, plan);
    const ErrorStats e = compact_error(nb.o, ref.o);
    rows.push_back({std::string(dtype_name(p.dtype)) + " (plain, same precision)", e.rel_l2, e.max_abs});
  }
  const struct {
    const char* name;
    Fp8Options opt;
  } methods[] = {{"fp8 e4m3, per-tensor scale", {Fp8Scaling::per_tensor, false}},
                 {"fp8 e4m3, per-block scales", {Fp8Scaling::per_block, false}},
                 {"fp8 e4m3, per-block + Hadamard", {Fp8Scaling::per_block, true}}};
  for (const auto& m : methods) {
    const Fp8Inputs f = quantize_fp8(p, in, m.opt);
    const ErrorStats e = compact_error(naive_fp8_forward(p, f, plan).o, ref.o);
    rows.push_back({m.name, e.rel_l2, e.max_abs});
  }
  return rows;
}

AttnInputs channel_outlier_inputs(const Problem& p, uint64_t seed, float factor) {
  AttnInputs in = make_inputs(p, Dist::normal, seed);
  const int ch[2] = {3 % p.d, (p.d / 2 + 5) % p.d};
  auto boost = [&](std::vector<float>& x) {
    for (std::size_t r = 0; r < x.size() / std::size_t(p.d); ++r)
      for (int c : ch) x[r * p.d + c] = round_to(p.dtype, x[r * p.d + c] * factor);
  };
  boost(in.q);
  boost(in.k);
  return in;
}

}  // namespace attn::ch05
