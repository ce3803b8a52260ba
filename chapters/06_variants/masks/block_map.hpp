#pragma once
/// \file block_map.hpp
/// \brief The block map: which K/V tiles each query tile visits, and which of them
///        need the element mask. Built on the host from a policy's classify().
///
/// As FlexAttention's BlockMask keeps it, per (batch, head, query block) two lists
/// of K/V blocks, in ascending order:
///
///     n_part[q], part[q][0..n_part)   partial tiles: keep() is applied per element
///     n_full[q], full[q][0..n_full)   full tiles: no mask arithmetic
///
/// and, for the backward (which walks K/V blocks outside and query blocks inside),
/// the same lists per (batch, head, key block). A mask that is the same for every
/// batch (or head) stores one map for all of them (`map_batch` / `map_heads` = 1).
///
/// The kernel's loop over key tiles becomes a loop over the two lists, partial first:
///
///     for (n = 0; n < n_part + n_full; ++n) {
///       const int j = n < n_part ? part[n] : full[n - n_part];   // a tile that has work
///       S = Q_i K_j^T;  if (n < n_part) S = keep ? S : -inf;     // ... and only there a mask
///       ...
///
/// `order` lists every (batch, head, query block) heaviest first (most kept tiles):
/// the order the kernels launch or schedule their tiles in, so that the long ones
/// start first and the short ones fill the tail.
///
/// The last key block of a ragged Nk is always partial (its missing keys are masked).

#include <algorithm>
#include <cstdint>
#include <numeric>
#include <string>
#include <vector>

#include "common/faults.hpp"
#include "mask_policy.hpp"

namespace attn::ch06 {

struct BlockMap {
  int Br = 0, Bc = 0;         ///< tile sizes (the kernel's)
  int nq = 0, nk = 0;
  int tq = 0, tk = 0;         ///< query and key blocks
  int batch = 0, heads = 0;   ///< of the problem
  int map_batch = 1, map_heads = 1;  ///< of the map (1: shared by every batch / head)

  // Forward lists: [maps][tq] counts, [maps][tq][tk] indices (first n used).
  std::vector<int> n_full, full, n_part, part;
  // Backward lists: [maps][tk] counts, [maps][tk][tq] indices.
  std::vector<int> q_n_full, q_full, q_n_part, q_part;
  /// Every tile's kind, [maps][tq][tk] (for printing and tests).
  std::vector<TileKind> kinds;
  /// (b * heads + h) * tq + q_block, most kept tiles first.
  std::vector<int> order;
  /// Exact number of kept (i, j) pairs summed over every batch and head.
  double kept_pairs = 0;
  /// A document map (build_document_block_map) only: query tile q covers rows
  /// [q_row0[q], q_row1[q]), and the forward lists hold each key tile's first key (not its
  /// block index). Empty for a grid map. (Its backward lists are empty too.)
  std::vector<int> q_row0, q_row1;

  int maps() const { return map_batch * map_heads; }
  /// Which map (batch, head) uses.
  int map_of(int b, int h) const { return (map_batch > 1 ? b : 0) * map_heads + (map_heads > 1 ? h : 0); }
  TileKind kind(int b, int h, int qb, int kb) const {
    return kinds[(std::size_t(map_of(b, h)) * tq + qb) * tk + kb];
  }
  /// Tiles of each kind over every (batch, head).
  double count(TileKind k) const;
  double total_tiles() const { return double(batch) * heads * tq * tk; }
  double kept_tiles() const { return count(TileKind::full) + count(TileKind::partial); }
  /// Entries of `order` with at least one kept tile (they come first: heaviest first).
  int tiles_with_work() const;

