#pragma once
/// \file backward_gpu.hpp
/// \brief Chapter 05's backward on the GPU, behind a plain C++ interface (no CUDA
///        types), so main.cpp and the tests compile with or without the CUDA toolkit.
///
///     b1  wgmma backward: all five products on wgmma, TMA loads, dQ by bulk reduce-add
///     b2  warp specialisation: a producer warpgroup and a ring of full/empty mbarriers
///     b3  dQ in fragment order: the fp32 dQ tile leaves the registers without bank conflicts
///     b4  no spills: descriptors rebuilt every step instead of kept across the loop
///     b5  a dQ writer warp: the reduce-adds (and the deterministic turns) leave the consumers' path
///     b6  deterministic walk from the end: the key blocks reach each dQ tile at the same step
///     b7  dQ split by keys: each consumer adds a whole partial tile; the consumers never meet
///     b8  (from b6) the stages released on named barriers, an order racecheck can follow
///     b9  two dS^T buffers: the consumers meet once a step instead of twice
///     b10 consumer offset: consumer 0 multiplies each dQ a step late, the consumers run apart
///     b11 longest walks first: the causal grid hands out every head's key block 0 first
///     b12 pairs of query blocks (d = 64): 128 queries a step, each consumer one block's whole dQ
///     b13 (from b11, d = 128) eighty queries a step: dQ^T = K^T dS^T, dS^T in 32-byte slabs, one dQ buffer
///     b14 dS by queries: dS stored [queries][keys] in the 128-byte swizzle, dQ^T's B read K-major
///     b15 (from b13) scores ahead: the next step's S^T issued before this step's dQ leaves
///     b16 (from the final backward) shared state space: LSE_i, D_i, dS^T (stmatrix) and dQ as
///         ld.shared and st.shared, LSE_i read while S^T runs
///     b17 (from b16) FA4's order: dV, the meeting, dQ, dK, dQ's handover under dK
///     final  the final backward (steps/final_backward.cu, from b11): b12's pairs of query blocks
///            at d = 64 and b13's eighty queries at d = 128, chosen by one configuration table
///
/// The main path is b1, b2, b5, b6, b10, b11 and the final backward (steps/); the others
/// are the lab's (steps/lab/, built with TUTORIAL_LAB=ON; LAB.md).
///
/// Each run is three kernels: the preprocess (D_i = rowsum(dO_i o O_i), LSE in base 2,
/// dQ's accumulator and the order counters zeroed), the step's main kernel (parallel
/// over key blocks), and the postprocess (dQ = tau x accumulator, in the input dtype).

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "common/inputs.hpp"
#include "common/problem.hpp"

