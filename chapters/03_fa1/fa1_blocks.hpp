#pragma once
/// \file fa1_blocks.hpp
/// \brief FlashAttention-1's block sizes from the on-chip budget M, and the causal
///        block-skipping rule, shared by the CPU model and the CUDA kernels.
///
/// **M in elements.** The paper's M counts elements of on-chip memory. Every tile in
/// this chapter is held on chip in fp32 (the kernels convert fp16/bf16 to fp32 as they
/// stage a tile, and accumulate in fp32), so a budget of `--sram-bytes` bytes is
/// M = sram_bytes / 4 elements.
///
/// **The paper's rule** (Algorithm 1, line 1) is
/// \f[ B_c = \left\lceil \frac{M}{4d} \right\rceil, \qquad B_r = \min(B_c, d), \f]
/// so that K_j and V_j (\f$2 B_c d\f$ elements) take half of M. The paper hides the
/// other tiles in its \f$\Theta\f$: Q_i, O_i and S_ij add \f$B_r(2d + B_c)\f$, which
/// does not always fit in the other half. Here B_r is *capped to what fits*: it is
/// lowered until every tile fits in M, and neither block is larger than the problem.
/// B_r never changes the forward traffic (Q and (m, l, O) are streamed once per K/V
/// block whatever their block height), so the cap costs nothing in bytes.
///
/// The backward keeps four \f$B_c \times d\f$ tiles on chip (K_j, V_j, dK_j, dV_j),
/// so its rule is \f$B_c = \lceil M / 8d \rceil\f$: the same \f$\Theta(M/d)\f$, with
/// the four tiles in half of M.
///
/// With \f$d \ne d_v\f$ the \f$4d\f$ above is read as \f$2(d + d_v)\f$.

#include <algorithm>
#include <cstddef>

#include "common/index.hpp"  // ceil_div, causal_diag
#include "common/online_softmax.hpp"  // ATTN_HD
#include "common/problem.hpp"

