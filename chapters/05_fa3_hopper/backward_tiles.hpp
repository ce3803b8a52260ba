#pragma once
/// \file backward_tiles.hpp
/// \brief The backward's tiles and walk, shared by the CPU model and the kernels
///        (`__host__ __device__`): which query blocks a key block visits, and where
///        dQ's fp32 accumulator keeps each tile.
///
/// A thread block owns one key block of Bc = 128 keys of one KV head and walks the
/// query blocks (Br = 64 rows) of every query head of its group that see any of its
/// keys. With the bottom-right causal mask (row i sees key j iff j <= i + Nk - Nq):
///
///                 query blocks i = 0 .. Tr-1 ->
///     key block   +----+----+----+----+----+----+
///     j = 0       |diag|full|full|full|full|full|    i_first(0) = 0
///     j = 1       |skip|skip|diag|full|full|full|    i_first(1) = 2: rows 0..127 see none of
///     j = 2       |skip|skip|skip|skip|diag|full|    keys 128..255 (Bc = 2 Br)
///                 +----+----+----+----+----+----+
///
/// So the query blocks that visit key block j are i_first(j) .. Tr-1, and the key
/// blocks that add into dQ_i are j = 0 .. j_last(i): a contiguous run from 0, which
/// is what lets the deterministic mode order the adds by j alone.

#include "common/index.hpp"           // ceil_div, causal_diag
#include "common/online_softmax.hpp"  // ATTN_HD

