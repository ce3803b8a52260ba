#pragma once
/// \file decode_model.hpp
/// \brief The CPU model of the decode kernels: the same blocks, tiles, warps and
///        merges as steps/v1_paged_decode.cu and steps/v2_split_k.cu, with every
///        global access counted.
///
///     for each block (sequence b, KV head hk, head chunk c[, split s]):
///       load Q rows of the group's heads
///       for each tile of 64 keys in the block's range:
///         read the block-table entries, load 64 K rows and 64 V rows through them
///         warp w: S = tau Q K_w^T (16 keys), online softmax (base 2), O_w += P V_w
///       merge the 4 warps' (m, l, O) with the shared merge (common/online_softmax.hpp)
///       v1: write O / l and the LSE        v2: write the split's (m, l, O)
///     v2 only, a second kernel: merge the splits of every (b, h), write O and the LSE
///
/// The on-chip budget (`--sram-bytes`) holds the kernel's shared memory: its
/// three K/V stages, 96 KB at d = 128. The accumulators live in registers.

#include <vector>

#include "common/traffic.hpp"
#include "decode.hpp"

namespace attn::ch07 {

struct DecodeModelResult {
  std::vector<float> o, lse;  ///< [batch][heads][d] (bf16 values) and [batch][heads]
  Traffic traffic;            ///< counted by the model
  std::size_t sram_peak = 0;
};

/// One decode step over the paged pools: `splits == 1` is v1, more is v2.
DecodeModelResult decode_model(const DecodeBatch& b, const std::vector<float>& q, const KvPools& kv, int splits,
                               std::size_t sram_bytes);

}  // namespace attn::ch07
