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
};

/// Prepares the kernel for `a` (the problem as it is, not packed): pack = true puts the
/// G query heads of each KV head on one tile's rows; false runs one query head per tile.
/// bf16; (d, dv) = (128, 128) or (192, 128); UsageError otherwise.
attn::ch05::PreparedStep prepare(const attn::ch05::StepArgs& a, bool pack);

}  // namespace attn::ch06::packed