namespace attn::ch05 {

/// Query rows per step of the backward's walk and keys per thread block.
constexpr int kBwdBr = 64;
constexpr int kBwdBc = 128;

/// The first query block (of Br rows) that sees any key of the key block starting at
/// `col0`; n_qblocks = ceil(nq / Br) when no row does. Without the mask: 0.
ATTN_HD int first_query_block(int col0, int Br, int nq, int nk, bool causal) {
  if (!causal) return 0;
  // EXERCISE ch05.5: the first query block that sees key block col0 (the backward's causal skipping)
  //| return 0;  // TODO: skip the query blocks no row of which sees key col0
  const int first_row = col0 - causal_diag(nq, nk);  // the first query row that sees key col0
  if (first_row >= nq) return ceil_div(nq, Br);
  return first_row <= 0 ? 0 : first_row / Br;
  // END EXERCISE
}

/// Whether the (query block at row0, key block at col0) tile needs the mask: the
/// causal diagonal crosses it, or the key block runs past nk.
ATTN_HD bool bwd_tile_masked(int row0, int col0, int Br, int Bc, int nq, int nk, bool causal) {
  (void)Br;
  return col0 + Bc > nk || (causal && col0 + Bc - 1 > row0 + causal_diag(nq, nk));
}

/// dQ's fp32 accumulator, [B Hq][Tr][2][Br][d/2]: each query block's tile is split in
/// two column halves (one per consumer warpgroup), each contiguous, so that one bulk
/// reduce-add of Br x d/2 floats adds a whole half. The postprocess kernel reads it
/// back into [B][Hq][Nq][d]. Rows past nq exist (zero) up to Tr Br.
ATTN_HD long long dq_accum_index(long long bh, int row, int col, int n_qblocks, int Br, int d) {
  const int half = col / (d / 2);
  return (((bh * n_qblocks + row / Br) * 2 + half) * Br + row % Br) * (d / 2) + col % (d / 2);
}

/// The same accumulator with each tile half in the order of the wgmma accumulator
/// registers (step b3): float2 y (accumulators 2y, 2y + 1) of thread w of the warpgroup
/// at (y x 128 + w) x 2. Thread w = 32 warp + 4 g + t holds rows 16 warp + g + 8h and
/// columns 8c + 2t + e of its half as accumulator 4c + 2h + e.
ATTN_HD long long dq_accum_fragment_index(long long bh, int row, int col, int n_qblocks, int Br, int d) {
  const int half = col / (d / 2), r = row % Br, cl = col % (d / 2);
  const int w = (r / 16) * 32 + (r % 8) * 4 + (cl % 8) / 2;  // the thread
  const int y = 2 * (cl / 8) + (r % 16) / 8;                 // its float2
  return ((bh * n_qblocks + row / Br) * 2 + half) * (long long)(Br * (d / 2)) + (y * 128 + w) * 2 + cl % 2;
}

/// Whole tiles in the registers' order (step b7, where each consumer adds a whole 64 x d
/// partial tile): [B Hq][Tr] tiles of Br x d, float2 y (accumulators 2y, 2y + 1, y < d/4) of
/// thread w of a consumer at (y x 128 + w) x 2; thread w = 32 warp + 4 g + t holds rows
/// 16 warp + g + 8h and columns 8c + 2t + e as accumulator 4c + 2h + e.
ATTN_HD long long dq_accum_tile_index(long long bh, int row, int col, int n_qblocks, int Br, int d) {
  const int r = row % Br;
  const int w = (r / 16) * 32 + (r % 8) * 4 + (col % 8) / 2;  // the thread
  const int y = 2 * (col / 8) + (r % 16) / 8;                 // its float2
  return (bh * n_qblocks + row / Br) * (long long)(Br * d) + (y * 128 + w) * 2 + col % 2;
}

/// Step b13's halves in the order of the *transposed* product's registers (dQ^T = K_j^T dS^T:
/// M = the half's d/2 = 64 columns, N = the Br = 80 queries): float2 y (accumulators 2y, 2y + 1,
/// y < Br/4) of thread w of the warpgroup at (y x 128 + w) x 2; thread w = 32 warp + 4 g + t
/// holds columns 16 warp + g + 8h of the half and queries 8c + 2t + e as accumulator 4c + 2h + e.
ATTN_HD long long dq_accum_transposed_index(long long bh, int row, int col, int n_qblocks, int Br, int d) {
  const int half = col / (d / 2), r = row % Br, cl = col % (d / 2);
  const int w = (cl / 16) * 32 + (cl % 8) * 4 + (r % 8) / 2;  // the thread
  const int y = 2 * (r / 8) + (cl % 16) / 8;                 // its float2
  return ((bh * n_qblocks + row / Br) * 2 + half) * (long long)(Br * (d / 2)) + (y * 128 + w) * 2 + r % 2;
}

/// The accumulator's four layouts. In all four, query block i of head bh keeps its Br x d
/// floats together, from (bh Tr + i) Br d on; only the order inside that run differs.
enum class DqLayout { rows, fragments, whole_tiles, transposed };

/// Where element (r, c) of a query block's tile lives inside the tile's run (r < Br).
ATTN_HD int dq_tile_offset(DqLayout l, int r, int c, int Br, int d) {
  return int(l == DqLayout::whole_tiles  ? dq_accum_tile_index(0, r, c, 1, Br, d)
             : l == DqLayout::fragments  ? dq_accum_fragment_index(0, r, c, 1, Br, d)
             : l == DqLayout::transposed ? dq_accum_transposed_index(0, r, c, 1, Br, d)
                                         : dq_accum_index(0, r, c, 1, Br, d));
}

/// The inverse, for the postprocess, which reads a tile's run in order: the row and column of
/// the float at `offset`. For an offset that is a multiple of 4, the four floats from there are
/// columns col .. col + 3 of that one row, except in the transposed layout, where they are rows
/// row .. row + 3 of that one column (dq_float4_is_column()).
ATTN_HD void dq_tile_position(DqLayout l, int offset, int Br, int d, int* row, int* col) {
  const int half_elems = Br * (d / 2);
  const int half = l == DqLayout::whole_tiles ? 0 : offset / half_elems;
  const int rem = l == DqLayout::whole_tiles ? offset : offset % half_elems;
  if (l == DqLayout::rows) {
    *row = rem / (d / 2);
    *col = half * (d / 2) + rem % (d / 2);
    return;
  }
  if (l == DqLayout::transposed) {  // float2 y of thread w: column 16 warp + g + 8 (y % 2), row 8 (y / 2) + 2 t + e
    const int pair = rem / 2, e = rem % 2, y = pair / 128, w = pair % 128;
    *row = 8 * (y / 2) + 2 * (w % 4) + e;
    *col = half * (d / 2) + 16 * (w / 32) + (w % 32) / 4 + 8 * (y % 2);
    return;
  }
  // Float2 y of thread w = 32 warp + 4 g + t: row 16 warp + g + 8 (y % 2), column 8 (y / 2) + 2 t + e.
  const int pair = rem / 2, e = rem % 2, y = pair / 128, w = pair % 128;
  *row = 16 * (w / 32) + (w % 32) / 4 + 8 * (y % 2);
  *col = half * (d / 2) + 8 * (y / 2) + 2 * (w % 4) + e;
}

/// Whether the four floats of a float4 at a multiple of 4 run down a column (rows row .. row + 3)
/// rather than along a row.
ATTN_HD bool dq_float4_is_column(DqLayout l) { return l == DqLayout::transposed; }

}  // namespace attn::ch05
