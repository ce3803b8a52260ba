#include "mask_spec.hpp"

#include <stdexcept>

#include <cmath>
#include <cstdlib>
#include <limits>
#include <numeric>
#include <sstream>

#include "common/errors.hpp"
#include "common/inputs.hpp"

namespace attn::ch06 {

namespace {
struct NamedKind {
  MaskKind kind;
  const char* name;
};
constexpr NamedKind kKinds[] = {
    {MaskKind::causal, "causal"},   {MaskKind::window, "window"},         {MaskKind::chunked, "chunked"},
    {MaskKind::prefix, "prefix"},   {MaskKind::document, "document"},     {MaskKind::sink, "sink"},
    {MaskKind::learned_sink, "learned-sink"}, {MaskKind::alibi, "alibi"}, {MaskKind::softcap, "softcap"},
    {MaskKind::custom, "custom"},   {MaskKind::strided, "strided"},       {MaskKind::fixed, "fixed"},
    {MaskKind::longformer, "longformer"}, {MaskKind::bigbird, "bigbird"},
};
}  // namespace

const std::vector<MaskKind>& all_mask_kinds() {
  static const std::vector<MaskKind> k = [] {
    std::vector<MaskKind> v;
    for (const auto& n : kKinds) v.push_back(n.kind);
    return v;
  }();
  return k;
}

const char* mask_name(MaskKind k) {
  for (const auto& n : kKinds)
    if (n.kind == k) return n.name;
  return "?";
}

bool parse_mask(const std::string& s, MaskKind* out) {
  for (const auto& n : kKinds)
    if (s == n.name) {
      *out = n.kind;
      return true;
    }
  return false;
}

std::string MaskSpec::describe() const {
  std::ostringstream o;
  o << mask_name(kind);
  switch (kind) {
    case MaskKind::window: o << " (left " << left << ", right " << right << ")"; break;
    case MaskKind::chunked: o << ", chunks of " << chunk; break;
    case MaskKind::prefix: o << ", prefix " << prefix; break;
    case MaskKind::document: {
      o << ", " << doc_lens.size() << " documents";
      if (doc_lens.size() <= 32) {  // bench/ch06_masks.py reads a model case's lengths from here (16 at 16K)
        o << " (";
        for (std::size_t k = 0; k < doc_lens.size(); ++k) o << (k ? " " : "") << doc_lens[k];
        o << ")";
      }
      o << (causal ? ", causal within each" : ", bidirectional within each") << ", packed [tokens][heads][d]";
      break;
    }
    case MaskKind::sink: o << ", " << sinks << " sink tokens + window " << left; break;
    case MaskKind::learned_sink:
      o << ", one sink logit per head";
      if (sliding >= 0) o << ", sliding window " << sliding << " (causal)";
      else o << (causal ? ", causal" : "");
      break;
    case MaskKind::alibi: o << ", slopes 2^(-8(h+1)/H)" << (causal ? ", causal" : ""); break;
    case MaskKind::softcap:
      o << ", cap " << softcap;
      if (sliding >= 0) o << ", sliding window " << sliding << " (causal)";
      else o << (causal ? ", causal" : "");
      break;
    case MaskKind::custom: o << " (random block-sparse, 128 x 128 blocks, seed " << seed << ")"; break;
    case MaskKind::causal: o << " (bottom-right)"; break;
    case MaskKind::strided: o << " (Sparse Transformer, merged), stride " << stride << ", causal"; break;
    case MaskKind::fixed:
      o << " (Sparse Transformer), blocks of " << block << ", " << summary << " summary columns, causal";
      break;
    case MaskKind::longformer: o << ", window " << left << " each side, " << globals << " global tokens"; break;
    case MaskKind::bigbird:
      o << " (ITC), blocks of " << block << ", 3-block window, " << globals << " global blocks, " << random
        << " random blocks (seed " << seed << ")";
      break;
  }
  return o.str();
}

std::vector<int> random_doc_lens(int n, int k, unsigned seed) {
  // k - 1 distinct cut points in [1, n): a uniformly random composition of n into k parts.
  Rng rng(seed);
  std::vector<char> cut(n, 0);
  int cuts = 0;
  if (k - 1 > n / 2) {  // dense: start from every cut and remove at random
    std::fill(cut.begin() + 1, cut.end(), 1);
    cuts = n - 1;
    while (cuts > k - 1) {
      const int c = rng.range(1, n - 1);
      if (cut[c]) cut[c] = 0, --cuts;
    }
  } else {
    while (cuts < k - 1) {
      const int c = rng.range(1, n - 1);
      if (!cut[c]) cut[c] = 1, ++cuts;
    }
  }
  std::vector<int> lens;
  int last = 0;
  for (int t = 1; t <= n; ++t)
    if (t == n || cut[t]) lens.push_back(t - last), last = t;
  return lens;
}

std::vector<int> cu_seqlens(const std::vector<int>& lens) {
  std::vector<int> cu(lens.size() + 1, 0);
  std::partial_sum(lens.begin(), lens.end(), cu.begin() + 1);
  return cu;
}

std::vector<int> doc_of_tokens(const std::vector<int>& lens) {
  std::vector<int> doc;
  for (std::size_t k = 0; k < lens.size(); ++k) doc.insert(doc.end(), lens[k], int(k));
  return doc;
}

std::vector<float> default_sink_logits(int heads, int nk) {
  std::vector<float> s(heads);
  for (int h = 0; h < heads; ++h) s[h] = float(std::log(double(nk)) - 1.0 + 0.5 * (h % 4));
  return s;
}

void finalize_spec(MaskSpec& s, const Problem& p) {
  if (s.left < 0 || s.right < 0) throw UsageError("--window must be L or L,R with L, R >= 0");
  if (s.chunk < 1) throw UsageError("--chunk must be >= 1");
  if (s.sinks < 0) throw UsageError("--sinks must be >= 0");
  if (!(s.softcap > 0) || !std::isfinite(s.softcap)) throw UsageError("--softcap must be a number > 0");
  if (s.prefix < 0) s.prefix = p.nk / 4;
  if (s.stride < 1) throw UsageError("--stride must be >= 1");
  if (s.block < 1) throw UsageError("--block must be >= 1");
  if (s.kind == MaskKind::fixed && (s.summary < 0 || s.summary > s.block))
    throw UsageError("--summary must be in [0, block] (block " + std::to_string(s.block) + ")");
  if (s.random < 0 || s.random > 64) throw UsageError("--random must be in [0, 64]");
  if (s.globals < -1) throw UsageError("--globals must be >= 0");
  if (s.globals == -1) s.globals = s.kind == MaskKind::bigbird ? 2 : 1;
  if (s.sliding < -1) throw UsageError("--window must be L >= 0 with --mask " + std::string(mask_name(s.kind)));
  if (s.sliding >= 0) {
    if (s.kind != MaskKind::learned_sink && s.kind != MaskKind::softcap)
      throw UsageError(std::string("a sliding window on --mask ") + mask_name(s.kind) +
                       " (only learned-sink and softcap take one)");
    s.causal = true;  // a sliding window is causal
  }
  if (s.kind == MaskKind::document) {
    if (p.nq != p.nk) throw UsageError("--mask document needs Nq = Nk (one packed sequence of documents)");
    if (p.batch != 1) throw UsageError("--mask document packs every document into one batch: use --batch 1");
    if (s.doc_lens.empty()) s.doc_lens = random_doc_lens(p.nq, std::min(4, p.nq), unsigned(s.seed));
    long long sum = 0;
    for (int l : s.doc_lens) {
      if (l < 1) throw UsageError("--doc-lens: every document needs at least one token");
      sum += l;
    }
    if (sum != p.nq)
      throw UsageError("--doc-lens sum to " + std::to_string(sum) + ", not N = " + std::to_string(p.nq));
  }
  if (s.kind == MaskKind::learned_sink && int(s.sink_logits.size()) != p.heads)
    s.sink_logits = default_sink_logits(p.heads, p.nk);
}

Problem masked_problem(const Problem& p) {
  Problem q = p;
  q.causal = false;
  return q;
}

BlockMap build_block_map(const MaskSpec& s, const Problem& p, int Br, int Bc) {
  const std::vector<int> doc = s.kind == MaskKind::document ? doc_of_tokens(s.doc_lens) : std::vector<int>{};
  PolicyData d{doc.data(), s.sink_logits.data()};
  return visit_policy(s, p, d, [&](const auto& pol) {
    return build_block_map(pol, p.batch, p.heads, p.nq, p.nk, Br, Bc);
  });
}

BlockMap build_document_block_map(const MaskSpec& s, const Problem& p, int Br, int Bc) {
  if (s.kind != MaskKind::document || p.batch != 1 || p.nq != p.nk)
    throw std::invalid_argument("the document map is for document masking of one packed batch");
  const std::vector<int> doc = doc_of_tokens(s.doc_lens);
  Document pol;
  pol.doc = doc.data(), pol.n = p.nq, pol.causal = s.causal;
  return build_document_block_map(pol, cu_seqlens(s.doc_lens), p.heads, Br, Bc);
}

double mask_flops_forward(const MaskSpec& s, const Problem& p, const BlockMap& m) {
  if (s.kind == MaskKind::causal) {
    Problem c = p;
    c.causal = true;
    return flops_forward(c);
  }
  return 2.0 * m.kept_pairs * (p.d + p.dv);
}

// ------------------------------------------------------------------ the fp64 reference

namespace {

/// Every variant from its definition, in fp64 (see SECTION.md for the formulas).
class ReferenceMask : public ScoreMod {
 public:
  ReferenceMask(const MaskSpec& s, const Problem& p) : s_(s), diag_(p.nk - p.nq), heads_(p.heads), nk_(p.nk) {
    if (s.kind == MaskKind::document) cu_ = cu_seqlens(s.doc_lens);
  }
  std::string name() const override { return s_.describe(); }

