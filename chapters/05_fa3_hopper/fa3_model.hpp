#pragma once
/// \file fa3_model.hpp
/// \brief Chapter 05's CPU model: the FA3 schedule executed op by op, with the
///        mbarrier phase protocol, the named-barrier pingpong and asynchronous wgmma
///        groups modelled as the hardware defines them, and the traffic counted.
///
/// Each thread block is three agents running *programs*, lists of operations written
/// with the kernel's own loops (make_producer(), make_consumer() in fa3_model.cpp):
///
///     producer:    wait(empty_q) expect_tx(full_q) TMA Q;  per block j: wait(empty_k[s], phase^1)
///                  expect_tx(full_k[s]) TMA K_j -> s;  the same for V_j
///     consumer c:  wait(full_q); per block: wait(full_k[s]) [my turn] issue S = Q K_j^T
///                  [your turn] wait_group, arrive(empty_k[s]), softmax, ... issue O += P V_j ...
///
/// An interpreter runs the three agents of a block in some interleaving (round robin,
/// or chosen by a seeded random number generator) and blocks an agent whose next op
/// waits on a barrier phase that has not completed. A wgmma reads its shared-memory
/// operands when it *completes* (at the wait_group), the latest moment the hardware
/// may: so a stage released before its MMA finished, or overwritten before it was
/// released, is caught, as is a deadlock (no agent can move). Every stage carries a tag
/// saying which block it holds, and every read checks it.

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "common/inputs.hpp"
#include "common/problem.hpp"
#include "common/traffic.hpp"
#include "fa3_gpu.hpp"

namespace attn::ch05 {

/// Shared memory of one Hopper thread block (227 KB): the model's on-chip budget is the
/// larger of this and --sram-bytes.
constexpr std::size_t kHopperSmemBytes = 232448;

/// The schedule the model runs: which of steps 3-7's mechanisms are on.
struct ScheduleConfig {
  int Bc = 128;
  int stages = 2;
  bool pingpong = true;       ///< v4: named barriers alternate the consumers' GEMM windows
  bool intra_overlap = true;  ///< v5: S_j issued with P_{j-1} V_{j-1}, softmax overlaps it
  bool skip = true;           ///< causal tiles visit only visible blocks (every step)
  bool masked_first = true;   ///< v6: the blocks last first, so the diagonal's masked ones come first
  bool persistent = true;     ///< v7: `ctas` blocks walk the snake tile order
  int ctas = 3;               ///< simulated SMs of the persistent schedule
};

/// The schedule of a step's kernel at head dim d (steps 1 and 2 issue the same copies
/// from one thread and are modelled as step 3's schedule with their tiles).
ScheduleConfig schedule_for(Step s, int d, bool causal = false);

struct ScheduleStats {
  long ops = 0;                     ///< operations executed
  long hazards = 0;                 ///< operand reads that found the wrong block in a stage
  std::vector<int> window_order;    ///< consumer (0/1) of each GEMM window, in issue order (first block)
  std::vector<long> cta_blocks;     ///< K/V blocks each thread block processed
  std::vector<std::string> trace;   ///< the first operations, when asked for
};

struct Fa3ModelResult {
  std::vector<float> o, lse;  ///< O in the problem's dtype, LSE in fp32
  Traffic traffic;            ///< counted: what the copy engine reads, what the epilogue writes
  std::size_t sram_peak = 0;  ///< Q tile + K/V ring
  ScheduleStats stats;
};

/// Runs the schedule. `seed` 0 interleaves the agents round robin; any other seed
/// picks the next agent at random among those that can move. Throws std::runtime_error
/// on a deadlock (naming the agents and what they wait on), SramOverflow when the
/// tiles do not fit, UsageError for a shape the chapter does not take.
Fa3ModelResult fa3_forward_model(const Problem& p, const AttnInputs& in, const ScheduleConfig& cfg,
                                 std::size_t sram_bytes, uint64_t seed = 0, int trace_ops = 0);

/// Bytes the schedule moves, from the tile sizes alone (no simulation): Q once per
/// tile, K and V once per visited block of each tile, O and LSE once.
struct Fa3TrafficFormula {
  double q_read = 0, kv_read = 0, o_write = 0, lse_write = 0;
  double read() const { return q_read + kv_read; }
  double write() const { return o_write + lse_write; }
};
Fa3TrafficFormula fa3_forward_traffic(const Problem& p, const ScheduleConfig& cfg);

}  // namespace attn::ch05
