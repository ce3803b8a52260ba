#pragma once
/// \file fa3_tiles.hpp
/// \brief Tile arithmetic shared by the CPU model and the kernels (`__host__ __device__`):
///        which key blocks a query tile visits, which of them need a mask, the
///        persistent scheduler's tile order, and the fp8 key permutation.
///
/// A query tile is Br = 128 rows (two consumer warpgroups of 64); a key block is Bc
/// keys. With the bottom-right causal mask (row i sees key j iff j <= i + Nk - Nq):
///
///               key blocks j = 0 .. Tc-1
///              +----+----+----+----+----+
///     tile m   |full|full|diag|diag|    |    n_full = 2 blocks seen whole by every row
///              +----+----+----+----+----+    n_max  = 4 blocks seen by some row
///                                            block 4 is skipped, blocks 2..3 are masked
///
/// Without the causal mask every block is visited and only the last one, when
/// Nk % Bc != 0, needs a mask (its keys beyond Nk).

#include "common/index.hpp"           // ceil_div, kv_head_of
#include "common/online_softmax.hpp"  // ATTN_HD

namespace attn::ch05 {

/// Query rows per thread block: two consumer warpgroups of 64 rows each.
constexpr int kBr = 128;

ATTN_HD int min_of(int a, int b) { return a < b ? a : b; }

/// The key blocks a query tile visits: j in [0, n_max); those with j >= n_full hold
/// at least one (row, key) pair that is masked out, so they need the mask.
struct KvRange {
  int n_max = 0;
  int n_full = 0;
};

/// Key blocks of query tile `m_block` (rows m_block*Br ..), as every step's kernel and
/// the CPU model visit them. With `skip` false a causal tile would visit every block and
/// mask them all: the same answer, for the traffic test's comparison.
ATTN_HD KvRange kv_blocks(int m_block, int Br, int Bc, int nq, int nk, bool causal, bool skip = true) {
  const int tc = ceil_div(nk, Bc);
  if (!causal) return {tc, nk / Bc};
  if (!skip) return {tc, 0};
  // EXERCISE ch05.4: the blocks a causal tile must visit, and those it sees whole
  //| return {tc, 0};  // TODO: skip the blocks no row of the tile can see
  const int row_lo = m_block * Br;
  const int row_hi = min_of(nq, row_lo + Br) - 1;
  const int last_key = row_hi + nk - nq;  // the last key any row of the tile sees
  const int n_max = last_key < 0 ? 0 : min_of(tc, last_key / Bc + 1);
  const int keys_all_rows_see = row_lo + nk - nq + 1;  // keys [0, this) are visible to every row
  const int n_full = keys_all_rows_see <= 0 ? 0 : min_of(keys_all_rows_see, nk) / Bc;
  return {n_max, min_of(n_full, n_max)};
  // END EXERCISE
}

/// One past the last key row i may see (bottom-right causal), clipped to [0, nk].
ATTN_HD int key_limit(int row, int nq, int nk, bool causal) {
  if (!causal) return nk;
  const int lim = row + nk - nq + 1;
  return lim < 0 ? 0 : (lim > nk ? nk : lim);
}

// ----------------------------------------------------------------------------- persistent order
//
// Step 7 launches one thread block per SM and lets each walk a list of tiles. Tile t
// of the list is (m_block, bh):
//   causal:     longest first, so the work left at the end is short: the last query
//               tiles (which see the most keys) of every head, then the tiles before them
//   non-causal: head by head, so the blocks running at the same time share K and V in L2
// and block `cta` of G takes list entries in a snake: round r, position r*G + cta for
// even r and r*G + (G - 1 - cta) for odd r. The block that got the longest tile of one
// round gets the shortest of the next, which evens out the sums.

ATTN_HD int snake_tile(int cta, int round, int ctas) {
  return round * ctas + ((round & 1) ? ctas - 1 - cta : cta);
}

ATTN_HD void tile_coords(int t, int n_qtiles, int bh_count, bool causal, int* m_block, int* bh) {
  if (causal) {
    *bh = t % bh_count;
    *m_block = n_qtiles - 1 - t / bh_count;
  } else {
    *bh = t / n_qtiles;
    *m_block = t % n_qtiles;
  }
}

/// The causal list of step 24: the heads in sections whose K and V fit in `l2_bytes` of L2
/// together, each section's tiles longest first (as tile_coords orders them all), the
/// sections one after the other. tile_coords' causal list runs every head's last tile first,
/// so the blocks running at the same time read the K and V of every head at once (at d = 64,
/// N = 8K, B = 2, H = 32: 64 heads of 2 MB); a section's heads fit (16 of them in 32 MB).
/// The last section may hold fewer heads. Non-causal lists are tile_coords' (head by head).
ATTN_HD int l2_section_heads(int nk, int d, int elem_bytes, int l2_bytes) {
  const long per_head = long(nk) * d * elem_bytes * 2;  // K and V of one head
  const long n = per_head > 0 ? l2_bytes / per_head : 1;
  return n < 1 ? 1 : int(n);
}

ATTN_HD void tile_coords_sections(int t, int n_qtiles, int bh_count, bool causal, int section, int* m_block, int* bh) {
  if (!causal) return tile_coords(t, n_qtiles, bh_count, causal, m_block, bh);
  const int first = t / (section * n_qtiles) * section;  // the section's first head
  const int heads = min_of(section, bh_count - first);   // its heads
  const int u = t - first * n_qtiles;                     // the tile's place in its section
  *bh = first + u % heads;
  *m_block = n_qtiles - 1 - u / heads;
}

// ----------------------------------------------------------------------------- fp8 key order
//
// In an fp8 wgmma with A from registers, thread t of a quad holds the A columns
// {4t .. 4t+3} and {16+4t .. 16+4t+3} of each 32-wide k-slice, but the S accumulator
// that becomes P gives it columns {2t, 2t+1, 8+2t, 9+2t} and {16+2t, 17+2t, 24+2t, 25+2t}.
// Instead of shuffling P between threads, the MMA is told the truth by permuting V:
// k-position p of every 32-key slice of V^T holds key sigma(p). A sum over k does not
// care about the order of its terms, as long as P and V agree.

/// sigma(p): the key (within a 32-key slice) that k-position p of the fp8 P V product holds.
ATTN_HD int fp8_key_at(int p) {
  const int half = p / 16, t = (p % 16) / 4, i = p % 4;
  return 16 * half + 2 * t + (i & 1) + 8 * (i >> 1);
}

/// sigma^-1(k): the k-position of key k (within a 32-key slice).
ATTN_HD int fp8_position_of(int k) {
  const int half = k / 16, kk = k % 16;
  const int t = (kk % 8) / 2, i = (kk / 8) * 2 + (kk % 2);
  return 16 * half + 4 * t + i;
}

}  // namespace attn::ch05
