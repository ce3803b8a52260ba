#pragma once
/// \file fa2_model.hpp
/// \brief Chapter 04's CPU model: FlashAttention-2 Algorithm 1 (forward) and
///        Algorithm 2 (backward), with the final kernel's tile sizes and counted
///        HBM traffic.
///
/// Forward, per (batch, head) and query block Q_i:
///
///     load Q_i once; (m_i, l_i, O_i) = (-inf, 0, 0) on chip
///     for each K/V block j the block's rows can see:
///         load K_j, V_j;  S = Q_i K_j^T;  m_new = max(m_i, rowmax S)
///         P = exp(S - m_new);  l_i = e^(m_i - m_new) l_i + rowsum P
///         O_i = e^(m_i - m_new) O_i + P V_j;  m_i = m_new
///     store O_i / l_i and LSE_i = m_i + log l_i, once
///
/// Against chapter 03's FA1 model the loops are swapped: Q_i is read once instead
/// of once per K/V block, and (m, l, O) never round-trip through HBM.

#include <cstddef>
#include <vector>

#include "common/inputs.hpp"
#include "common/problem.hpp"
#include "common/traffic.hpp"

namespace attn::ch04 {

/// The final kernel's tiles (steps/final.cu at d = 128): Br query rows per thread block,
/// Bc keys per K/V tile.
struct Fa2Tiles {
  int Br = 128, Bc = 64;
};

/// The tiles forward step `step` runs at head dim d (1..9, and 10: the final kernel,
/// fa2_gpu.hpp's kFinal): v1 has chapter 03's blocks, v2-v5 64 x 64, v6-v8 two 16-row
/// tiles per warp (Br = 128), v9 and the final kernel their own per head dim (Bc = 128
/// at d = 64).
constexpr Fa2Tiles step_tiles(int step, int d) {
  if (step == 1) return d == 64 ? Fa2Tiles{64, 128} : Fa2Tiles{64, 64};
  if (step <= 5) return {64, 64};
  if ((step == 9 || step == 10) && d == 64) return {128, 128};
  return {128, 64};
}

/// One SM of an H100/H200: 228 KB of shared memory and a 256 KB register file. The
/// CPU model's default on-chip budget; it holds the final kernel's tiles at every
/// head dim the chapter accepts.
constexpr std::size_t kSmOnChipBytes = (228 + 256) * 1024;

/// On-chip budget the model's default tiles need at head dim d (shared-memory
/// tiles Q_i, K_j, V_j in the input type; S/P, O_i, m_i, l_i in fp32 registers).
std::size_t fa2_onchip_bytes(const Problem& p, Fa2Tiles t = {});

struct Fa2ForwardResult {
  std::vector<float> o, lse;
  Traffic traffic;  ///< everything the model moved
  double q_read = 0, kv_read = 0, o_written = 0, lse_written = 0;  ///< its parts
  std::size_t sram_peak = 0;
};

/// Algorithm 1 with causal block skipping as the kernel does it.
Fa2ForwardResult fa2_forward_model(const Problem& p, const AttnInputs& in, std::size_t sram_bytes,
                                   Fa2Tiles t = {});

/// Bytes of the forward from the tile sizes alone, with causal block skipping as
/// every step does it; equals the model's count.
double fa2_forward_bytes(const Problem& p, Fa2Tiles t = {});

struct Fa2BackwardResult {
  std::vector<float> dq, dk, dv;
  Traffic traffic;
  double dq_accum_bytes = 0;  ///< the fp32 read-modify-writes of dQ (the atomics)
};

/// Algorithm 2: K/V blocks outer (one thread block each), query blocks inner;
/// dK_j, dV_j on chip, dQ_i accumulated in an fp32 HBM buffer (each update a read
/// and a write, as an atomic add is), then converted. Needs in.dout.
Fa2BackwardResult fa2_backward_model(const Problem& p, const AttnInputs& in, std::size_t sram_bytes,
                                     Fa2Tiles t = {64, 64});

}  // namespace attn::ch04
