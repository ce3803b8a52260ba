#pragma once
/// \file mask_spec.hpp
/// \brief The run-time description of a mask (what the command line asks for), its
///        checks, the one switch that turns it into a policy, the fp64 reference of
///        every variant, and the packed (varlen) layout of document masking.

#include <memory>
#include <string>
#include <vector>

#include "block_map.hpp"
#include "common/problem.hpp"
#include "common/reference.hpp"
#include "mask_policy.hpp"

namespace attn::ch06 {

/// The variants. strided, fixed, longformer and bigbird are the published sparse patterns,
/// one policy type between them (StructuredSparse, mask_policy.hpp).
enum class MaskKind {
  causal, window, chunked, prefix, document, sink, learned_sink, alibi, softcap, custom,
  strided, fixed, longformer, bigbird
};

/// Every variant, in the order the chapter presents them.
const std::vector<MaskKind>& all_mask_kinds();
const char* mask_name(MaskKind k);  ///< the --mask spelling: "learned-sink", ...
bool parse_mask(const std::string& s, MaskKind* out);

struct MaskSpec {
  MaskKind kind = MaskKind::causal;
  int left = 256, right = 0;   ///< --window L[,R]   (window; left is the window of sink)
  int chunk = 256;             ///< --chunk C        (chunked)
  int prefix = -1;             ///< --prefix P       (prefix; -1: Nk / 4)
  std::vector<int> doc_lens;   ///< --doc-lens / --docs (document), summing to N
  int sinks = 4;               ///< --sinks S        (sink)
  double softcap = 30.0;       ///< --softcap C      (softcap)
  bool causal = false;         ///< --causal: for document, learned-sink, alibi, softcap
  int sliding = -1;            ///< --window L with learned-sink or softcap: a causal sliding window (-1: none)
  int seed = 7;                ///< custom, bigbird: the random block pattern
  int stride = 64;             ///< --stride l       (strided)
  int block = 64;              ///< --block l / b    (fixed, bigbird)
  int summary = 8;             ///< --summary c      (fixed: summary columns per block, <= block)
  int globals = -1;            ///< --globals g      (longformer: tokens, default 1; bigbird: blocks, default 2)
  int random = 3;              ///< --random r       (bigbird: random blocks per query block, <= 64)
  std::vector<float> sink_logits;  ///< learned-sink: one per head (natural log)

