#pragma once
/// \file backward_args.cuh
/// \brief A backward's parameters for one problem (backward_launch.cuh's Fa3BwdParams): the
///        problem's sizes and scales, and the query blocks and dQ accumulator layout of the
///        step whose layout a run takes. Host code only.
///
/// Chapter 05's host side (backward_gpu.cu) and the C library (python/csrc/lineage_c.cu) both
/// fill their parameters with these, so the two cannot disagree on the final backward's layout.

#include "backward_gpu.hpp"     // BwdStep
#include "backward_launch.cuh"  // Fa3BwdParams
#include "backward_tiles.hpp"   // kBwdBr
#include "common/index.hpp"
#include "common/online_softmax.hpp"
#include "common/problem.hpp"

namespace attn::ch05 {

/// The step whose dQ layout and query blocks a run takes: its own, except the final
/// backward's (and b16's, b17's, which keep its table): b12's at d = 64 and b13's at d = 128.
inline BwdStep layout_step(BwdStep s, int d) {
  if (s != BwdStep::final_bwd && s != BwdStep::b16_shared_state_space && s != BwdStep::b17_fa4_order) return s;
  return d == 64 ? BwdStep::b12_pairs_of_query_blocks : BwdStep::b13_eighty_queries;
}
/// Rows of the walk's query blocks and of the accumulator's tiles: 64, b13's 80.
inline int block_rows(BwdStep s) {  // b13-b15: 80
  return s >= BwdStep::b13_eighty_queries && s <= BwdStep::b15_scores_ahead ? 80 : kBwdBr;
}
/// Query blocks a step walks: b12 takes blocks of 64 in pairs, so it gets an even count (the
/// extra block is padding: the preprocess gives it LSE +inf and D 0).
inline int query_blocks(BwdStep s, int nq) {
  const int tr = ceil_div(nq, block_rows(s));
  return s == BwdStep::b12_pairs_of_query_blocks ? tr + tr % 2 : tr;
}

/// The problem's sizes and scales; the pointers, the layout and the mode are the caller's.
inline void set_bwd_problem(Fa3BwdParams& b, const Problem& p) {
  b.batch = p.batch;
  b.heads = p.heads;
  b.kv_heads = p.kv_heads;
  b.nq = p.nq;
  b.nk = p.nk;
  b.d = p.d;
  b.scale = float(p.softmax_scale());
  b.scale_log2 = float(p.softmax_scale() * kLog2e);
  b.causal = p.causal;
}

/// The query blocks and the dQ accumulator's layout of step `layout` (layout_step()'s answer)
/// for `nq` queries.
inline void set_bwd_layout(Fa3BwdParams& b, BwdStep layout, int nq) {
  b.dq_fragment_order = layout >= BwdStep::b3_dq_fragment_order;
  b.dq_whole_tiles = layout == BwdStep::b7_dq_split_by_keys ||       // b8 derives from b6: halves
                     layout == BwdStep::b12_pairs_of_query_blocks;  // a consumer's whole block
  b.dq_transposed = layout >= BwdStep::b13_eighty_queries;          // b13-b15
  b.block_rows = block_rows(layout);
  b.n_qblocks = query_blocks(layout, nq);
}

}  // namespace attn::ch05
