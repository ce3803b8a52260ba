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

#if defined(__CUDACC__)
#define ATTN_HD __host__ __device__ __forceinline__
#else
#define ATTN_HD inline
#endif

namespace attn {

/// ceil(a / b) for a >= 0, b > 0: how many blocks of b cover a.
ATTN_HD constexpr int ceil_div(int a, int b) { return (a + b - 1) / b; }

/// GQA/MQA: the KV head query head h reads. The heads / kv_heads query heads of a
/// group are consecutive: h = 0..g-1 read KV head 0, and so on (heads % kv_heads == 0).
ATTN_HD constexpr int kv_head_of(int h, int heads, int kv_heads) { return h / (heads / kv_heads); }

/// The offset of the causal diagonal: query i sees keys j <= i + causal_diag(nq, nk).
ATTN_HD constexpr int causal_diag(int nq, int nk) { return nk - nq; }

/// The causal rule itself: key j is visible from query i (bottom-right aligned).
ATTN_HD constexpr bool causal_visible(int i, int j, int nq, int nk) { return j <= i + causal_diag(nq, nk); }

/// One past the last key any query of rows [r0, r1) sees, clamped to [0, nk]:
/// a causal kernel walks keys [0, causal_key_end) for that row block. 0 when every
/// row of the block is empty. Without a mask the answer is nk.
ATTN_HD constexpr int causal_key_end(int r1, int nq, int nk) {
  const int e = r1 + causal_diag(nq, nk);  // last row r1 - 1 sees keys <= r1 - 1 + diag
  return e < 0 ? 0 : (e < nk ? e : nk);
}

/// The first query that sees key j, clamped to [0, nq]: a key block [c0, c1) is
/// needed by rows [causal_first_query(c0), nq). (A K/V-parallel backward starts there.)
ATTN_HD constexpr int causal_first_query(int j, int nq, int nk) {
  const int i = j - causal_diag(nq, nk);
  return i < 0 ? 0 : (i < nq ? i : nq);
}

/// How a (query block, key block) tile meets the causal mask (see the file comment).
enum class TileMask { skip, full, partial };

/// Rows [r0, r1) against keys [c0, c1), r0 < r1 and c0 < c1, causal bottom-right.
/// Ragged ends (keys at or past nk) are not the causal rule's business: a kernel
/// that pads its last key block masks those separately.
ATTN_HD constexpr TileMask causal_tile(int r0, int r1, int c0, int c1, int nq, int nk) {
  return c0 > r1 - 1 + causal_diag(nq, nk)   ? TileMask::skip
         : c1 - 1 <= r0 + causal_diag(nq, nk) ? TileMask::full
                                              : TileMask::partial;
}

}  // namespace attn