  bool keep(const Problem&, int, int, int i, int j) const override {
    const long q = long(i) + diag_;  // the query's key position (bottom-right alignment)
    const bool causal = j <= q;
    switch (s_.kind) {
      case MaskKind::causal: return causal;
      case MaskKind::window: return q - s_.left <= j && j <= q + s_.right;
      case MaskKind::chunked: return causal && q >= 0 && q / s_.chunk == j / s_.chunk;
      case MaskKind::prefix: return j < s_.prefix || causal;
      case MaskKind::document: return doc(i) == doc(j) && (!s_.causal || j <= i);
      case MaskKind::sink: return causal && (j < s_.sinks || q - j <= s_.left);
      case MaskKind::learned_sink:
      case MaskKind::softcap:
        if (s_.sliding >= 0) return causal && q - j <= s_.sliding;  // a causal sliding window
        return !s_.causal || causal;
      case MaskKind::alibi: return !s_.causal || causal;
      case MaskKind::custom: {
        if (!causal) return false;
        const long bq = q / 128, bk = j / 128;
        return bq == bk || bk == 0 || mask_math::hash3(unsigned(s_.seed), unsigned(bq), unsigned(bk)) % 4 == 0;
      }
      case MaskKind::strided: {  // Child et al. 2019, §4.2, both heads merged
        const long l = s_.stride;
        return causal && (q - j < l || (q - j) % l == 0);
      }
      case MaskKind::fixed: {  // Child et al. 2019, §4.2: the own block, and c summary columns per block
        const long l = s_.block;
        return causal && (j / l == q / l || j % l >= l - s_.summary);
      }
      case MaskKind::longformer:  // Beltagy et al. 2020, §3.1: window w each side, g global tokens
        return (q >= 0 && q < s_.globals) || j < s_.globals || std::abs(q - j) <= s_.left;
      case MaskKind::bigbird: {  // Zaheer et al. 2020, §2 / App. D: window of 3 blocks, g global, r random
        const long b = s_.block;
        const long qb = q >= 0 ? q / b : -((-q + b - 1) / b), kb = j / b;
        if (std::abs(qb - kb) <= 1 || kb < s_.globals || (qb >= 0 && qb < s_.globals)) return true;
        const long nkb = (nk_ + b - 1) / b;
        for (int k = 0; k < s_.random; ++k)
          if (long(mask_math::hash3(unsigned(s_.seed), unsigned(qb), unsigned(k)) % unsigned(nkb)) == kb) return true;
        return false;
      }
    }
    return true;
  }
  double apply(const Problem&, int, int h, int i, int j, double x) const override {
    if (s_.kind == MaskKind::alibi) return x - slope(h) * std::abs(double(i) + diag_ - j);
    if (s_.kind == MaskKind::softcap) return s_.softcap * std::tanh(x / s_.softcap);
    return x;
  }
  double grad(const Problem&, int, int, int, int, double x) const override {
    if (s_.kind == MaskKind::softcap) {
      const double t = std::tanh(x / s_.softcap);
      return 1.0 - t * t;
    }
    return 1.0;
  }
  double sink(const Problem&, int, int h) const override {
    return s_.kind == MaskKind::learned_sink ? double(s_.sink_logits[h]) : -std::numeric_limits<double>::infinity();
  }