namespace attn::ch05 {

enum class BwdStep { b1_wgmma = 1, b2_warp_specialized, b3_dq_fragment_order, b4_no_spills, b5_dq_writer, b6_deterministic_walk, b7_dq_split_by_keys,
                     b8_named_barrier_release, b9_two_ds_buffers, b10_consumer_offset, b11_longest_walks_first,
                     b12_pairs_of_query_blocks, b13_eighty_queries, b14_ds_by_queries, b15_scores_ahead,
                     b16_shared_state_space, b17_fa4_order,
                     final_bwd = 18 };  ///< final_bwd: the final backward (steps/final_backward.cu), `--backward-step final`

/// The main path: b1, b2, b5, b6, b10, b11 and the final backward.
constexpr BwdStep kMainBwdSteps[] = {BwdStep::b1_wgmma,           BwdStep::b2_warp_specialized,
                                     BwdStep::b5_dq_writer,       BwdStep::b6_deterministic_walk,
                                     BwdStep::b10_consumer_offset, BwdStep::b11_longest_walks_first,
                                     BwdStep::final_bwd};
/// The lab's backward steps (steps/lab/).
constexpr BwdStep kLabBwdSteps[] = {BwdStep::b3_dq_fragment_order, BwdStep::b4_no_spills,
                                    BwdStep::b7_dq_split_by_keys,  BwdStep::b8_named_barrier_release,
                                    BwdStep::b9_two_ds_buffers,    BwdStep::b12_pairs_of_query_blocks,
                                    BwdStep::b13_eighty_queries,   BwdStep::b14_ds_by_queries,
                                    BwdStep::b15_scores_ahead,     BwdStep::b16_shared_state_space,
                                    BwdStep::b17_fa4_order};
constexpr bool bwd_step_in_lab(BwdStep s) {
  for (BwdStep l : kLabBwdSteps)
    if (l == s) return true;
  return false;
}
/// Every backward step this build holds: the main path, then the lab's with TUTORIAL_LAB=ON.
#if TUTORIAL_LAB
constexpr BwdStep kAllBwdSteps[] = {BwdStep::b1_wgmma, BwdStep::b2_warp_specialized, BwdStep::b3_dq_fragment_order,
                                    BwdStep::b4_no_spills, BwdStep::b5_dq_writer, BwdStep::b6_deterministic_walk,
                                    BwdStep::b7_dq_split_by_keys, BwdStep::b8_named_barrier_release,
                                    BwdStep::b9_two_ds_buffers, BwdStep::b10_consumer_offset,
                                    BwdStep::b11_longest_walks_first, BwdStep::b12_pairs_of_query_blocks,
                                    BwdStep::b13_eighty_queries, BwdStep::b14_ds_by_queries,
                                    BwdStep::b15_scores_ahead, BwdStep::b16_shared_state_space,
                                    BwdStep::b17_fa4_order, BwdStep::final_bwd};
#else
constexpr BwdStep kAllBwdSteps[] = {BwdStep::b1_wgmma,           BwdStep::b2_warp_specialized,
                                    BwdStep::b5_dq_writer,       BwdStep::b6_deterministic_walk,
                                    BwdStep::b10_consumer_offset, BwdStep::b11_longest_walks_first,
                                    BwdStep::final_bwd};
#endif
constexpr bool bwd_step_built(BwdStep s) { return !bwd_step_in_lab(s) || TUTORIAL_LAB; }

/// "b1 wgmma backward" etc.
const char* bwd_step_name(BwdStep s);

/// Empty when the backward runs this problem, else why not (head dim, dtype, d != dv).
std::string backward_unsupported(const Problem& p);

/// Whether step `s` is built for this problem's head dim (b12: d = 64 only; b13-b15: d = 128 only;
/// b16, b17 and the final backward: both)
/// and is in this build (a lab step only with TUTORIAL_LAB=ON).
inline bool bwd_step_supports(BwdStep s, const Problem& p) {
  if (!bwd_step_built(s)) return false;
  if (s == BwdStep::b12_pairs_of_query_blocks) return p.d == 64;
  if (s == BwdStep::b13_eighty_queries || s == BwdStep::b14_ds_by_queries || s == BwdStep::b15_scores_ahead)
    return p.d == 128;
  return true;
}

struct GpuBackward {
  std::vector<float> dq, dk, dv;  ///< downloaded results (poisoned before the run)
  double time_ms = 0;             ///< preprocess + main + postprocess: median of >= 20, L2 flushed
  int grid = 0;                   ///< thread blocks of the main kernel
  int smem_bytes = 0;             ///< its dynamic shared memory per block
};

/// Runs chapter 05's forward (v8) for O and LSE, then backward step `s` once for the
/// check and, when `time` is set, times it, but only if `judge` (when given) accepts
/// the checked result: a kernel that fails its check is never timed. `deterministic`
/// orders dQ's adds by key block (bitwise repeatable). Throws UsageError for an
/// unsupported problem.
GpuBackward fa3_backward_gpu(const Problem& p, const AttnInputs& in, BwdStep s, bool deterministic, bool time,
                             const std::function<bool(const GpuBackward&)>& judge = {});

/// One problem on the device for several backward runs: the inputs, O and LSE (from the
/// forward, v8) and the gradients are uploaded and allocated once, so that the rows of a
/// report do not pay for them again. Every run poisons the outputs first.
class BackwardRunner {
 public:
  BackwardRunner(const Problem& p, const AttnInputs& in);  ///< UsageError for an unsupported problem
  ~BackwardRunner();
  BackwardRunner(const BackwardRunner&) = delete;
  BackwardRunner& operator=(const BackwardRunner&) = delete;
  /// As fa3_backward_gpu().
  GpuBackward run(BwdStep s, bool deterministic, bool time, const std::function<bool(const GpuBackward&)>& judge = {});

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

/// For a profiler (`ch05_fa3_hopper --backward-steps K,... --launch-only N`): each listed step
/// (its number, 1-17) run N times on one problem, dQ added in any order, O and LSE from v8;
/// nothing checked or timed. A step not built for the problem's head dim is skipped.
void fa3_backward_launch_only(const Problem& p, const AttnInputs& in, const std::vector<int>& steps, int launches);

/// Device bytes the backward allocates (inputs, O, LSE, gradients, accumulators).
double fa3_backward_device_bytes(const Problem& p);

}  // namespace attn::ch05