  /// One line: "window (256, 0)", "document, 4 docs (250 250 250 250)", ...
  std::string describe() const;
};

/// Fills the defaults that depend on the problem (prefix, doc lengths, sink logits)
/// and checks everything: a UsageError (one line, exit 2) for a window below 0, doc
/// lengths that do not sum to N, a softcap of 0, a sliding window other than -1 below 0
/// or on a variant other than learned-sink and softcap, a stride or block below 1, summary
/// columns outside [0, block], random blocks outside [0, 64], ... A sliding window sets
/// `causal`; `globals` -1 becomes its pattern's default.
void finalize_spec(MaskSpec& s, const Problem& p);

/// `k` random document lengths >= 1 summing to n (seeded).
std::vector<int> random_doc_lens(int n, int k, unsigned seed);
/// cu_seqlens = [0, l0, l0 + l1, ...] and the document of every token.
std::vector<int> cu_seqlens(const std::vector<int>& lens);
std::vector<int> doc_of_tokens(const std::vector<int>& lens);

/// The default learnable sink logits: comparable with a row's own mass (log Nk), so
/// the sink takes a visible share of every row's denominator.
std::vector<float> default_sink_logits(int heads, int nk);

/// Data a policy points at: the document of each token and the sink logits, in host
/// or device memory (whichever the policy will run in).
struct PolicyData {
  const int* doc = nullptr;
  const float* sinks = nullptr;
};

/// The one switch from a run-time spec to a compile-time policy: calls f(policy).
template <class F>
decltype(auto) visit_policy(const MaskSpec& s, const Problem& p, const PolicyData& d, F&& f) {
  const int diag = p.nk - p.nq;
  switch (s.kind) {
    case MaskKind::causal: return f(Causal{{}, CausalMask(p.nq, p.nk)});
    case MaskKind::window: { Window c; c.diag = diag, c.left = s.left, c.right = s.right; return f(c); }
    case MaskKind::chunked: { Chunked c; c.diag = diag, c.chunk = s.chunk; return f(c); }
    case MaskKind::prefix: { PrefixLM c; c.diag = diag, c.prefix = s.prefix; return f(c); }
    case MaskKind::document: { Document c; c.doc = d.doc, c.n = p.nq, c.causal = s.causal; return f(c); }
    case MaskKind::sink: { SinkWindow c; c.diag = diag, c.sinks = s.sinks, c.window = s.left; return f(c); }
    case MaskKind::learned_sink: { LearnedSink c; c.sinks = d.sinks, c.diag = diag, c.causal = s.causal, c.window = s.sliding; return f(c); }
    case MaskKind::alibi: { Alibi c; c.diag = diag, c.heads = p.heads, c.causal = s.causal; return f(c); }
    case MaskKind::softcap: { Softcap c; c.cap = float(s.softcap), c.diag = diag, c.causal = s.causal, c.window = s.sliding; return f(c); }
    case MaskKind::strided: case MaskKind::fixed: case MaskKind::longformer: case MaskKind::bigbird: {
      StructuredSparse c;  // one policy type for the four patterns
      c.pattern = s.kind == MaskKind::strided ? SparsePattern::strided : s.kind == MaskKind::fixed ? SparsePattern::fixed
                : s.kind == MaskKind::longformer ? SparsePattern::longformer : SparsePattern::bigbird;
      c.diag = diag, c.l = s.kind == MaskKind::strided ? s.stride : s.block, c.c = s.summary, c.w = s.left;
      c.g = s.globals, c.r = s.random, c.seed = s.seed, c.nkb = (p.nk + s.block - 1) / s.block;
      return f(c);
    }
    case MaskKind::custom: default: { BlockSparse c; c.diag = diag, c.seed = s.seed; return f(c); }
  }
}

/// The block map of a spec at tile sizes Br x Bc (host data).
BlockMap build_block_map(const MaskSpec& s, const Problem& p, int Br, int Bc);
/// Document masking, one packed batch: the document map (tiles from each document's
/// start, block_map.hpp), which the sm90a step v3 walks.
BlockMap build_document_block_map(const MaskSpec& s, const Problem& p, int Br, int Bc);

/// The fp64 reference's view of a mask: written from the definitions directly (not
/// through the policies), so the reference checks the policies too. Give it to
/// ForwardOracle / BackwardOracle with a problem whose own `causal` is false.
std::unique_ptr<ScoreMod> reference_mod(const MaskSpec& s, const Problem& p);

/// The problem the oracles and kernels see: the mask does all masking (causal off).
Problem masked_problem(const Problem& p);

/// Forward FLOPs over kept pairs (4 d per pair; the project's causal count for causal).
double mask_flops_forward(const MaskSpec& s, const Problem& p, const BlockMap& m);

// ------------------------------------------------------------------ layouts

/// Element strides of one tensor: element (b, h, i, c) is at b*batch + h*head + i*row + c.
struct Strides {
  long long batch = 0, head = 0, row = 0;
  long long at(int b, int h, int i) const { return b * batch + h * head + i * row; }
};
/// Where Q, K, V, O (and dQ, dK, dV, dO alike) live. `standard`: [B][H][N][d], the
/// project's layout; `packed`: FlashAttention's varlen layout [total_tokens][H][d]
/// (one batch of back-to-back sequences, no padding), which document masking uses.
struct TokenLayout {
  Strides q, k, v, o;
  bool packed = false;
  static TokenLayout standard(const Problem& p);
  static TokenLayout varlen(const Problem& p);
};
/// The layout a spec runs in (packed for document masking).
TokenLayout layout_for(const MaskSpec& s, const Problem& p);
/// [B][H][N][w] -> the layout's order, and back (identity for the standard layout).
std::vector<float> to_layout(const std::vector<float>& x, int heads, int n, int w, bool packed);
std::vector<float> from_layout(const std::vector<float>& x, int heads, int n, int w, bool packed);

}  // namespace attn::ch06
