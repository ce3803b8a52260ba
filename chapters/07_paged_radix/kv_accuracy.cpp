// The accuracy of the 8-bit and 4-bit KV caches (see kv_accuracy.hpp).
#include "kv_accuracy.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <sstream>

#include "common/hadamard.hpp"
#include "common/parallel.hpp"
#include "decode.hpp"
#include "decode_model.hpp"

namespace attn::ch07 {

namespace {

/// fp64 decode of every (sequence, head): o = softmax(tau q K^T) V.
std::vector<double> reference(const DecodeBatch& b, const std::vector<float>& q, const KvPools& kv) {
  std::vector<double> o(std::size_t(b.batch()) * b.heads * b.d, 0.0);
  const double tau = b.softmax_scale();
  parallel_for(long(b.batch()) * b.heads, [&](long bh) {
    const int s = int(bh / b.heads), h = int(bh % b.heads), hk = h / b.group();
    const float* qh = q.data() + std::size_t(bh) * b.d;
    std::vector<double> sc(b.lens[s]);
    double mx = -INFINITY;
    for (int t = 0; t < b.lens[s]; ++t) {
      const std::size_t at = b.kv_index(s, hk, t);
      double dot = 0;
      for (int c = 0; c < b.d; ++c) dot += double(qh[c]) * kv.k[at + c];
      sc[t] = tau * dot;
      mx = std::max(mx, sc[t]);
    }
    double l = 0;
    double* oh = o.data() + std::size_t(bh) * b.d;
    for (int t = 0; t < b.lens[s]; ++t) {
      const double p = std::exp(sc[t] - mx);
      l += p;
      const std::size_t at = b.kv_index(s, hk, t);
      for (int c = 0; c < b.d; ++c) oh[c] += p * kv.v[at + c];
    }
    for (int c = 0; c < b.d; ++c) oh[c] /= l;
  });
  return o;
}

/// Quantises bf16 pools to `t` with one scale per (page, KV head), as the kernels' format.
KvPools per_page(const DecodeBatch& b, const KvPools& x, KvDtype t) {
  KvPools out;
  out.dtype = t;
  const std::size_t per = std::size_t(b.page_size) * b.d, blocks = b.scale_elems();
  out.k.resize(x.k.size());
  out.v.resize(x.v.size());
  out.k_scale.resize(blocks);
  out.v_scale.resize(blocks);
  for (int which = 0; which < 2; ++which) {
    const std::vector<float>& src = which ? x.v : x.k;
    std::vector<float>& codes = which ? out.v : out.k;
    std::vector<float>& scale = which ? out.v_scale : out.k_scale;
    for (std::size_t blk = 0; blk < blocks; ++blk) {
      float amax = 0.f;
      for (std::size_t i = blk * per; i < (blk + 1) * per; ++i) amax = std::max(amax, std::fabs(src[i]));
      scale[blk] = q8::block_scale(amax, kv_qmax(t));
      const float inv = q8::inverse_scale(scale[blk]);
      for (std::size_t i = blk * per; i < (blk + 1) * per; ++i) codes[i] = kv_code(t, src[i] * inv);
    }
    // INT4: through the stored form, two codes per byte, and back (what a kernel unpacks).
    if (t == KvDtype::int4) codes = kv_unpack_codes(t, kv_pack_codes(t, codes.data(), codes.size()).data(), codes.size());
  }
  return out;
}

/// INT4 K and V with one scale per (page, KV head, group of `g` channels) (g divides d),
/// or with `per_token` per (token, KV head, group): returned as the dequantised values
/// code * scale in a value pool.
KvPools int4_per_group(const DecodeBatch& b, const KvPools& x, int g, bool per_token = false) {
  KvPools out;
  out.k.resize(x.k.size());
  out.v.resize(x.v.size());
  const int P = b.page_size, D = b.d;
  for (int which = 0; which < 2; ++which) {
    const std::vector<float>& src = which ? x.v : x.k;
    std::vector<float>& dst = which ? out.v : out.k;
    const int rows = per_token ? 1 : P;  // slots one scale covers
    for (std::size_t blk = 0; blk < b.scale_elems() * P / rows; ++blk)
      for (int c0 = 0; c0 < D; c0 += g) {
        float amax = 0.f;
        for (int s = 0; s < rows; ++s)
          for (int c = c0; c < c0 + g; ++c) amax = std::max(amax, std::fabs(src[(blk * rows + s) * D + c]));
        const float sc = q8::block_scale(amax, q8::kInt4Max), inv = q8::inverse_scale(sc);
        for (int s = 0; s < rows; ++s)
          for (int c = c0; c < c0 + g; ++c) {
            const std::size_t i = (blk * rows + s) * D + c;
            dst[i] = kv_dequant(kv_code(KvDtype::int4, src[i] * inv), sc);
          }
      }
  }
  return out;
}

/// INT8 K with one scale per (page, KV head, channel), V per page; returned as the
/// dequantised values code * scale in a value pool (the model reads values).
KvPools int8_per_channel(const DecodeBatch& b, const KvPools& x) {
  const KvPools v8 = per_page(b, x, KvDtype::int8);
  KvPools out;
  out.k.resize(x.k.size());
  out.v.resize(x.v.size());
  const int P = b.page_size, D = b.d;
  for (std::size_t blk = 0; blk < b.scale_elems(); ++blk) {
    for (int c = 0; c < D; ++c) {
      float amax = 0.f;
      for (int s = 0; s < P; ++s) amax = std::max(amax, std::fabs(x.k[(blk * P + s) * D + c]));
      const float sc = q8::block_scale(amax, q8::kInt8Max), inv = q8::inverse_scale(sc);
      for (int s = 0; s < P; ++s) {
        const std::size_t i = (blk * P + s) * D + c;
        out.k[i] = kv_dequant(kv_code(KvDtype::int8, x.k[i] * inv), sc);
      }
    }
    for (std::size_t i = blk * P * D; i < (blk + 1) * P * D; ++i) out.v[i] = kv_dequant(v8.v[i], v8.v_scale[blk]);
  }
  return out;
}

/// Rotates every row of K (in the pool) and of Q by H / sqrt(d), rounded to bf16.
void rotate(const DecodeBatch& b, KvPools& kv, std::vector<float>& q) {
  for (std::size_t r = 0; r < kv.k.size() / b.d; ++r) {
    walsh_hadamard(kv.k.data() + r * b.d, b.d);
    for (int c = 0; c < b.d; ++c) kv.k[r * b.d + c] = round_to(DType::bf16, kv.k[r * b.d + c]);
  }
  for (std::size_t r = 0; r < q.size() / b.d; ++r) {
    walsh_hadamard(q.data() + r * b.d, b.d);
    for (int c = 0; c < b.d; ++c) q[r * b.d + c] = round_to(DType::bf16, q[r * b.d + c]);
  }
}

std::string sci(double x) {
  char s[32];
  std::snprintf(s, sizeof s, "%.2e", x);
  return s;
}

}  // namespace

AccuracyTable kv_accuracy_table(uint64_t seed) {
  AccuracyTable t;
  DecodeBatch b = build_batch(8, 2, 128, 16, ragged_lengths(4, 2048, 16, seed), 0, seed);
  t.shape = b.describe();
  const int splits = 4;
  struct Input {
    const char* name;
    Dist dist;
    bool channels;
  };
  for (const Input& in : {Input{"normal", Dist::normal, false}, Input{"outliers", Dist::outliers, false},
                          Input{"outlier channels", Dist::normal, true}}) {
    DecodeBatch bb = b;
    bb.kv_dtype = KvDtype::bf16;
    KvPools x = fill_pools(bb, seed, in.dist);
    std::vector<float> q = make_queries(bb, seed, Dist::normal);
    if (in.channels) {  // channels 3 and 69 of Q and K, 20 times larger
      for (std::size_t r = 0; r < x.k.size() / b.d; ++r)
        for (int c : {3, 69}) x.k[r * b.d + c] = round_to(DType::bf16, 20.f * x.k[r * b.d + c]);
      for (std::size_t r = 0; r < q.size() / b.d; ++r)
        for (int c : {3, 69}) q[r * b.d + c] = round_to(DType::bf16, 20.f * q[r * b.d + c]);
    }
    const std::vector<double> ref = reference(bb, q, x);
    AccuracyRow row;
    row.inputs = in.name;
    for (double r : ref) row.ref_max = std::max(row.ref_max, std::fabs(r));
    auto add = [&](const std::string& name, const DecodeBatch& batch, const std::vector<float>& qq, const KvPools& p) {
      const DecodeModelResult m = decode_model(batch, qq, p, splits, std::size_t(1) << 30);
      double num = 0, den = 0, mx = 0;
      for (std::size_t i = 0; i < ref.size(); ++i) {
        const double e = double(m.o[i]) - ref[i];
        num += e * e;
        den += ref[i] * ref[i];
        mx = std::max(mx, std::fabs(e));
      }
      row.variants.push_back(name);
      row.rel_l2.push_back(std::sqrt(num / den));
      row.max_abs.push_back(mx);
    };
    add("bf16", bb, q, x);
    for (KvDtype f : {KvDtype::fp8, KvDtype::int8, KvDtype::int4}) {
      DecodeBatch qb = bb;
      qb.kv_dtype = f;
      add(std::string(kv_dtype_name(f)) + " per page", qb, q, per_page(qb, x, f));
    }
    add("int8 per channel (K)", bb, q, int8_per_channel(bb, x));
    add("int4 per 32 channels", bb, q, int4_per_group(bb, x, 32));
    add("int4 per token, 32 channels", bb, q, int4_per_group(bb, x, 32, true));
    KvPools xr = x;
    std::vector<float> qr = q;
    rotate(bb, xr, qr);
    for (KvDtype f : {KvDtype::fp8, KvDtype::int8, KvDtype::int4}) {
      DecodeBatch qb = bb;
      qb.kv_dtype = f;
      add(std::string(kv_dtype_name(f)) + " per page + Hadamard", qb, qr, per_page(qb, xr, f));
    }
    t.rows.push_back(row);
  }
  return t;
}

double AccuracyTable::rel_l2(const std::string& inputs, const std::string& variant) const {
  for (const AccuracyRow& r : rows)
    if (r.inputs == inputs)
      for (std::size_t i = 0; i < r.variants.size(); ++i)
        if (r.variants[i] == variant) return r.rel_l2[i];
  return NAN;
}

std::string AccuracyTable::text() const {
  std::ostringstream s;
  s << "== ch07_paged_radix decode --accuracy: O against the fp64 reference of the bf16 cache ==\n"
    << "batch: " << shape << " (the K/V format varies by column); CPU model of v2, 4 splits\n\n";
  if (rows.empty()) return s.str();
  s << "| inputs | metric |";
  for (const auto& v : rows[0].variants) s << " " << v << " |";
  s << "\n|---|---|";
  for (std::size_t i = 0; i < rows[0].variants.size(); ++i) s << "---|";
  s << "\n";
  for (const AccuracyRow& r : rows) {
    s << "| " << r.inputs << " | rel L2 |";
    for (double x : r.rel_l2) s << " " << sci(x) << " |";
    s << "\n| " << r.inputs << " | max abs (max |O| " << sci(r.ref_max) << ") |";
    for (double x : r.max_abs) s << " " << sci(x) << " |";
    s << "\n";
  }
  s << "\n(rel L2 = ||O - O_ref|| / ||O_ref|| over every head of every sequence. Inputs: normal = N(0, 1)-like;\n"
       " outliers = 1 entry in 256 of K and V x20; outlier channels = channels 3 and 69 of Q and K x20.)\n";
  return s.str();
}

std::string AccuracyTable::json() const {
  std::ostringstream j;
  j << "{\"chapter\": \"ch07_paged_radix\", \"subcommand\": \"decode-accuracy\", \"shape\": \"" << shape
    << "\", \"rows\": [";
  for (std::size_t r = 0; r < rows.size(); ++r) {
    j << (r ? ", " : "") << "{\"inputs\": \"" << rows[r].inputs << "\", \"ref_max\": " << rows[r].ref_max
      << ", \"variants\": [";
    for (std::size_t i = 0; i < rows[r].variants.size(); ++i)
      j << (i ? ", " : "") << "{\"name\": \"" << rows[r].variants[i] << "\", \"rel_l2\": " << rows[r].rel_l2[i]
        << ", \"max_abs\": " << rows[r].max_abs[i] << "}";
    j << "]}";
  }
  j << "]}\n";
  return j.str();
}

}  // namespace attn::ch07
