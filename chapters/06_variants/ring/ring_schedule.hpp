#pragma once
/// \file ring_schedule.hpp
/// \brief Ring attention's schedule: which positions each rank holds (the layout),
///        which K/V shard it holds at each step, and the mask of every
///        (query chunk, key chunk) pair of that step: full, diagonal or skipped.
///
/// P ranks share one sequence of N tokens (self-attention: the same positions for
/// Q and for K/V). Rank r holds Q_r, K_r, V_r. In P - 1 rotations every rank passes
/// the K/V shard it holds to rank r + 1 and receives one from rank r - 1, so that
///
///     at step s (0 .. P-1) rank r holds the K/V of rank (r - s) mod P        (the study notes get this wrong)
///
///     step 0        step 1        step 2        step 3          P = 4
///     r0: KV0       r0: KV3       r0: KV2       r0: KV1
///     r1: KV1       r1: KV0       r1: KV3       r1: KV2         each arrow one rotation:
///     r2: KV2       r2: KV1       r2: KV0       r2: KV3         r -> r + 1 (mod P)
///     r3: KV3       r3: KV2       r3: KV1       r3: KV0
///
/// A shard is one or more *chunks*, each an arithmetic run of positions
/// `start, start + stride, ...` (`count` of them):
///
///     contiguous  rank r: one run of ~N/P consecutive positions
///     striped     rank r: positions r, r + P, r + 2P, ... (one run of stride P)
///     zigzag      N cut into 2P runs; rank r: runs r and 2P - 1 - r
///
/// Under the causal mask query position a sees key position b iff b <= a. For a
/// query chunk (a0 + i s) and a key chunk (b0 + j s) of the same stride s this is
///
///     j <= i + c,   c = floor((a0 - b0) / s)
///
/// so every pair is one of three kinds: **full** (every query sees every key: the
/// plain kernel), **diagonal** (the causal kernel with the offset c) or **skip**
/// (no query sees any key: no work, no merge).
#include <string>
#include <vector>

namespace attn::ch06::ring {

enum class Layout { contiguous, striped, zigzag };
const char* layout_name(Layout l);
/// Parses "contiguous", "striped" or "zigzag".
bool parse_layout(const std::string& s, Layout* out);

/// Positions start, start + stride, ..., start + (count - 1) * stride.
struct Chunk {
  int start = 0;
  int count = 0;
  int stride = 1;
  int position(int i) const { return start + i * stride; }
};

/// The chunks rank `rank` holds, in the order its shard stores them.
/// Every position 0..n-1 belongs to exactly one chunk of exactly one rank.
std::vector<Chunk> shard_chunks(Layout layout, int n, int ranks, int rank);

/// Tokens rank `rank` holds (the sum of its chunks' counts).
int shard_tokens(Layout layout, int n, int ranks, int rank);

/// The rank whose K/V shard rank `rank` holds at step `step`.
inline int kv_source(int rank, int step, int ranks) { return ((rank - step) % ranks + ranks) % ranks; }

enum class PairKind { full, diagonal, skip };
const char* pair_kind_name(PairKind k);

/// The mask of one (query chunk, key chunk) pair: query i sees key j iff j <= i + offset
/// (for kind diagonal; full sees everything, skip nothing).
struct PairMask {
  PairKind kind = PairKind::full;
  int offset = 0;
};

/// Classifies a pair. Without the causal mask every pair is full.
PairMask classify(const Chunk& q, const Chunk& k, bool causal);

/// Query/key pairs a pair of chunks computes: its share of the work.
long long visible_pairs(const Chunk& q, const Chunk& k, const PairMask& m);

/// One (query chunk, key chunk) pair of a step, with indices into the two shards.
struct StepPair {
  int q_chunk = 0, k_chunk = 0;
  PairMask mask;
};

/// What rank `rank` computes at step `step`: its K/V source and the pairs that are not skipped.
struct StepPlan {
  int kv_rank = 0;
  std::vector<StepPair> pairs;  ///< skipped pairs are left out
  long long work = 0;           ///< visible (query, key) pairs
  int skipped = 0;              ///< pairs skipped under the causal mask
};

StepPlan step_plan(Layout layout, int n, int ranks, int rank, int step, bool causal);

/// The (rank, step) whose K/V block `--inject-fault ring-step-skipped` leaves out of the
/// merge: rank P - 1 at its last step with work (a block passed around the ring, step >= 1).
/// UsageError when no rank receives a block it needs (P = 1).
struct SkippedStep {
  int rank = -1, step = -1;
};
SkippedStep skipped_ring_step(Layout layout, int n, int ranks, bool causal);

/// work[rank][step]: visible (query, key) pairs of every rank at every step.
std::vector<std::vector<long long>> work_table(Layout layout, int n, int ranks, bool causal);

/// The load-balance table of one problem in text: one row per rank, one column per
/// step, each cell the rank's work in units of a full N/P x N/P block; last columns
/// the rank's total and the ring's critical path (sum over steps of the busiest rank).
std::string format_work_table(Layout layout, int n, int ranks, bool causal);

}  // namespace attn::ch06::ring
