#pragma once
/// \file mask_model.hpp
/// \brief The CPU model of the masked kernels: chapter 04's Algorithms 1 and 2 with
///        the key loop replaced by the block map's lists, over counted tensors.
///
/// Forward, per (batch, head, query block), in the order the map's scheduler gives:
///
///     (m, l, O) = sink ? ((sink_h, 1), 0) : ((-inf, 0), 0)       the state of each row
///     for each K/V block j in part[] then full[]:                 only tiles with work
///         S = tau Q_i K_j^T;  x = score(S)  (score mods);  x = -inf where !keep (partial only)
///         online-softmax update of (m, l, O) in base 2
///     O_i = O / l,  LSE_i = m + log l
///
/// Backward, per (batch, KV head, key block), query blocks from the map's columns:
/// P = exp(x - LSE), dV += P^T dO, dP = dO V^T, dS = P o (dP - D) o score'(S),
/// dQ += tau dS K (fp32, read-modify-write), dK += tau dS^T Q.

#include <cstddef>
#include <vector>

#include "block_map.hpp"
#include "common/inputs.hpp"
#include "common/problem.hpp"
#include "common/traffic.hpp"
#include "mask_spec.hpp"

namespace attn::ch06 {

/// Tiles of the CPU model: the sm_80 kernel's (Br = 128, Bc = 64).
constexpr int kModelBr = 128, kModelBc = 64;

/// The CPU model's tiles at head dim `d` (query rows Br, keys Bc).
struct ModelTiles {
  int Br, Bc;
};
/// (kModelBr, kModelBc) up to d = 128; above (Gemma 2's d = 256) 64 x 32, so that the
/// forward's and the backward's tiles still fit the chapter's on-chip budget.
inline ModelTiles model_tiles(int d) { return d > 128 ? ModelTiles{64, 32} : ModelTiles{kModelBr, kModelBc}; }

struct MaskForwardResult {
  std::vector<float> o, lse;  ///< in the layout's order (o) and [B][H][N] (lse)
  Traffic traffic;
  double tiles_visited = 0, tiles_masked = 0;  ///< K/V tiles loaded; of them, element-masked
};

struct MaskBackwardResult {
  std::vector<float> dq, dk, dv;  ///< in the layout's order
  std::vector<double> dsink;      ///< learned-sink: dLoss / d sink_h, [heads]; empty otherwise
  Traffic traffic;
  double tiles_visited = 0;
};

/// `in` holds Q, K, V (and dO) in `layout`'s order; `map` was built at the model's tiles.
MaskForwardResult mask_forward_model(const Problem& p, const MaskSpec& s, const TokenLayout& layout,
                                     const AttnInputs& in, const BlockMap& map, std::size_t sram_bytes);
/// `o` and `lse` from the forward (as the kernel reads them).
MaskBackwardResult mask_backward_model(const Problem& p, const MaskSpec& s, const TokenLayout& layout,
                                       const AttnInputs& in, const std::vector<float>& o,
                                       const std::vector<float>& lse, const BlockMap& map,
                                       std::size_t sram_bytes);

}  // namespace attn::ch06