 private:
  double slope(int h) const { return std::exp2(-8.0 * (h + 1) / heads_); }
  /// The document of token t: the k with cu[k] <= t < cu[k + 1] (binary search).
  int doc(int t) const { return int(std::upper_bound(cu_.begin(), cu_.end(), t) - cu_.begin()) - 1; }
  MaskSpec s_;
  int diag_, heads_, nk_;
  std::vector<int> cu_;
};

}  // namespace

std::unique_ptr<ScoreMod> reference_mod(const MaskSpec& s, const Problem& p) {
  return std::make_unique<ReferenceMask>(s, p);
}

// ------------------------------------------------------------------ layouts

TokenLayout TokenLayout::standard(const Problem& p) {
  TokenLayout l;
  l.q = {(long long)p.heads * p.nq * p.d, (long long)p.nq * p.d, p.d};
  l.o = {(long long)p.heads * p.nq * p.dv, (long long)p.nq * p.dv, p.dv};
  l.k = {(long long)p.kv_heads * p.nk * p.d, (long long)p.nk * p.d, p.d};
  l.v = {(long long)p.kv_heads * p.nk * p.dv, (long long)p.nk * p.dv, p.dv};
  return l;
}

TokenLayout TokenLayout::varlen(const Problem& p) {
  TokenLayout l;
  l.packed = true;
  l.q = {0, p.d, (long long)p.heads * p.d};
  l.o = {0, p.dv, (long long)p.heads * p.dv};
  l.k = {0, p.d, (long long)p.kv_heads * p.d};
  l.v = {0, p.dv, (long long)p.kv_heads * p.dv};
  return l;
}

TokenLayout layout_for(const MaskSpec& s, const Problem& p) {
  return s.kind == MaskKind::document ? TokenLayout::varlen(p) : TokenLayout::standard(p);
}

std::vector<float> to_layout(const std::vector<float>& x, int heads, int n, int w, bool packed) {
  if (!packed) return x;
  std::vector<float> y(x.size());
  for (int h = 0; h < heads; ++h)
    for (int t = 0; t < n; ++t)
      for (int c = 0; c < w; ++c) y[(std::size_t(t) * heads + h) * w + c] = x[(std::size_t(h) * n + t) * w + c];
  return y;
}

std::vector<float> from_layout(const std::vector<float>& x, int heads, int n, int w, bool packed) {
  if (!packed) return x;
  std::vector<float> y(x.size());
  for (int h = 0; h < heads; ++h)
    for (int t = 0; t < n; ++t)
      for (int c = 0; c < w; ++c) y[(std::size_t(h) * n + t) * w + c] = x[(std::size_t(t) * heads + h) * w + c];
  return y;
}

}  // namespace attn::ch06
