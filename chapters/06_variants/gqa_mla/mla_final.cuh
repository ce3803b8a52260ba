#pragma once
/// \file mla_final.cuh
/// \brief The chapter's final MLA decode (mla_final.cu, sm_90a: built into the Hopper library,
///        called where hopper_ready()); other GPUs take mla_decode.cu's kernels.

#include <cuda_bf16.h>

#include "gqa_mla/mla_decode.cuh"

namespace attn::ch06::mla {

/// How the final decode runs a shape: its configuration table's row for rows = H Nq
/// (mla_final.cu's header), and the key ranges it cuts each sequence into.
struct FinalPlan {
  int tile_rows = 0;         ///< packed rows a thread block
  int keys_per_block = 0;
  int splits = 1;            ///< key ranges a sequence (none empty)
  int blocks_per_split = 1;  ///< key blocks a range (the last range may have fewer)
  bool cluster = false;      ///< the ranges merged in a cluster of their blocks, else by the combine kernel
  int combine_parts = 0;     ///< the combine's column parts (0: from the grid, combine_parts())
  bool pdl = true;           ///< the combine as a programmatic dependent launch
  const char* kernel = "";   ///< "mma.sync" or "wgmma + TMA"
};
/// The plan for `batch` sequences of `rows` packed rows and `nk` keys on a GPU of `sms` SMs:
/// `splits` = 0 takes the table's split rule, otherwise at most that many ranges.
FinalPlan final_plan(int batch, int rows, int nk, int splits, int sms);
/// Decode and merge into o_c (bf16 [B][rows][512]). `p`: the tensors and the shape, with splits,
/// blocks_per_split, cluster_merge (and then o_c), combine_parts and pdl from final_plan().
/// Returns the decode's dynamic shared memory.
int launch_final(const DecodeParams& p, __nv_bfloat16* o_c);

}  // namespace attn::ch06::mla
