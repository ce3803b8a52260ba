#pragma once
/// \file index.hpp
/// \brief Index arithmetic every kernel and CPU model shares, written once and
///        usable from host C++ without CUDA: `ceil_div`, the GQA head map, and
///        the one causal visibility rule with its per-block consequences.
///
/// Device code includes it through `common/cuda/index.cuh`; a `.cpp` includes
/// this file directly (every function is `constexpr` and, under nvcc,
/// `__host__ __device__`).
///
/// **Causal masking is aligned bottom-right** (FlashAttention >= 2.1): with nq
/// queries and nk keys, query i sees key j iff
///
///     j <= i + (nk - nq)
///
/// so the last query always sees the last key. For nq > nk the first nq - nk
/// queries see nothing (empty rows: output 0, LSE = -inf).
///
///             keys j ->   0 1 2 3 4 5          nq = 4, nk = 6, diag = nk - nq = 2
///     query 0             x x x . . .          x visible, . masked
///     query 1             x x x x . .
///     query 2             x x x x x .
///     query 3             x x x x x x
///
/// A tile of rows [r0, r1) x keys [c0, c1) is then one of three kinds:
///
///     skip     every key is masked for every row:   c0     > (r1 - 1) + diag
///     full     every key is visible to every row:   c1 - 1 <=  r0      + diag
///     partial  the diagonal crosses the tile: needs the element-wise mask

#include "common/hd.hpp"

namespace attn {

/// ceil(a / b) for a >= 0, b > 0: how many blocks of b cover a.
ATTN_HD constexpr int ceil_div(int a, int b) { return (a + b - 1) / b; }

/// GQA/MQA: the KV head query head h reads. The heads / kv_heads query heads of a
/// group are consecutive: h = 0..g-1 read KV head 0, and so on (heads % kv_heads == 0).
ATTN_HD constexpr int kv_head_of(int h, int heads, int kv_heads) { return h / (heads / kv_heads); }

/// How a (query block, key block) tile meets the causal mask (see the file comment).
enum class TileMask { skip, full, partial };

/// The causal rule of one problem (nq queries, nk keys), bottom-right aligned: the
/// one implementation the free functions below use.
///
/// **In tensor-core kernels** (chapter 04's steps 2-9, its final kernel and backward, and the kernels
/// derived from them) the rule is written as `const int diag = causal_diag(nq, nk);`
/// once, then `key > row + diag` (masked) inline. The same arithmetic through this
/// struct or through a helper call compiled to other machine code at 255 registers:
/// ptxas allocated differently and spilled more (chapter 04's backward at d = 128:
/// 24 bytes spilled per thread instead of 4; chapter 04's LAB.md), while the inline
/// form keeps the kernels' code as it was measured.
struct CausalMask {
  int nq, nk;
  int diag;  ///< query i sees keys j <= i + diag; diag = nk - nq

  ATTN_HD constexpr CausalMask(int nq_, int nk_) : nq(nq_), nk(nk_), diag(nk_ - nq_) {}

  /// Key j is visible from query i.
  ATTN_HD constexpr bool visible(int i, int j) const { return j <= i + diag; }

  /// One past the last key any query of rows [r0, r1) sees, clamped to [0, nk]: a
  /// causal kernel walks keys [0, key_end(r1)) for that row block; 0 when every row
  /// of the block is empty.
  ATTN_HD constexpr int key_end(int r1) const {
    const int e = r1 + diag;  // the last row, r1 - 1, sees keys <= r1 - 1 + diag
    return e < 0 ? 0 : (e < nk ? e : nk);
  }

  /// The first query that sees key j, clamped to [0, nq]: key block [c0, c1) is
  /// needed by rows [first_query(c0), nq) (where a K/V-parallel backward starts).
  ATTN_HD constexpr int first_query(int j) const {
    const int i = j - diag;
    return i < 0 ? 0 : (i < nq ? i : nq);
  }

  /// Rows [r0, r1) against keys [c0, c1), r0 < r1 and c0 < c1. Ragged ends (keys at
  /// or past nk) are not the causal rule's business: a kernel that pads its last key
  /// block masks those separately.
  ATTN_HD constexpr TileMask tile(int r0, int r1, int c0, int c1) const {
    return c0 > r1 - 1 + diag ? TileMask::skip : c1 - 1 <= r0 + diag ? TileMask::full : TileMask::partial;
  }
};

/// The same rule as free functions, for one-off use (CPU models, references).
ATTN_HD constexpr int causal_diag(int nq, int nk) { return CausalMask(nq, nk).diag; }
ATTN_HD constexpr bool causal_visible(int i, int j, int nq, int nk) { return CausalMask(nq, nk).visible(i, j); }
ATTN_HD constexpr int causal_key_end(int r1, int nq, int nk) { return CausalMask(nq, nk).key_end(r1); }
ATTN_HD constexpr int causal_first_query(int j, int nq, int nk) { return CausalMask(nq, nk).first_query(j); }
ATTN_HD constexpr TileMask causal_tile(int r0, int r1, int c0, int c1, int nq, int nk) {
  return CausalMask(nq, nk).tile(r0, r1, c0, c1);
}

}  // namespace attn
