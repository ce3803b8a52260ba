#pragma once
/// \file fa3_gpu.hpp
/// \brief Chapter 05 on the GPU, behind a plain C++ interface (no CUDA types), so
///        main.cpp and the tests compile with or without the CUDA toolkit.
///
/// The main path, each step a whole kernel in steps/ (read them in order, `diff` them pairwise):
///
///     v1  TMA: chapter 04's last kernel with cp.async replaced by TMA copies and mbarriers
///     v2  wgmma: Q K^T from shared memory, P V with P from registers
///     v3  warp specialisation: a producer warpgroup, two consumer warpgroups, setmaxnreg
///     v4  pingpong: named barriers alternate the two consumers' GEMMs
///     v5  intra-warpgroup overlap: S_{j+1} = Q K_{j+1}^T issued before softmax(S_j) is done
///     v6  masked blocks first: only the key blocks the causal diagonal crosses take the mask
///     v7  persistent blocks: one per SM, each walking a longest-first list of tiles
///     v8  every head dim: d = 64, 128, 256, each with its key block and ring depth
///     final      the final bf16/fp16 forward (steps/final.cu, from v8): one kernel whose
///                per-head-dim, per-mask configuration is one table
///     final-fp8  the final FP8 forward (steps/final_fp8.cu, from v8): E4M3 with the paper's
///                incoherent processing, its configuration one table too
///
/// The lab (steps/lab/, built with TUTORIAL_LAB=ON; LAB.md says what each one taught):
/// v9 FP8 (E4M3), v10 key blocks per head dim, v11 exponentials on two pipes, v12 the FP8
/// softmax on two pipes, v13 dynamic tiles, v14 three consumers, v15 FP8 lazy rescaling,
/// v16 causal grid, v17-v19 causal key blocks, v20 one exponential in eight, v21 reductions
/// in chains, v22 chains on three consumers, v23 descriptors by addition, v24 causal L2
/// sections, v25 descriptors on three consumers, v26/v27 FP8 key blocks, v28/v29 every
/// exponential on MUFU, v30/v31 the final kernel's d = 128 causal row as v6's grid (the
/// final FP8 kernel's causal rows at d = 128 and 256 run on that grid too).

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "common/inputs.hpp"
#include "common/problem.hpp"

