#pragma once
/// \file mask_policy.hpp
/// \brief One interface for every mask and score modifier, and the variants written
///        against it (`__host__ __device__`: the CPU model and the kernels share them).
///
/// A *policy* is a small struct, passed by value as a template parameter of the
/// kernel, with four members (FlexAttention's `mask_mod` / `score_mod`, and
/// FlashAttention-4's `mask_mod` / `score_mod` / block sparsity, in one type):
///
///     bool     keep(b, h, i, j)             may query row i of head (b, h) see key j?
///     T        score(s, b, h, i, j)         the modified score of a kept pair (s = tau q.k)
///     T        dscore(s, b, h, i, j)        d score / d s, for the backward
///     TileKind classify(b, h, TileRange)    skip / full / partial for a whole tile
///
/// plus three compile-time facts the kernel branches on (so an unused feature costs
/// nothing): `kScore` (score() is not the identity), `kSink` (a learnable sink logit
/// sits in the softmax denominator, `sink(h)`), and `kPerBatch` / `kPerHead` (the
/// block map differs between batches / heads).
///
/// classify() must be *conservative*: `full` only when keep() is true for every pair
/// of the tile, `skip` only when it is false for every pair. `partial` is always
/// allowed (the kernel then applies keep() to each element). The block map
/// (block_map.hpp) asks classify() once per tile on the host, and the kernel visits
/// only the tiles it lists.
///
///     keys ->        a causal tile map (Br = Bc), bottom-right aligned
///     q   [P . . .]   P = partial: the diagonal crosses it, keep() per element
///     |   [F P . .]   F = full: every pair kept, no mask arithmetic at all
///     v   [F F P .]   . = skip: never loaded
///         [F F F P]
///
/// Positions. With Nq != Nk the masks are aligned bottom-right, as FlashAttention
/// does: query row i sits at key position `q = i + diag`, `diag = Nk - Nq`.

#include <cmath>

#include "common/index.hpp"           // CausalMask: the causal rule
#include "common/online_softmax.hpp"  // ATTN_HD
#if defined(__CUDACC__)
#include "common/cuda/fast_math.cuh"  // tanh_approx, the device's tanh_
#endif

