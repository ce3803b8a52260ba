#pragma once
/// \file softmax_model.hpp
/// \brief Chapter 02's CPU models: the softmax of rows of scores by five algorithms,
///        each written with its kernel's loop structure and counted traffic.
///
///     variant              sweeps over S   global bytes per row of N fp32 scores
///     -------------------  -------------   -------------------------------------------
///     naive (no max shift)       2         read 2 x 4N, write 4N + 4   (overflows: x > 88.7)
///     safe, 3 passes             3         read 3 x 4N, write 4N + 4
///     online, 2 passes           2         read 2 x 4N, write 4N + 4
///     online, row on chip        2         read 4N,     write 4N + 4   (second sweep from registers)
///     fused with V, 1 pass       1         read 4N + V, write 4 dv + 4 (O and LSE; P never stored)
///
/// The models run the same loops as the kernels in steps/ (a sweep reads the row one
/// "wave" at a time: 256 threads x 4 float4 = 4096 scores), read and write "HBM" through
/// counted GlobalTensors, and hold their tiles in an OnChip budget. So the bytes they
/// count are the bytes the kernels ask for, and softmax_traffic() states them as a formula.
///
/// Every variant is built on the shared state and merge of common/online_softmax.hpp.

#include <cstddef>
#include <vector>

#include "common/index.hpp"
#include "common/online_softmax.hpp"
#include "common/problem.hpp"
#include "common/traffic.hpp"
#include "scores.hpp"

namespace attn::ch02 {

// ----------------------------------------------------------------------------- kernel geometry

/// v1, v2: one block of this many threads per row.
constexpr int kThreads = 256;
/// v1, v2: float4 loads each thread issues before using the first (loads in flight).
constexpr int kUnroll = 4;
/// Scores one step of a sweep covers: kThreads x kUnroll float4.
constexpr int kWave = kThreads * kUnroll * 4;
/// v3: float4 registers each thread holds; a row of up to kRowInRegisters scores stays
/// in the registers of one block of at most kMaxThreads threads.
constexpr int kVecsPerThread = 8;
constexpr int kMaxThreads = 1024;
constexpr int kRowInRegisters = kMaxThreads * kVecsPerThread * 4;  // 32768 scores, 128 KB
/// v4: rows per block (one warp each), and keys per tile of S and V.
constexpr int kBr = 8;
constexpr int kBc = 64;

/// How the kernels split a row of n fp32 scores for 16-byte accesses. A row starts at
/// row * n floats, so it is 16-byte aligned only when n is a multiple of 4:
///
///     row:  | head (0-3 floats) | body: nvec float4, 16-byte aligned | tail (0-3) |
///
/// Thread t of T owns body float4 t, t + T, t + 2T, ...; threads 0..head-1 own one head
/// float each and threads 0..tail-1 one tail float.
struct RowSplit {
  int head;  ///< floats before the first 16-byte boundary (0-3)
  int nvec;  ///< float4 in the aligned body
  int tail;  ///< floats after it (0-3)
  ATTN_HD int tail_start() const { return head + 4 * nvec; }
};

/// The split of n floats starting at byte address `address` (a multiple of 4).
ATTN_HD RowSplit split_row(unsigned long long address, int n) {
  const int misaligned = int((address >> 2) & 3);  // floats past the last 16-byte boundary
  const int to_boundary = (4 - misaligned) & 3;
  const int head = to_boundary < n ? to_boundary : n;
  const int nvec = (n - head) >> 2;
  return {head, nvec, n - head - 4 * nvec};
}

/// v3's block for rows of n scores: the fewest whole warps whose kVecsPerThread float4
/// each cover the body (at most n / 4 float4); more than kMaxThreads when n does not fit.
inline int registers_threads(int n) {
  const int warps = ceil_div(n / 4, 32 * kVecsPerThread);
  return 32 * (warps > 0 ? warps : 1);
}

// ----------------------------------------------------------------------------- variants

enum class Variant {
  naive,           ///< step 0: e^x / sum e^x, no shift (2 sweeps)
  safe3,           ///< step 1: m, then l, then P (3 sweeps)
  online2,         ///< step 3: (m, l) in one sweep, then P (2 sweeps)
  online_on_chip,  ///< step 3 with the row kept on chip: the second sweep reads registers
  fused,           ///< step 4: (m, l, O) in one sweep over S and V; O = P V, P never stored
};

const char* variant_name(Variant v);
/// Sweeps the algorithm makes over a row of scores (wherever the row lives).
int variant_sweeps(Variant v);
/// All five, in the chapter's order.
std::vector<Variant> all_variants();

/// What one variant moves to and from global memory ("HBM"), as a formula: the kernel's
/// own count, which the CPU model's counted traffic must equal.
struct SoftmaxTraffic {
  double read = 0, write = 0;
  int hbm_sweeps = 0;    ///< sweeps over S that read global memory
  bool on_chip = false;  ///< online_on_chip: the row fits in registers (else it streams)
};
SoftmaxTraffic softmax_traffic(const Problem& p, Variant v);

/// Whether a row of n scores stays in the registers of one block (kRowInRegisters).
inline bool row_fits_in_registers(int n) { return n <= kRowInRegisters; }

// ----------------------------------------------------------------------------- models

struct SoftmaxRun {
  std::vector<float> p;    ///< P (softmax variants; empty for fused)
  std::vector<float> o;    ///< O (fused; empty otherwise)
  std::vector<float> lse;  ///< every variant
  Traffic traffic;         ///< counted
  std::size_t sram_peak = 0;
  bool on_chip = false;    ///< online_on_chip kept the rows in registers
};

/// Runs one variant over every row. `sram_bytes` is the shared-memory-and-tiles budget
/// (`--sram-bytes`); the on-chip variant's row lives in registers, a budget of its own
/// (kRowInRegisters floats), and rows longer than that stream like online2.
SoftmaxRun softmax_model(const Problem& p, const SoftmaxInputs& in, Variant v, std::size_t sram_bytes);

// ----------------------------------------------------------------------------- the merge, by hand

/// The merge \f$(m_a, \ell_a) \oplus (m_b, \ell_b)\f$ written out from its definition,
/// for exercise ch02.1; its test compares it with common's merge().
///
///     m   = max(m_a, m_b)
///     l   = l_a e^(m_a - m) + l_b e^(m_b - m)
///     and (-inf, 0) (+) (-inf, 0) = (-inf, 0): no exponent may be -inf - (-inf)
template <class T>
SoftmaxState<T> merge_by_hand(const SoftmaxState<T>& a, const SoftmaxState<T>& b) {
  // EXERCISE ch02.1: merge two (m, l) states
  //| (void)b;
  //| return a;  // TODO: your code here
  const T m = a.m > b.m ? a.m : b.m;
  if (m == neg_inf<T>()) return SoftmaxState<T>::identity();  // both empty
  return {m, a.l * BaseE::exp(a.m - m) + b.l * BaseE::exp(b.m - m)};
  // END EXERCISE
}

}  // namespace attn::ch02
