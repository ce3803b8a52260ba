#pragma once
/// \file fa1_model.hpp
/// \brief Chapter 03's CPU model: FlashAttention-1's forward (Algorithm 1) and
///        backward (Algorithm 4, without dropout), with every HBM access counted.
///
/// Forward, in the paper's loop order (K/V blocks outside, Q blocks inside):
///
///     for j in 0 .. Tc-1:                         K_j, V_j  -> on chip, once
///       for i in 0 .. Tr-1 (causal: skip i whose rows see none of block j):
///         Q_i, and (m_i, l_i, O_i) unless j = 0  -> on chip      every step
///         S_ij = tau Q_i K_j^T,  m~ = rowmax,  P~ = exp(S_ij - m~),  l~ = rowsum(P~)
///         (m_i, l_i) <- (m_i, l_i) (+) (m~, l~)
///         O_i <- (l_i e^{m_i - m_new} O_i + e^{m~ - m_new} P~ V_j) / l_new
///         (m_i, l_i, O_i) -> HBM, or O_i and LSE_i on Q block i's last step
///
/// so the traffic is K and V once plus Q and the (m, l, O) state once per K/V block:
/// \f$\Theta(N d \cdot T_c) = \Theta(N^2 d^2 / M)\f$ (Theorem 2). The state between
/// steps is kept in fp32 scratch (O_i in fp32, as FlashAttention-1's own code does:
/// rounding O to bf16 on every one of Tc steps would lose the accuracy the final
/// store has); the outputs O (in the problem's dtype) and LSE (fp32) are written once.
///
/// Backward: D_i = rowsum(dO_i o O_i) in one pass, then K/V blocks outside, Q blocks
/// inside, S and P recomputed from the stored LSE, dK_j and dV_j accumulated on chip,
/// dQ_i read, updated and written back on every step (no atomics: one thread block
/// owns a whole (batch, KV head), so nobody else touches its dQ rows).

#include <cstddef>
#include <vector>

#include "common/inputs.hpp"
#include "common/problem.hpp"
#include "common/traffic.hpp"
#include "fa1_blocks.hpp"

namespace attn::ch03 {

struct Fa1ForwardResult {
  std::vector<float> o, lse;  ///< O in the problem's dtype, LSE in fp32
  Traffic traffic;            ///< counted
  Blocks blocks;              ///< the B_r, B_c used
  std::size_t sram_peak = 0;  ///< peak on-chip bytes
};

/// Algorithm 1. `blocks` {0, 0} means forward_blocks(p, sram_bytes); explicit blocks
/// must still fit in `sram_bytes` (SramOverflow otherwise).
Fa1ForwardResult fa1_forward_model(const Problem& p, const AttnInputs& in, std::size_t sram_bytes,
                                   Blocks blocks = {});

struct Fa1BackwardResult {
  std::vector<float> dq, dk, dv;  ///< in the problem's dtype
  Traffic traffic;                ///< counted: the D pass and the main loop
  Blocks blocks;
  std::size_t sram_peak = 0;
};

/// Algorithm 4 on the forward's outputs `o` (dtype) and `lse` (fp32).
/// `blocks` {0, 0} means backward_blocks(p, sram_bytes).
Fa1BackwardResult fa1_backward_model(const Problem& p, const AttnInputs& in, const std::vector<float>& o,
                                     const std::vector<float>& lse, std::size_t sram_bytes, Blocks blocks = {});

/// Bytes FA1 moves, from the block sizes alone. The models' counted traffic equals
/// this, and the GPU report gives it (with the kernels' blocks) as the kernels' bytes: a
/// formula of their loop structure, not a measurement.
struct Fa1Traffic {
  double kv_read = 0;       ///< K_j, V_j: once per K/V block
  double q_read = 0;        ///< Q_i (and dO_i, LSE_i, D_i in the backward): once per visited (i, j)
  double state_read = 0;    ///< (m_i, l_i, O_i) or dQ_i read back from scratch, j > 0
  double state_write = 0;   ///< the same written to scratch on every step but a block's last
  double out_write = 0;     ///< O and LSE (or dQ, dK, dV) written once
  double pre_read = 0, pre_write = 0;  ///< the backward's D pass (reads O and dO, writes D)
  double visits = 0;        ///< (i, j) block pairs computed, over all heads
  double extra = 0;         ///< scratch bytes: (m, l, O_acc) or (D, dQ_acc)
  double read() const { return kv_read + q_read + state_read + pre_read; }
  double write() const { return state_write + out_write + pre_write; }
  double total() const { return read() + write(); }
};
Fa1Traffic fa1_forward_traffic(const Problem& p, Blocks b);
Fa1Traffic fa1_backward_traffic(const Problem& p, Blocks b);

/// Theorem 2's yardstick \f$N_q N_k d^2 / M\f$ summed over (batch, head), with M in
/// elements (sram_bytes / 4): counted bytes over this stay within a constant.
double theorem2_scale(const Problem& p, std::size_t sram_bytes);

}  // namespace attn::ch03
