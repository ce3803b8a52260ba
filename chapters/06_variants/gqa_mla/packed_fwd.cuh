#pragma once
/// \file packed_fwd.cuh
/// \brief The packed GQA forward (packed_fwd.cu, sm_90a) as chapter 05's launcher
///        convention: StepArgs in, a PreparedStep out.

#include "chapters/05_fa3_hopper/step_launch.cuh"

namespace attn::ch06::packed {

/// Fa3Params of the packed view (heads = Hq / G, nq = G Nq), plus the one number packing
/// adds: the problem's own Nq, so that packed row m is query position m % pos_rows.
struct PackedParams : attn::ch05::Fa3Params {
  int pos_rows = 0;
  /// Split-K (flash-decoding): key blocks [s bps, (s + 1) bps) go to split s; with more
  /// than one split each writes its normalised O and LSE in fp32 to o_part / lse_part
  /// ([splits][B Hq Nq][dv], [splits][B Hq Nq]) and a combine kernel merges them with ⊕.
  int splits = 1, blocks_per_split = 1 << 30;
  float* o_part = nullptr;
  float* lse_part = nullptr;
};

/// Prepares the kernel for `a` (the problem as it is, not packed): pack = true puts the
/// G query heads of each KV head on one tile's rows; false runs one query head per tile.
/// bf16; (d, dv) = (128, 128) or (192, 128); UsageError otherwise.
/// `splits`: key splits (0: enough to give every SM a tile when there are fewer tiles
/// than SMs, each split at least 2 key blocks; 1: none).
attn::ch05::PreparedStep prepare(const attn::ch05::StepArgs& a, bool pack, int splits = 0);

}  // namespace attn::ch06::packed