  /// keep / skip / partial per tile of (b, h) as text: '#' full, '+' partial, '.' skip.
  std::string text(int b = 0, int h = 0, int max_cols = 128) const;
  /// The same as an SVG picture (one square per tile, with a legend).
  std::string svg(int b, int h, const std::string& title) const;
};

/// The tile (qb, kb) clipped to the problem.
inline TileRange tile_range(int qb, int kb, int Br, int Bc, int nq, int nk) {
  return {qb * Br, std::min(nq, (qb + 1) * Br), kb * Bc, std::min(nk, (kb + 1) * Bc)};
}

/// Fills the lists, `order` and the totals from `kinds`; counts kept pairs with
/// `count_partial(map, qb, kb)` for partial tiles (full tiles count their area).
template <class CountPartial>
void finish_block_map(BlockMap& m, const std::vector<int>& map_b, const std::vector<int>& map_h,
                      CountPartial&& count_partial) {
  const int M = m.maps();
  m.n_full.assign(std::size_t(M) * m.tq, 0);
  m.n_part.assign(std::size_t(M) * m.tq, 0);
  m.full.assign(std::size_t(M) * m.tq * m.tk, 0);
  m.part.assign(std::size_t(M) * m.tq * m.tk, 0);
  m.q_n_full.assign(std::size_t(M) * m.tk, 0);
  m.q_n_part.assign(std::size_t(M) * m.tk, 0);
  m.q_full.assign(std::size_t(M) * m.tk * m.tq, 0);
  m.q_part.assign(std::size_t(M) * m.tk * m.tq, 0);
  std::vector<double> pairs(M, 0.0);
  for (int mi = 0; mi < M; ++mi)
    for (int qb = 0; qb < m.tq; ++qb)
      for (int kb = 0; kb < m.tk; ++kb) {
        const TileKind k = m.kinds[(std::size_t(mi) * m.tq + qb) * m.tk + kb];
        if (k == TileKind::skip) continue;
        const std::size_t fq = std::size_t(mi) * m.tq + qb, fk = std::size_t(mi) * m.tk + kb;
        if (k == TileKind::full) {
          m.full[fq * m.tk + m.n_full[fq]++] = kb;
          m.q_full[fk * m.tq + m.q_n_full[fk]++] = qb;
          const TileRange t = tile_range(qb, kb, m.Br, m.Bc, m.nq, m.nk);
          pairs[mi] += double(t.i1 - t.i0) * (t.j1 - t.j0);
        } else {
          m.part[fq * m.tk + m.n_part[fq]++] = kb;
          m.q_part[fk * m.tq + m.q_n_part[fk]++] = qb;
          pairs[mi] += double(count_partial(map_b[mi], map_h[mi], qb, kb));
        }
      }
  m.kept_pairs = 0;
  for (int b = 0; b < m.batch; ++b)
    for (int h = 0; h < m.heads; ++h) m.kept_pairs += pairs[m.map_of(b, h)];
  m.order.resize(std::size_t(m.batch) * m.heads * m.tq);
  std::iota(m.order.begin(), m.order.end(), 0);
  auto work = [&](int t) {
    const int bh = t / m.tq, qb = t % m.tq;
    const std::size_t f = std::size_t(m.map_of(bh / m.heads, bh % m.heads)) * m.tq + qb;
    return m.n_full[f] + m.n_part[f];
  };
  std::stable_sort(m.order.begin(), m.order.end(), [&](int a, int c) { return work(a) > work(c); });
}

/// The sm90a backward's walk (hopper_backward.cu; MaskWalks in mask_kernels.cuh) from a map's
/// backward lists: for each (map, key block), its partial and full query blocks merged in
/// ascending order, each as block << 1 | 1 where partial; and the key block's rank among the
/// key blocks that visit each of them (how many lower ones do), the deterministic mode's order.
/// A map that differs between heads has no such walk (no policy has one).
struct BackwardWalks {
  std::vector<int> list, rank;  ///< [maps][tk][tq] (the first count entries used)
  std::vector<int> count;       ///< [maps][tk]
  int tq = 0, tk = 0, maps = 0;
};
BackwardWalks backward_walks(const BlockMap& m);

/// --inject-fault on the forward lists (common/faults.hpp), as a faulty map builder would
/// leave them. partial-tile-full: each list's last partial tile that lies inside Nk moves
/// to the full list, so its element mask is skipped; last-key-block: each list loses its
/// last key tile (the loop one tile short). Other faults change nothing. Returns how many
/// lists changed.
int inject_map_fault(BlockMap& map, Fault f);

/// Asks the policy's classify() once per tile. A full tile of a ragged last key
/// block becomes partial (its missing keys must be masked).
template <class P>
BlockMap build_block_map(const P& pol, int batch, int heads, int nq, int nk, int Br, int Bc) {
  BlockMap m;
  m.Br = Br, m.Bc = Bc, m.nq = nq, m.nk = nk, m.batch = batch, m.heads = heads;
  m.tq = (nq + Br - 1) / Br;
  m.tk = (nk + Bc - 1) / Bc;
  m.map_batch = P::kPerBatch ? batch : 1;
  m.map_heads = P::kPerHead ? heads : 1;
  std::vector<int> map_b, map_h;
  for (int b = 0; b < m.map_batch; ++b)
    for (int h = 0; h < m.map_heads; ++h) map_b.push_back(b), map_h.push_back(h);
  m.kinds.assign(std::size_t(m.maps()) * m.tq * m.tk, TileKind::skip);
  for (int mi = 0; mi < m.maps(); ++mi)
    for (int qb = 0; qb < m.tq; ++qb)
      for (int kb = 0; kb < m.tk; ++kb) {
        const TileRange t = tile_range(qb, kb, Br, Bc, nq, nk);
        TileKind k = pol.classify(map_b[mi], map_h[mi], t);
        if (k == TileKind::full && (kb + 1) * Bc > nk) k = TileKind::partial;  // ragged keys
        m.kinds[(std::size_t(mi) * m.tq + qb) * m.tk + kb] = k;
      }
  finish_block_map(m, map_b, map_h, [&](int b, int h, int qb, int kb) {
    const TileRange t = tile_range(qb, kb, Br, Bc, nq, nk);
    long c = 0;
    for (int i = t.i0; i < t.i1; ++i)
      for (int j = t.j0; j < t.j1; ++j) c += pol.keep(b, h, i, j);
    return c;
  });
  return m;
}

/// The document map, FlashAttention's varlen tiling, for one packed batch of documents
/// with boundaries `cu` (cu_seqlens: 0, l0, l0 + l1, ..., N): each document's queries in
/// tiles of Br rows from its own start, each tile's keys in tiles of Bc from the
/// document's start, each tile asked of pol.classify() with its true ranges. A key tile
/// that runs past its document (or past N) is partial: the keys after the document's end
/// belong to the next one and are masked. No tile straddles two documents, so only the
/// diagonal tiles (causal) and the ragged last key tiles are partial.
///
///     packed tokens:   | doc 0 (300)        | doc 1 (200)  |
///     grid map:        [ 0-127 ][128-255][256-383][384-511]   tile 256-383 holds both
///     document map:    [0-127][128-255][256-299] [300-427][428-499]
template <class P>
BlockMap build_document_block_map(const P& pol, const std::vector<int>& cu, int heads, int Br, int Bc) {
  static_assert(!P::kPerHead, "one map for every head");
  BlockMap m;
  const int n = cu.back();
  m.Br = Br, m.Bc = Bc, m.nq = m.nk = n, m.batch = 1, m.heads = heads;
  struct QTile { int r0, r1, s, e; };
  std::vector<QTile> tiles;
  m.tk = 0;
  for (std::size_t d = 0; d + 1 < cu.size(); ++d) {
    const int s = cu[d], e = cu[d + 1];
    for (int r0 = s; r0 < e; r0 += Br) tiles.push_back({r0, std::min(e, r0 + Br), s, e});
    m.tk = std::max(m.tk, (e - s + Bc - 1) / Bc);
  }
  m.tq = int(tiles.size());
  m.n_full.assign(m.tq, 0), m.n_part.assign(m.tq, 0);
  m.full.assign(std::size_t(m.tq) * m.tk, 0), m.part.assign(std::size_t(m.tq) * m.tk, 0);
  m.kinds.assign(std::size_t(m.tq) * m.tk, TileKind::skip);
  double pairs = 0;
  for (int q = 0; q < m.tq; ++q) {
    const QTile& t = tiles[q];
    m.q_row0.push_back(t.r0), m.q_row1.push_back(t.r1);
    for (int k0 = t.s, kb = 0; k0 < t.e; k0 += Bc, ++kb) {
      const TileRange r{t.r0, t.r1, k0, std::min(n, k0 + Bc)};
      TileKind k = pol.classify(0, 0, r);
      if (k == TileKind::full && k0 + Bc > t.e) k = TileKind::partial;  // keys past the document
      m.kinds[std::size_t(q) * m.tk + kb] = k;
      if (k == TileKind::full) {
        m.full[std::size_t(q) * m.tk + m.n_full[q]++] = k0;
        pairs += double(t.r1 - t.r0) * Bc;
      } else if (k == TileKind::partial) {
        m.part[std::size_t(q) * m.tk + m.n_part[q]++] = k0;
        for (int i = r.i0; i < r.i1; ++i)
          for (int j = r.j0; j < r.j1; ++j) pairs += pol.keep(0, 0, i, j);
      }
    }
  }
  m.kept_pairs = pairs * heads;
  m.order.resize(std::size_t(heads) * m.tq);
  std::iota(m.order.begin(), m.order.end(), 0);
  auto work = [&](int t) { return m.n_full[t % m.tq] + m.n_part[t % m.tq]; };
  std::stable_sort(m.order.begin(), m.order.end(), [&](int a, int c) { return work(a) > work(c); });
  return m;
}

}  // namespace attn::ch06