namespace attn::ch06 {

/// What the kernel does with one tile of the score matrix.
enum class TileKind : unsigned char { skip = 0, full = 1, partial = 2 };

/// A tile of the score matrix: query rows [i0, i1) and keys [j0, j1), already
/// clipped to the problem (i1 <= Nq, j1 <= Nk, never empty).
struct TileRange {
  int i0, i1, j0, j1;
};

/// The keys one row keeps, as intervals [lo, hi] (inclusive; empty when lo > hi): the
/// optional `span(b, h, i)` of a policy with kSpans = 1 or 2, which must agree with
/// keep(b, h, i, j) for every key j >= 0. A kernel masks a partial tile from the row's
/// span with a subtraction and an unsigned compare per element, instead of keep().
struct Span {
  int lo0, hi0;
  int lo1 = 1, hi1 = 0;  ///< the second interval (kSpans = 2), else empty
};

namespace mask_math {
/// On the device, one MUFU instruction (tanh.approx.f32, common/cuda/fast_math.cuh):
/// tanhf there cost the softcap kernels 2.5x their causal time on the H200.
ATTN_HD float tanh_(float x) {
#if defined(__CUDA_ARCH__)
  return attn::cuda::tanh_approx(x);
#else
  return ::tanhf(x);
#endif
}
ATTN_HD double tanh_(double x) { return ::tanh(x); }
ATTN_HD int floor_div(int a, int c) { return a >= 0 ? a / c : -((-a + c - 1) / c); }
ATTN_HD int abs_(int x) { return x < 0 ? -x : x; }
/// A 32-bit integer hash (for the random block-sparse example): same on host and device.
ATTN_HD unsigned hash3(unsigned a, unsigned b, unsigned c) {
  unsigned x = a * 0x9E3779B1u ^ (b + 0x7F4A7C15u) * 0x85EBCA77u ^ (c + 0x165667B1u) * 0xC2B2AE3Du;
  x ^= x >> 15;
  x *= 0x2C1B3C6Du;
  x ^= x >> 12;
  return x;
}
}  // namespace mask_math

/// The defaults every policy inherits: no score modifier, no sink, one block map for
/// every batch and head. A variant overrides only what it changes.
struct PolicyBase {
  static constexpr int kSpans = 0;  ///< 0: no span(), the kernels ask keep() per element
  static constexpr bool kRows = false;  ///< true: a row() of the sparse patterns (SparseRow)
  static constexpr bool kScore = false;
  static constexpr bool kDscore = false;  ///< dscore() is not the constant 1 (softcap; not ALiBi)
  static constexpr bool kSink = false;
  static constexpr bool kPerBatch = false;
  static constexpr bool kPerHead = false;
  template <class T> ATTN_HD T score(T s, int, int, int, int) const { return s; }
  template <class T> ATTN_HD T dscore(T, int, int, int, int) const { return T(1); }
  ATTN_HD float sink(int) const { return 0.f; }
};

/// classify() by asking keep() for every pair of the tile: correct for any mask, and
/// what a new variant gets before it writes an analytic classify(). O(Br * Bc) per
/// tile on the host, so the block map of a large problem takes a while.
template <class P>
TileKind classify_by_elements(const P& pol, int b, int h, const TileRange& t) {
  bool any = false, all = true;
  for (int i = t.i0; i < t.i1; ++i)
    for (int j = t.j0; j < t.j1; ++j) {
      const bool k = pol.keep(b, h, i, j);
      any |= k;
      all &= k;
    }
  return !any ? TileKind::skip : all ? TileKind::full : TileKind::partial;
}

/// A row sees keys j <= i + diag (with `causal`), or every key.
ATTN_HD TileKind classify_causal(bool causal, int diag, const TileRange& t) {
  if (!causal || t.j1 - 1 <= t.i0 + diag) return TileKind::full;
  if (t.j0 > t.i1 - 1 + diag) return TileKind::skip;
  return TileKind::partial;
}

/// The mask of a policy that is causal or none, with an optional causal sliding window
/// on top (`window` >= 0; -1: none): row i sees key j iff j <= q and q - j <= window,
/// q = i + diag, the left bound of the Window policy (window 0 sees only j = q). A window
/// implies causal. LearnedSink and Softcap hold one (gpt-oss: sink + window 128; Gemma 2:
/// softcap + window 4096), so the composition costs no new policy type.
struct CausalOrWindow {
  int diag;
  bool causal;
  int window = -1;
  ATTN_HD bool keep(int i, int j) const {
    const int q = i + diag;
    if (window >= 0) return j <= q && q - j <= window;
    return !causal || j <= q;
  }
  ATTN_HD Span span(int i) const {
    const int q = i + diag;
    if (window >= 0) return {q - window, q};
    return {0, causal ? q : 0x7fffffff};
  }
  ATTN_HD TileKind classify(const TileRange& t) const {
    if (window < 0) return classify_causal(causal, diag, t);
    const int q0 = t.i0 + diag, q1 = t.i1 - 1 + diag;  // first and last row's position
    if (t.j0 > q1 || q0 - (t.j1 - 1) > window) return TileKind::skip;  // above the diagonal / left of every band
    if (t.j1 - 1 <= q0 && q1 - t.j0 <= window) return TileKind::full;   // inside every row's band
    return TileKind::partial;
  }
};

// ============================================================================ the variants

/// No mask at all (the score modifiers below build on it).
struct Dense : PolicyBase {
  ATTN_HD bool keep(int, int, int, int) const { return true; }
  ATTN_HD TileKind classify(int, int, const TileRange&) const { return TileKind::full; }
};

/// Causal, bottom-right aligned: row i sees keys j <= i + (Nk - Nq). The project's one
/// causal rule (common/index.hpp's CausalMask) as a policy.
struct Causal : PolicyBase {
  static constexpr int kSpans = 1;
  CausalMask rule;
  ATTN_HD bool keep(int, int, int i, int j) const { return rule.visible(i, j); }
  ATTN_HD Span span(int, int, int i) const { return {0, i + rule.diag}; }
  ATTN_HD TileKind classify(int, int, const TileRange& t) const {
    const TileMask m = rule.tile(t.i0, t.i1, t.j0, t.j1);
    return m == TileMask::skip ? TileKind::skip : m == TileMask::full ? TileKind::full : TileKind::partial;
  }
};

/// Sliding window (left, right) around the aligned diagonal: q - left <= j <= q + right.
/// (left, 0) is the causal sliding window of Mistral / Gemma; window 0 sees only j = q.
struct Window : PolicyBase {
  static constexpr int kSpans = 1;
  int diag, left, right;
  ATTN_HD bool keep(int, int, int i, int j) const {
    const int q = i + diag;
    return j >= q - left && j <= q + right;
  }
  ATTN_HD Span span(int, int, int i) const { return {i + diag - left, i + diag + right}; }
  ATTN_HD TileKind classify(int, int, const TileRange& t) const {
    // EXERCISE ch06.1: classify a window tile: skip, full or partial from the four corners
    //| return TileKind::partial;  // TODO: your code here (partial is correct, but skips nothing)
    const int q0 = t.i0 + diag, q1 = t.i1 - 1 + diag;          // first and last row's position
    if (t.j0 > q1 + right || t.j1 - 1 < q0 - left) return TileKind::skip;  // wholly right / left of the band
    if (t.j0 >= q1 - left && t.j1 - 1 <= q0 + right) return TileKind::full;  // inside every row's band
    return TileKind::partial;
    // END EXERCISE
  }
};

/// Chunked local attention (Llama 4): causal inside fixed chunks of C positions.
struct Chunked : PolicyBase {
  static constexpr int kSpans = 1;
  int diag, chunk;
  ATTN_HD bool keep(int, int, int i, int j) const {
    const int q = i + diag;
    return j <= q && q / chunk == j / chunk;  // j >= 0, so j <= q implies q >= 0
  }
  ATTN_HD Span span(int, int, int i) const {
    const int q = i + diag;
    return q < 0 ? Span{1, 0} : Span{q / chunk * chunk, q};
  }
  ATTN_HD TileKind classify(int, int, const TileRange& t) const {
    const int q0 = t.i0 + diag, q1 = t.i1 - 1 + diag;
    if (q1 < 0 || t.j0 > q1) return TileKind::skip;
    const int c0 = mask_math::floor_div(q0, chunk), c1 = q1 / chunk;  // chunks of the rows
    if ((t.j1 - 1) / chunk < c0 || t.j0 / chunk > c1) return TileKind::skip;
    if (q0 >= 0 && c0 == c1 && t.j0 / chunk == c0 && (t.j1 - 1) / chunk == c0 && t.j1 - 1 <= q0)
      return TileKind::full;
    return TileKind::partial;
  }
};

/// Prefix-LM: the first P keys are visible to every row (bidirectional prefix), causal after.
struct PrefixLM : PolicyBase {
  static constexpr int kSpans = 1;
  int diag, prefix;
  ATTN_HD bool keep(int, int, int i, int j) const { return j < prefix || j <= i + diag; }
  ATTN_HD Span span(int, int, int i) const { return {0, i + diag > prefix - 1 ? i + diag : prefix - 1}; }
  ATTN_HD TileKind classify(int, int, const TileRange& t) const {
    if (t.j1 - 1 < prefix) return TileKind::full;
    const TileKind c = classify_causal(true, diag, t);
    return c == TileKind::skip && t.j0 < prefix ? TileKind::partial : c;
  }
};

/// Document masking over packed sequences: a token sees only tokens of its own
/// document (and, with `causal`, not later ones). `doc[t]` is the document of token
/// t, from cu_seqlens; the documents lie back to back, so doc[] is non-decreasing.
struct Document : PolicyBase {
  static constexpr bool kPerBatch = true;  // each packed batch has its own documents
  const int* doc;                          // [batch][n]
  int n;
  bool causal;
  ATTN_HD bool keep(int b, int, int i, int j) const {
    return doc[b * n + i] == doc[b * n + j] && (!causal || j <= i);
  }
  ATTN_HD TileKind classify(int b, int, const TileRange& t) const {
    const int* d = doc + b * n;
    if (d[t.j1 - 1] < d[t.i0] || d[t.j0] > d[t.i1 - 1]) return TileKind::skip;  // no shared document
    const TileKind c = classify_causal(causal, 0, t);
    if (c == TileKind::skip) return c;
    const bool one_doc = d[t.i0] == d[t.i1 - 1] && d[t.j0] == d[t.i0] && d[t.j1 - 1] == d[t.i0];
    return one_doc && c == TileKind::full ? TileKind::full : TileKind::partial;
  }
};

/// StreamingLLM: the first `sinks` keys (attention sinks) plus a causal window of
/// `window` keys to the left: j <= q and (j < sinks or q - j <= window).
struct SinkWindow : PolicyBase {
  static constexpr int kSpans = 2;
  int diag, sinks, window;
  ATTN_HD bool keep(int, int, int i, int j) const {
    const int q = i + diag;
    return j <= q && (j < sinks || q - j <= window);
  }
  ATTN_HD Span span(int, int, int i) const {
    const int q = i + diag;
    return {0, sinks - 1 < q ? sinks - 1 : q, q - window, q};
  }
  ATTN_HD TileKind classify(int, int, const TileRange& t) const {
    const int q0 = t.i0 + diag, q1 = t.i1 - 1 + diag;
    if (t.j0 > q1) return TileKind::skip;                                   // above the diagonal
    if (t.j0 >= sinks && q0 - (t.j1 - 1) > window) return TileKind::skip;   // left of every window
    const bool in_window = q1 - t.j0 <= window || t.j1 - 1 < sinks;
    return t.j1 - 1 <= q0 && in_window ? TileKind::full : TileKind::partial;
  }
};

/// A learnable per-head sink logit (gpt-oss, FA4's learnable_sink): one extra term
/// e^{sink_h} in every row's softmax denominator, with no value row. It changes only
/// the state the row starts from (online_softmax.hpp, SoftmaxState::with_sink):
/// (m, l) = (sink, 1) instead of (-inf, 0). The mask is causal or none, or a causal
/// sliding window (`window` >= 0, as gpt-oss's sliding layers: window 128).
struct LearnedSink : PolicyBase {
  static constexpr bool kSink = true;
  static constexpr int kSpans = 1;
  const float* sinks;  // [heads], natural-log units
  int diag;
  bool causal;
  int window = -1;  ///< -1: none; else j <= q and q - j <= window (implies causal)
  ATTN_HD CausalOrWindow mask() const { return {diag, causal, window}; }
  ATTN_HD bool keep(int, int, int i, int j) const { return mask().keep(i, j); }
  ATTN_HD Span span(int, int, int i) const { return mask().span(i); }
  ATTN_HD TileKind classify(int, int, const TileRange& t) const { return mask().classify(t); }
  ATTN_HD float sink(int h) const { return sinks[h]; }
};

/// ALiBi (Press et al.): a linear distance penalty, slope_h = 2^(-8 (h + 1) / H):
/// score = s - slope_h |q - j|. Its derivative is 1.
struct Alibi : PolicyBase {
  static constexpr bool kScore = true;
  static constexpr int kSpans = 1;
  int diag, heads;
  bool causal;
  ATTN_HD Span span(int, int, int i) const { return {0, causal ? i + diag : 0x7fffffff}; }
  ATTN_HD float slope(int h) const { return ::exp2f(-8.f * float(h + 1) / float(heads)); }
  ATTN_HD bool keep(int, int, int i, int j) const { return !causal || j <= i + diag; }
  template <class T> ATTN_HD T score(T s, int, int h, int i, int j) const {
    return s - T(slope(h)) * T(mask_math::abs_(i + diag - j));
  }
  template <class T> ATTN_HD T dscore(T, int, int, int, int) const { return T(1); }
  ATTN_HD TileKind classify(int, int, const TileRange& t) const { return classify_causal(causal, diag, t); }
};

/// Softcap (Gemma 2, Grok): score = cap tanh(s / cap), derivative 1 - tanh^2(s / cap).
/// Causal or none, or a causal sliding window (`window` >= 0; Gemma 2's local layers: 4096).
struct Softcap : PolicyBase {
  static constexpr bool kScore = true;
  static constexpr bool kDscore = true;
  static constexpr int kSpans = 1;
  float cap;
  int diag;
  bool causal;
  int window = -1;  ///< -1: none; else j <= q and q - j <= window (implies causal)
  ATTN_HD CausalOrWindow mask() const { return {diag, causal, window}; }
  ATTN_HD Span span(int, int, int i) const { return mask().span(i); }
  ATTN_HD bool keep(int, int, int i, int j) const { return mask().keep(i, j); }
  template <class T> ATTN_HD T score(T s, int, int, int, int) const { return T(cap) * mask_math::tanh_(s * (T(1) / T(cap))); }
  template <class T> ATTN_HD T dscore(T s, int, int, int, int) const {
    const T th = mask_math::tanh_(s * (T(1) / T(cap)));
    return T(1) - th * th;
  }
  ATTN_HD TileKind classify(int, int, const TileRange& t) const { return mask().classify(t); }
};

/// One row of a structured sparse pattern inside one tile, in a form a kernel tests with a
/// few integer operations per key and no division (StructuredSparse::row(), built once per row
/// and tile). Key j of the tile is kept iff
///
///     j <= last  and  ( j in interval 0 or 1  or  j < pre  or  ((j + shift) & mask) < width )
///
/// An interval is a first key and a count, tested as row spans are (Span): unsigned(j -
/// first) < count. The last test is a *comb*: every key whose position modulo mask + 1 (a
/// power of two) lies in a window of `width` residues. `exact` false: the row has no such
/// form in this tile, and the kernel asks keep() as before.
struct SparseRow {
  int last = -1;                            ///< no key after it (causal: q; the tile's end folded in)
  int first0 = 0, first1 = 0;               ///< the two intervals' first keys
  unsigned count0 = 0, count1 = 0;          ///< and their lengths (0: empty)
  int pre = 0;                              ///< every key j < pre (the global tokens)
  unsigned shift = 0, mask = 0, width = 0;  ///< the comb (width 0: none)
  bool exact = true;
  ATTN_HD bool keep(int j) const {
    const unsigned u = unsigned(j);
    const bool in = u - unsigned(first0) < count0 || u - unsigned(first1) < count1 || j < pre ||
                    ((u + shift) & mask) < width;
    return j <= last && in;
  }
};

/// The four structured sparse patterns of the long-sequence papers, one run-time field.
enum class SparsePattern : unsigned char { strided, fixed, longformer, bigbird };

/// The published sparse patterns in one policy type: `pattern` picks one at run time, so
/// the four share one instantiation of every kernel (a policy type costs build time in
/// each). q = i + diag is the query's key position (bottom-right alignment, as Window).
///
///  - strided (Child et al. 2019, "Generating Long Sequences with Sparse Transformers",
///    §4.2, strided attention): causal, j <= q and ((q - j) < l or (q - j) mod l == 0),
///    l = `l`. The two heads A(1) (the previous l) and A(2) (every l-th) merged into one
///    mask, as the paper's "merged head" (§4.3) attends to both.
///  - fixed (same paper, §4.2, fixed attention): causal, j <= q and (floor(j / l) ==
///    floor(q / l) or j mod l >= l - c): the query's own block of l, plus the last c
///    "summary" columns of every block, c = `c` (the paper's j mod l in {l - c, ..., l}).
///  - longformer (Beltagy et al. 2020, "Longformer", §3.1): non-causal, |q - j| <= w
///    (w = `w` keys each side: the paper's window of size w' covers w'/2 each side) or
///    q < g or j < g: the first g positions are global
///    (they see every key, and every query sees them), g = `g`; a query at q < 0 is not.
///  - bigbird (Zaheer et al. 2020, "Big Bird", §2 and Appendix D, the ITC block form):
///    blocks of b = `l` tokens, Qb = floor(q / b), Kb = floor(j / b): kept iff
///    |Qb - Kb| <= 1 (three blocks), or Kb < g or 0 <= Qb < g (g = `g` global blocks),
///    or Kb is one of the r = `r` random blocks of Qb: hash3(seed, Qb, k) mod nkb,
///    k < r (nkb = ceil(Nk / b); draws may coincide, so at most r extra blocks).
///
/// No span(): strided and fixed keep many intervals per row, so the sm_80 and backward
/// kernels' partial tiles ask keep(). classify() is exact (host only): it counts each row's kept keys in the tile.
/// row() writes one row inside one tile as a SparseRow: the final kernel (steps/final.cu) masks
/// a partial tile's rows from it, and asks keep() only where a row has no such form.
struct StructuredSparse : PolicyBase {
  static constexpr bool kRows = true;
  SparsePattern pattern = SparsePattern::strided;
  int diag = 0;
  int l = 64;     ///< strided: stride; fixed: block; bigbird: block b
  int c = 8;      ///< fixed: summary columns per block (0 <= c <= l)
  int w = 64;     ///< longformer: window, keys each side
  int g = 1;      ///< longformer: global tokens; bigbird: global blocks
  int r = 3;      ///< bigbird: random blocks per query block
  int seed = 7;   ///< bigbird: the random blocks
  int nkb = 1;    ///< bigbird: key blocks, ceil(Nk / b)