namespace attn::ch05 {

enum class Step {
  v1_tma = 1,
  v2_wgmma,
  v3_warp_specialized,
  v4_pingpong,
  v5_intra_overlap,
  v6_masked_first,
  v7_persistent,
  v8_head_dims,  ///< every head dim: the main path's last step before the final kernels (chapter 06 builds on it)
  v9_fp8,
  v10_tile_sizes,  ///< v8 with FA3's key blocks (Bc = 192, 176, 80 at d = 64, 128, 256, not causal)
  v11_two_pipe_exp,   ///< v10 with one exponential in four on the FMA pipe
  v12_fp8_two_pipes,  ///< v9 with the scale folded into the exponent's FFMA and 1 in 4 2^x on FMA
  v13_dynamic_tiles,  ///< v11 with tiles taken on demand from a global counter
  v14_three_consumers,  ///< v13 at d = 64 with three consumer warpgroups (Br = 192)
  v15_fp8_lazy_rescale,  ///< v12 with O rescaled only when some row's max grows by more than 2^8
  v16_causal_grid,       ///< v11 with causal problems launched as a grid of one block per tile
  v17_causal_key_blocks,  ///< v11 at d = 64 with causal key blocks of 192, as unmasked ones
  v18_causal_blocks_registers,  ///< v17 at every head dim: causal Bc = 176, 80 too, three registers given back
  v19_causal_grid_wide_blocks,  ///< v18 at d = 128, 256 with causal problems launched as a grid (v16's launch)
  v20_exp_one_in_eight,         ///< v17 (d = 64) with one exponential in eight on the FMA pipe, not four
  v21_softmax_chains,           ///< v18 with the softmax's row max and row sum in four partial chains a row
  v22_three_consumers_chains,   ///< v14 (d = 64, three consumers) with v21's row reductions in chains
  v23_descriptors_by_addition,  ///< v21 with each wgmma descriptor its tile's base plus a constant
  v24_causal_l2_sections,       ///< v23 with the causal list in head sections that share L2
  v25_three_consumers_descriptors,  ///< v14 (d = 64, three consumers) with v23's descriptors by addition
  v26_fp8_wide_blocks_d256,         ///< v15 (fp8) at d = 256 with key blocks of 128 (FA3's fp8 tile there)
  v27_fp8_wide_blocks_d128,         ///< v15 (fp8) at d = 128 with key blocks of 192 (V8^T in two boxes)
  v28_three_consumers_mufu_exp,     ///< v25 (d = 64, three consumers) with every exponential on MUFU
  v29_fp8_mufu_exp_d256,            ///< v26 (fp8, d = 256, Bc = 128) with every exponential on MUFU
  v30_final_causal_grid,            ///< final with its d = 128 causal row launched as v6's grid
  v31_final_causal_grid_bc128,      ///< v30 with v6's key block (Bc = 128) at d = 128 causal
  final_fwd = 40,                   ///< the final bf16/fp16 forward: `--step final`
  final_fp8 = 41,                   ///< the final FP8 forward: `--step final-fp8`
};

/// The main path: v1-v8 and the two final kernels.
constexpr Step kMainSteps[] = {Step::v1_tma,        Step::v2_wgmma,         Step::v3_warp_specialized,
                               Step::v4_pingpong,   Step::v5_intra_overlap, Step::v6_masked_first,
                               Step::v7_persistent, Step::v8_head_dims,     Step::final_fwd,
                               Step::final_fp8};
/// The lab's steps (steps/lab/), in the order they were measured.
constexpr Step kLabSteps[] = {Step::v9_fp8,
                              Step::v10_tile_sizes, Step::v11_two_pipe_exp, Step::v12_fp8_two_pipes,
                              Step::v13_dynamic_tiles, Step::v14_three_consumers, Step::v15_fp8_lazy_rescale,
                              Step::v16_causal_grid, Step::v17_causal_key_blocks,
                              Step::v18_causal_blocks_registers, Step::v19_causal_grid_wide_blocks,
                              Step::v20_exp_one_in_eight, Step::v21_softmax_chains,
                              Step::v22_three_consumers_chains, Step::v23_descriptors_by_addition,
                              Step::v24_causal_l2_sections, Step::v25_three_consumers_descriptors,
                              Step::v26_fp8_wide_blocks_d256, Step::v27_fp8_wide_blocks_d128,
                              Step::v28_three_consumers_mufu_exp, Step::v29_fp8_mufu_exp_d256,
                              Step::v30_final_causal_grid, Step::v31_final_causal_grid_bc128};
/// True for a lab step.
constexpr bool step_in_lab(Step s) {
  for (Step l : kLabSteps)
    if (l == s) return true;
  return false;
}
/// Every step this build holds: the main path, then the lab's when built with TUTORIAL_LAB=ON.
#if TUTORIAL_LAB
constexpr Step kAllSteps[] = {Step::v1_tma,        Step::v2_wgmma,         Step::v3_warp_specialized,
                              Step::v4_pingpong,   Step::v5_intra_overlap, Step::v6_masked_first,
                              Step::v7_persistent, Step::v8_head_dims,     Step::final_fwd,
                              Step::final_fp8,
                              Step::v9_fp8,
                              Step::v10_tile_sizes, Step::v11_two_pipe_exp, Step::v12_fp8_two_pipes,
                              Step::v13_dynamic_tiles, Step::v14_three_consumers, Step::v15_fp8_lazy_rescale,
                              Step::v16_causal_grid, Step::v17_causal_key_blocks,
                              Step::v18_causal_blocks_registers, Step::v19_causal_grid_wide_blocks,
                              Step::v20_exp_one_in_eight, Step::v21_softmax_chains,
                              Step::v22_three_consumers_chains, Step::v23_descriptors_by_addition,
                              Step::v24_causal_l2_sections, Step::v25_three_consumers_descriptors,
                              Step::v26_fp8_wide_blocks_d256, Step::v27_fp8_wide_blocks_d128,
                              Step::v28_three_consumers_mufu_exp, Step::v29_fp8_mufu_exp_d256,
                              Step::v30_final_causal_grid, Step::v31_final_causal_grid_bc128};
#else
constexpr Step kAllSteps[] = {Step::v1_tma,        Step::v2_wgmma,         Step::v3_warp_specialized,
                              Step::v4_pingpong,   Step::v5_intra_overlap, Step::v6_masked_first,
                              Step::v7_persistent, Step::v8_head_dims,     Step::final_fwd,
                              Step::final_fp8};
#endif
/// Whether this build holds step `s` (a lab step only with TUTORIAL_LAB=ON).
constexpr bool step_built(Step s) { return !step_in_lab(s) || TUTORIAL_LAB; }

/// True for the steps that compute in E4M3 (their inputs go through fp8_prepare first).
constexpr bool step_is_fp8(Step s) {
  return s == Step::final_fp8 || s == Step::v9_fp8 || s == Step::v12_fp8_two_pipes || s == Step::v15_fp8_lazy_rescale ||
         s == Step::v26_fp8_wide_blocks_d256 || s == Step::v27_fp8_wide_blocks_d128 || s == Step::v29_fp8_mufu_exp_d256;
}

/// "v3 warp-specialised" etc.
const char* step_name(Step s);
/// Parses "1".."16" or "v1".."v16"; false otherwise.
bool parse_step(const std::string& text, Step* out);

/// Whether step `s` has a kernel for this problem (head dim, dtype, d == dv); the
/// reason when not. Steps 2-7 are built for d = 128, steps 1, 8-13, 15, 16, 18, 21, 23 and 24 for d in {64, 128, 256}, steps 14, 17, 20, 22, 25 and 28 for d = 64, step 19 for d = 128 and 256, steps 26 and 29 for d = 256, step 27 for d = 128.
bool step_supports(Step s, const Problem& p, std::string* why = nullptr);

/// True when this binary carries the sm_90a kernels and the current GPU is sm_90;
/// otherwise false with the reason (the chapter then waives its GPU rows).
bool hopper_ready(std::string* why);

struct GpuForward {
  std::vector<float> o, lse;  ///< downloaded results (poisoned before the run)
  double time_ms = 0;         ///< the attention kernel: median of >= 20 repeats, L2 flushed
  double prep_ms = 0;         ///< fp8 only: the quantisation pass (Hadamard, scales, V^T)
  int grid = 0;               ///< thread blocks launched
  int smem_bytes = 0;         ///< dynamic shared memory per block
};

/// Runs step `s` once for the check and, when `time` is set, times it. Throws
/// UsageError if step_supports() is false, CudaError on a CUDA failure. With
/// `launches` > 1 the prepared kernel runs that many times, the outputs poisoned
/// before each, and the last run is the one returned (state a launch leaves behind,
/// such as v13's tile counter, must not change the next one's answer).
GpuForward fa3_forward_gpu(const Problem& p, const AttnInputs& in, Step s, bool time, int launches = 1);

/// One problem on the device for several steps' runs: Q, K and V uploaded once, O and LSE
/// allocated once, so that the rows of a report do not pay for them again (at the papers'
/// shapes each row would move 200 MB of inputs through the host). Every run poisons O and
/// LSE first, so a run never sees another's outputs. fa3_forward_gpu() is one run of a
/// fresh runner.
class ForwardRunner {
 public:
  ForwardRunner(const Problem& p, const AttnInputs& in);
  ~ForwardRunner();
  ForwardRunner(const ForwardRunner&) = delete;
  ForwardRunner& operator=(const ForwardRunner&) = delete;
  /// As fa3_forward_gpu().
  GpuForward run(Step s, bool time, int launches = 1);

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

/// Launches step `s` `launches` times, back to back, on inputs written on the device
/// (unit normals): nothing uploaded, checked, downloaded or timed, so that a profiler
/// sees the kernels alone (`--launch-only K`; scripts/ncu_fwd.py). Throws as above.
void fa3_launch_only(const Problem& p, Step s, int launches);

/// Device bytes the run allocates (inputs, outputs, fp8 copies).
double fa3_device_bytes(const Problem& p, Step s);

/// Step 7's preparation pass alone, downloaded: the E4M3 bits of Q, K and V^T (keys
/// permuted) and the scales, to compare with quantize_fp8() on the CPU.
struct Fp8Prepared {
  std::vector<uint8_t> q8, k8, vt8;
  std::vector<float> q_scale, k_scale, v_scale;
  int nk_pad = 0;
};
Fp8Prepared fp8_prepare_gpu(const Problem& p, const AttnInputs& in);

/// TFLOP/s of a cuBLASLt E4M3 x E4M3 -> bf16 GEMM of 8192^3 (the fp8 ceiling; cached).
double measure_fp8_gemm_tflops();

// ----------------------------------------------------------------------------- building blocks
//
// Each Hopper mechanism checked alone on the device, so a failure points at one helper.

struct ProbeResult {
  double max_err = 0;  ///< max |got - want|
  bool ran = false;
  std::string what;
};
/// A TMA copy of a 128-byte-swizzled box read back element by element through the
/// swizzle formula of wgmma.cuh.
ProbeResult probe_tma_swizzle();
/// One m64n128 product with wgmma: both operands K-major from shared memory (SS),
/// and A from registers with an N-major B (RS, the P V form), against a CPU GEMM.
ProbeResult probe_wgmma_bf16();
/// The fp8 RS product with the permuted V^T layout (fp8_key_at()).
ProbeResult probe_wgmma_fp8();

}  // namespace attn::ch05