namespace attn::ch03 {

/// Rows of Q per block (B_r) and rows of K/V per block (B_c).
struct Blocks {
  int Br = 0;
  int Bc = 0;
  bool operator==(const Blocks& o) const { return Br == o.Br && Bc == o.Bc; }
};

/// Bytes of one on-chip element: every tile is fp32 on chip.
constexpr int kOnChipElemBytes = 4;

/// fp32 elements the forward model keeps on chip:
/// K_j, V_j (Bc x d, Bc x dv) + Q_i (Br x d) + O_i (Br x dv) + S_ij (Br x Bc) + m_i, l_i.
inline std::size_t forward_footprint(const Problem& p, Blocks b) {
  return std::size_t(b.Bc) * (p.d + p.dv) + std::size_t(b.Br) * (p.d + p.dv + b.Bc + 2);
}

/// fp32 elements the backward model keeps on chip: K_j, V_j, dK_j, dV_j (Bc rows) +
/// Q_i, dQ_i, dO_i (Br rows) + P_ij, dS_ij (Br x Bc) + LSE_i, D_i.
inline std::size_t backward_footprint(const Problem& p, Blocks b) {
  return std::size_t(b.Bc) * 2 * (p.d + p.dv) + std::size_t(b.Br) * (2 * p.d + p.dv + 2 * b.Bc + 2);
}

/// Algorithm 1's block sizes for an on-chip budget of `sram_bytes`, capped to what fits.
/// When even B_r = 1 does not fit, B_r = 1 is returned and the model's first tile
/// allocation throws SramOverflow (never a silent overflow).
inline Blocks forward_blocks(const Problem& p, std::size_t sram_bytes) {
  const std::size_t M = sram_bytes / kOnChipElemBytes;
  const std::size_t kv = std::size_t(p.d + p.dv);
  Blocks b;
  b.Bc = int(std::min<std::size_t>((M + 2 * kv - 1) / (2 * kv), std::size_t(p.nk)));  // ceil(M / 4d)
  b.Bc = std::max(b.Bc, 1);
  const std::size_t kv_tiles = std::size_t(b.Bc) * kv;
  const std::size_t per_row = kv + b.Bc + 2;  // Q_i, O_i, S_ij, (m_i, l_i) per row of Q
  const std::size_t fit = M > kv_tiles ? (M - kv_tiles) / per_row : 0;
  b.Br = int(std::min<std::size_t>({std::size_t(b.Bc), std::size_t(p.d), std::size_t(p.nq), fit}));
  b.Br = std::max(b.Br, 1);
  return b;
}

/// Algorithm 4's block sizes: B_c = ceil(M / 8d), B_r = min(B_c, d), capped to what fits.
inline Blocks backward_blocks(const Problem& p, std::size_t sram_bytes) {
  const std::size_t M = sram_bytes / kOnChipElemBytes;
  const std::size_t kv = std::size_t(p.d + p.dv);
  Blocks b;
  b.Bc = int(std::min<std::size_t>((M + 4 * kv - 1) / (4 * kv), std::size_t(p.nk)));  // ceil(M / 8d)
  b.Bc = std::max(b.Bc, 1);
  const std::size_t kv_tiles = std::size_t(b.Bc) * 2 * kv;
  const std::size_t per_row = std::size_t(2 * p.d + p.dv) + 2 * std::size_t(b.Bc) + 2;
  const std::size_t fit = M > kv_tiles ? (M - kv_tiles) / per_row : 0;
  b.Br = int(std::min<std::size_t>({std::size_t(b.Bc), std::size_t(p.d), std::size_t(p.nq), fit}));
  b.Br = std::max(b.Br, 1);
  return b;
}

/// The CUDA kernels' blocks: the paper's rule at a fixed M of 32768 fp32 elements
/// (128 KiB, of which K_j and V_j take half; the backward's dK_j and dV_j live in
/// registers), with B_r at most 64 rows (four 16-row groups of the thread layout):
///
///     d      forward (Br, Bc)    backward (Br, Bc)
///     32     (32, 256)           (32, 128)
///     64     (64, 128)           (64,  64)
///     128    (64,  64)           (32,  32)
constexpr int kKernelM = 32768;
ATTN_HD constexpr Blocks kernel_forward_blocks(int d) {
  return {std::min(std::min(kKernelM / (4 * d), d), 64), kKernelM / (4 * d)};
}
ATTN_HD constexpr Blocks kernel_backward_blocks(int d) {
  return {std::min(std::min(kKernelM / (8 * d), d), 64), kKernelM / (8 * d)};
}

/// The last K/V block that Q block `i` (rows i*Br .. i*Br+Br-1) has to visit, or -1
/// when every row of the block is empty. With the bottom-right causal mask, query
/// row r sees key c iff c <= r + (nk - nq); the block's last row sees the most, and
/// every K/V block up to the one holding that row's last visible key is visited.
/// Without the mask every block is visited. Since K/V blocks run in the outer loop,
/// Q block i takes part in steps j = 0 .. last_visit(i): its (m, l, O) state starts
/// at j = 0 and is final at j = last_visit(i).
ATTN_HD int last_visit(int nq, int nk, bool causal, Blocks b, int i) {
  const int Tc = ceil_div(nk, b.Bc);
  // EXERCISE ch03.2: causal block skipping: the last K/V block Q block i sees (-1 when none)
  //| return Tc - 1;  // TODO: every Q block visits every K/V block
  if (!causal) return Tc - 1;
  const int last_row = std::min((i + 1) * b.Br, nq) - 1;
  const int last_key = last_row + causal_diag(nq, nk);  // bottom-right alignment
  if (last_key < 0) return -1;
  return std::min(Tc - 1, last_key / b.Bc);
  // END EXERCISE
}

inline int last_visit(const Problem& p, Blocks b, int i) { return last_visit(p.nq, p.nk, p.causal, b, i); }

}  // namespace attn::ch03
