#pragma once
/// \file backward_model.hpp
/// \brief The backward's CPU model: FA2's Algorithm 2 with the loop structure, tiles and
///        dQ accumulator of steps b1 and b2, over counted tensors.
///
/// One "thread block" per key block j (Bc = 128 keys) of each KV head: K_j, V_j read
/// once, dK_j, dV_j kept on chip; an inner walk over the query blocks (Br = 64 rows) of
/// every query head of the group that see key block j (first_query_block(),
/// backward_tiles.hpp); per step Q_i, dO_i and the padded LSE_i, D_i read, and dQ_i's
/// Br x d fp32 tile added into the accumulator (the reduce-add: a read and a write of
/// the tile, done in L2 by the copy engine on the GPU). The preprocess (D, LSE in base
/// 2, the accumulator zeroed) and the postprocess (dQ = tau x accumulator) are counted
/// too. Without a GPU it is the chapter's backward.

#include <cstddef>
#include <vector>

#include "common/inputs.hpp"
#include "common/problem.hpp"
#include "common/traffic.hpp"

namespace attn::ch05 {

struct Fa3BackwardModelResult {
  std::vector<float> dq, dk, dv;
  Traffic traffic;            ///< every kernel of the backward; the forward that made O and LSE is not counted
  double dq_add_bytes = 0;    ///< the accumulator's reads and writes by the reduce-adds
  long dq_tile_adds = 0;      ///< Br x d tiles added (two bulk reduce-adds each on the GPU)
  std::size_t sram_peak = 0;  ///< on-chip tiles of one thread block
};

/// Runs the backward. O and LSE come from the chapter's forward model (uncounted).
/// Needs in.dout. Throws SramOverflow when one block's tiles exceed `sram_bytes`.
Fa3BackwardModelResult fa3_backward_model(const Problem& p, const AttnInputs& in, std::size_t sram_bytes);

/// The same bytes from the tile sizes alone (no arithmetic).
struct Fa3BackwardTraffic {
  double pre_read = 0, pre_write = 0;    ///< preprocess: O, dO, LSE in; LSE2, D, zeroed accumulator out
  double main_read = 0, main_write = 0;  ///< main kernel: K, V, Q, dO, LSE2, D in; dK, dV out (no dQ adds)
  double dq_add = 0;                     ///< main kernel: the accumulator read and written by the adds
  double post_read = 0, post_write = 0;  ///< postprocess: the accumulator in, dQ out
  double read() const { return pre_read + main_read + dq_add / 2 + post_read; }
  double write() const { return pre_write + main_write + dq_add / 2 + post_write; }
};
Fa3BackwardTraffic fa3_backward_traffic(const Problem& p);

}  // namespace attn::ch05