  /// bigbird at block level: may query block qb see key block kb?
  ATTN_HD bool block_keep(int qb, int kb) const {
    if (mask_math::abs_(qb - kb) <= 1 || kb < g || (qb >= 0 && qb < g)) return true;
    for (int k = 0; k < r; ++k)
      if (int(mask_math::hash3(unsigned(seed), unsigned(qb), unsigned(k)) % unsigned(nkb)) == kb) return true;
    return false;
  }
  ATTN_HD bool keep(int, int, int i, int j) const { return keep_at(i + diag, j); }
  /// keep() at position q. Out of line on the device: inlined into every element of every
  /// kernel (divisions by a run-time l, four patterns), it doubled the sm90a final kernel's
  /// compile time; a partial tile of these patterns pays one call per element instead (in
/// the final sm_90a forward only for a row that row() cannot write).
#if defined(__CUDACC__)
  __noinline__
#endif
  ATTN_HD bool keep_at(int q, int j) const {
    switch (pattern) {
      // EXERCISE ch06.10: the Sparse Transformer's two patterns (section 4.2): strided keeps the last l keys and every l-th before them; fixed keeps the query's own block of l and the last c columns of every block
      //| case SparsePattern::strided: return j <= q;  // TODO: your code here (causal only: every key, no sparsity)
      //| case SparsePattern::fixed: return j <= q;    // TODO: your code here
      case SparsePattern::strided: return j <= q && (q - j < l || (q - j) % l == 0);
      case SparsePattern::fixed: return j <= q && (j / l == q / l || j % l >= l - c);  // j >= 0, so q >= 0
      // END EXERCISE
      case SparsePattern::longformer: return (q >= 0 && q < g) || j < g || mask_math::abs_(q - j) <= w;
      case SparsePattern::bigbird: default: return block_keep(mask_math::floor_div(q, l), j / l);
    }
  }
  /// Row i inside the tile of keys [j0, j1] (0 <= j0; j1 < Nk, the ragged end folded in):
  /// for every key j >= j0, row(i, j0, j1).keep(j) == (j <= j1 && keep(i, j)) where `exact`.
  ///  - strided: the last l keys [q - l + 1, q], and the comb of every l-th key back from q
  ///    (shift -q, width 1); fixed: the own block [q - q mod l, q], and the comb of the last
  ///    c columns of every block (j mod l >= l - c iff (j + c) mod l < c). Both need l a power
  ///    of two (mask l - 1); otherwise `exact` is false.
  ///  - longformer: the window [q - w, q + w] and the prefix of g global keys; a global
  ///    query (0 <= q < g) keeps the whole tile.
  ///  - bigbird: the tile's kept key blocks (band, global, random: block_keep()) as up to
  ///    two runs of blocks; more runs, or more than 4 key blocks in the tile: not exact.
  /// One division (bigbird's blocks) and a few hashes per row and tile, none per key.
  ATTN_HD SparseRow row(int i, int j0, int j1) const {
    const int q = i + diag;
    SparseRow r;
    r.last = j1;
    const bool pow2 = (l & (l - 1)) == 0;
    auto interval = [](long lo, long hi, int* first, unsigned* count) {  // [lo, hi]; lo < 0 is fine (keys j >= 0 only)
      *first = int(lo);
      *count = hi >= lo ? unsigned(hi - lo + 1) : 0u;
    };
    switch (pattern) {
      case SparsePattern::strided:
      case SparsePattern::fixed:
        if (!pow2) {
          r.exact = false;
          return r;
        }
        r.last = q < j1 ? q : j1;  // causal (q < 0: no key)
        r.mask = unsigned(l - 1);
        if (pattern == SparsePattern::strided) {
          interval(long(q) - l + 1, q, &r.first0, &r.count0);
          r.shift = 0u - unsigned(q), r.width = 1;
        } else {
          interval(long(q) & ~long(l - 1), q, &r.first0, &r.count0);
          r.shift = unsigned(c), r.width = unsigned(c);
        }
        return r;
      case SparsePattern::longformer:
        if (q >= 0 && q < g) {
          interval(0, j1, &r.first0, &r.count0);
        } else {
          const long lo = long(q) - w, hi = long(q) + w;
          interval(lo > j0 ? lo : j0, hi < j1 ? hi : j1, &r.first0, &r.count0);
          r.pre = g;
        }
        return r;
      case SparsePattern::bigbird: default: {
        const int qb = mask_math::floor_div(q, l), kb0 = j0 / l, kb1 = j1 / l;
        if (kb1 - kb0 >= 4) {
          r.exact = false;
          return r;
        }
        int runs = 0, start[2] = {0, 0}, end[2] = {-1, -1};
        for (int kb = kb0; kb <= kb1; ++kb) {
          if (!block_keep(qb, kb)) continue;
          if (runs > 0 && end[runs - 1] == kb - 1) {
            end[runs - 1] = kb;
          } else if (runs == 2) {
            r.exact = false;
            return r;
          } else {
            start[runs] = end[runs] = kb;
            ++runs;
          }
        }
        interval(long(start[0]) * l, long(end[0]) * l + l - 1, &r.first0, &r.count0);
        interval(long(start[1]) * l, long(end[1]) * l + l - 1, &r.first1, &r.count1);
        return r;
      }
    }
  }
  /// How many keys of [lo, hi] (lo >= 0) row i keeps, in O(1) (bigbird: O(blocks)).
  long kept_in_row(int i, int lo, int hi) const {
    const long q = long(i) + diag;
    auto meet = [](long a, long b, long x, long y) {  // |[a, b] n [x, y]|
      const long s = a > x ? a : x, e = b < y ? b : y;
      return e >= s ? e - s + 1 : 0L;
    };
    switch (pattern) {
      case SparsePattern::strided: {
        const long h = hi < q ? hi : q;
        if (h < lo) return 0;
        const long d0 = q - h, d1 = q - lo;  // the distances q - j of the row's keys
        const long far0 = d0 > l ? d0 : l;  // multiples of l in [max(d0, l), d1]
        const long far = d1 >= far0 ? d1 / l - (far0 - 1) / l : 0;
        return meet(0, l - 1, d0, d1) + far;
      }
      case SparsePattern::fixed: {
        const long h = hi < q ? hi : q;
        if (h < lo) return 0;
        auto summary = [&](long x) {  // keys j in [0, x] with j mod l >= l - c
          if (x < 0) return 0L;
          const long rest = (x + 1) % l - (l - c);
          return (x + 1) / l * c + (rest > 0 ? rest : 0);
        };
        const long b0 = q / l * l;  // the row's own block [b0, q]
        const long s0 = lo > b0 ? lo : b0;
        const long own_summary = h >= s0 ? summary(h) - summary(s0 - 1) : 0;
        return meet(b0, q, lo, h) + summary(h) - summary(lo - 1) - own_summary;
      }
      case SparsePattern::longformer: {
        if (q >= 0 && q < g) return hi - lo + 1;
        const long a = meet(0, g - 1, lo, hi), b = meet(q - w, q + w, lo, hi);
        const long both = meet(q - w > 0 ? q - w : 0, q + w < g - 1 ? q + w : g - 1, lo, hi);
        return a + b - both;
      }
      case SparsePattern::bigbird: default: {
        const int qb = mask_math::floor_div(int(q), l);
        long n = 0;
        for (int kb = lo / l; kb <= hi / l; ++kb)
          if (block_keep(qb, kb)) n += meet(long(kb) * l, long(kb) * l + l - 1, lo, hi);
        return n;
      }
    }
  }
  TileKind classify(int, int, const TileRange& t) const {
    bool any = false, all = true;
    const long width = t.j1 - t.j0;
    for (int i = t.i0; i < t.i1 && (all || !any); ++i) {
      const long n = kept_in_row(i, t.j0, t.j1 - 1);
      any |= n > 0;
      all &= n == width;
    }
    return !any ? TileKind::skip : all ? TileKind::full : TileKind::partial;
  }
};

// EXERCISE ch06.3: a custom mask: causal, and a random quarter of the 128 x 128 blocks
//| struct BlockSparse : PolicyBase {  // TODO: keep() that keeps the diagonal block, block 0, and hash % 4 == 0
//|   int diag, seed;
//|   ATTN_HD bool keep(int, int, int i, int j) const { return j <= i + diag; }
//|   TileKind classify(int b, int h, const TileRange& t) const { return classify_by_elements(*this, b, h, t); }
//| };
/// The custom example, a new variant in a dozen lines: random block sparsity (in the
/// spirit of BigBird). Causal; every query block keeps its own diagonal block and
/// key block 0 (a global block), and a random quarter of the others. classify() is
/// left to keep() itself (classify_by_elements): the host builds the block map.
struct BlockSparse : PolicyBase {
  int diag, seed;
  ATTN_HD bool keep(int, int, int i, int j) const {
    const int q = i + diag, bq = q / 128, bk = j / 128;
    if (j > q) return false;                                    // causal
    return bq == bk || bk == 0 || mask_math::hash3(unsigned(seed), unsigned(bq), unsigned(bk)) % 4 == 0;
  }
  TileKind classify(int b, int h, const TileRange& t) const { return classify_by_elements(*this, b, h, t); }
};
// END EXERCISE

}  // namespace attn::ch06
