#pragma once
/// \file ring_cpu.hpp
/// \brief Ring attention on the CPU: the threads backend (one thread per rank, its own
///        buffers, messages through mailboxes) with the per-step compute of chapter
///        04's kernel written as loops, forward, backward and the decode all-reduce.
///
/// Forward, rank r (every rank runs this at once):
///
///     acc = identity (O = 0, LSE = -inf)            for every query row of Q_r
///     kv  = (K_r, V_r)
///     for s = 0 .. P-1:
///         start: send kv to r + 1, receive the next into kv'     (not at the last step)
///         for each (q chunk, k chunk) pair of step s that is not skipped:
///             (O_part, LSE_part) = attention(q chunk, k chunk, mask of the pair)
///             acc = acc ⊕ (O_part, LSE_part)                     (ring_merge.hpp)
///         finish; kv = kv'
///     O_r = acc.O,  LSE_r = acc.LSE
///
/// Backward, rank r: K/V travel as in the forward; dK/dV accumulators travel with
/// them, one step behind (they can leave only once this step's compute has added to
/// them), and after the last step each returns home; dQ stays local.
///
///     dq = 0
///     for s = 0 .. P-1:
///         start kv rotation                                       (not at the last step)
///         part = gradients of step s (dQ_r += its dQ; dK/dV of shard r - s in part)
///         dkv = (s == 0 ? 0 : finish the dK/dV message of step s - 1) + part
///         start: send dkv to r + 1                                (at s = P-1: home)
///         finish kv rotation
///     finish: our own dK_r, dV_r arrive from rank r - 1
#include <string>
#include <vector>

#include "common/inputs.hpp"
#include "common/problem.hpp"
#include "ring_schedule.hpp"

namespace attn::ch06::ring {

struct RingOptions {
  Layout layout = Layout::contiguous;
  int ranks = 1;
  /// How the running O (forward) and the travelling dK/dV (backward) are stored
  /// between steps: fp32, or bf16 (the precision study).
  DType acc = DType::f32;
  /// --inject-fault ring-step-skipped: rank `skip.rank` never merges the K/V block it holds
  /// at step `skip.step` (skipped_ring_step()); {-1, -1}: none.
  SkippedStep skip;
};

/// UsageError unless the ring can shard this problem: self-attention (nq == nk),
/// 1 <= ranks <= N.
void validate_ring(const Problem& p, int ranks);

/// Where each chunk of a shard lives in a shard tensor of `heads` heads and row width
/// `width`: chunk-major, each chunk a [batch][heads][count][width] tensor of its own,
/// so that a (q chunk, k chunk) pair is an ordinary attention problem for a kernel.
struct ShardGeometry {
  std::vector<Chunk> chunks;
  int tokens = 0;
  static ShardGeometry of(Layout layout, int n, int ranks, int rank);
  std::size_t chunk_offset(int c, int batch, int heads, int width) const;
  std::size_t elems(int batch, int heads, int width) const { return std::size_t(batch) * heads * tokens * width; }
};

/// Copies a global [batch][heads][n][width] tensor's rows of one shard into the
/// shard's chunk-major layout, and back.
void gather_shard(const float* global, int batch, int heads, int n, int width, const ShardGeometry& g, float* shard);
void scatter_shard(const float* shard, int batch, int heads, int n, int width, const ShardGeometry& g, float* global);

/// Elements of a K/V shard message: K then V, both chunk-major.
std::size_t kv_elems(const Problem& p, const ShardGeometry& g);

struct RingStats {
  std::vector<long long> rank_work;  ///< visible (query, key) pairs per rank
  int pairs_computed = 0, pairs_skipped = 0;
  double bytes_sent = 0;             ///< through the mailboxes (K/V and dK/dV)
};

struct RingForwardResult {
  std::vector<float> o, lse;  ///< global layout, O rounded to p.dtype
  RingStats stats;
};
RingForwardResult ring_forward_cpu(const Problem& p, const AttnInputs& in, const RingOptions& opt);

struct RingBackwardResult {
  std::vector<float> dq, dk, dv;  ///< global layout, rounded to p.dtype
  RingStats stats;
};
/// `o` and `lse` are the forward's outputs (as stored); `in.dout` is needed.
RingBackwardResult ring_backward_cpu(const Problem& p, const AttnInputs& in, const std::vector<float>& o,
                                     const std::vector<float>& lse, const RingOptions& opt);

/// Tree attention for decode: each of `ranks` ranks holds one contiguous K/V shard
/// and every query row (nq is small, nk long, causal aligned bottom-right); each
/// attends its shard, and one all-reduce of the partial (O, LSE) with ⊕ gives
/// every rank the same answer. Returns rank 0's copy; `ranks_agree` says whether
/// all ranks hold bit-identical results.
struct TreeDecodeResult {
  std::vector<float> o, lse;
  bool ranks_agree = false;
};
TreeDecodeResult tree_decode_cpu(const Problem& p, const AttnInputs& in, int ranks);

/// The precision study: merging in bf16 against fp32 accumulators as P grows.
/// One line per P of `ranks`: max |err| against fp64 of O (forward) and of dK, dV
/// (backward) with each accumulator type, and the same-precision naive yardstick.
struct PrecisionRow {
  int ranks = 0;
  double o_f32 = 0, o_bf16 = 0, o_naive = 0, o_tol = 0;
  double dkv_f32 = 0, dkv_bf16 = 0, dkv_naive = 0, dkv_tol = 0;
  bool pass_f32 = false, pass_bf16 = false;
};
std::vector<PrecisionRow> precision_study(const Problem& p, const std::vector<int>& ranks, uint64_t seed);

}  // namespace attn::ch06::ring
