#pragma once
/// \file mask_gpu.hpp
/// \brief The masked kernels from the host: upload, block map, launch, download.
///        Declared without CUDA headers (the binary's CPU-only build includes it).
///
///     ampere_mask.cu          sm_80+: chapter 04's forward step v9 + the policy
///     hopper_mask.cu          sm_90a: chapter 05's bf16 step v8 + the policy
///     steps/v1_two_q_buffers.cu   sm_90a step 1: the next tile's Q loads while this one runs
///     steps/v2_tile_overlap.cu    sm_90a step 2: one pipeline across tiles
///     steps/v3_document_tiles.cu  sm_90a step 3: documents tiled from their own starts
///     steps/v4_row_spans.cu       sm_90a step 4: partial tiles masked from each row's span
///     steps/lab/v5_epilogue_in_place.cu  sm_90a lab step 5 (TUTORIAL_LAB builds): v4 without v2's deferred epilogue
///     steps/final.cu              the final masked forward (sm_90a): v4 with one configuration table (the default)
///     final_fp16.cu               its fp16 kernels: steps/final.cu included with CH06_FINAL_FP16 set
///     backward_mask.cu        the sm80 masked backward: chapter 04's backward + the policy (score' included)
///     hopper_backward.cu      the sm90a masked backward: chapter 05's final backward + the policy
///     hopper_backward_fp16.cu its fp16 kernels
///
/// Every kernel is instantiated for d = 128 and bf16, once per policy; the final sm90a forward
/// for d = 64, 128 and 256, in bf16 and fp16.

#include <string>
#include <vector>

#include "common/device.hpp"
#include "common/inputs.hpp"
#include "common/faults.hpp"
#include "common/problem.hpp"
#include "mask_spec.hpp"

namespace attn::ch06 {

enum class GpuPath { sm80, sm90a, backward };
const char* gpu_path_name(GpuPath p);  ///< "sm80 forward", "sm90a forward", "backward"


struct GpuMaskForward {
  std::vector<float> o, lse;  ///< o in the layout's order, lse [B][H][N]
  double time_ms = 0;         ///< median with the L2 flushed; 0 when not timed
  double tiles = 0;           ///< K/V tiles the kernel visited (from the block map)
  int tile_keys = 0;          ///< keys per K/V tile of the kernel that ran (its block map's Bc)
  int faulted_lists = 0;      ///< forward lists an injected fault changed (GpuForwardOptions::fault)
};
struct GpuMaskBackward {
  std::vector<float> dq, dk, dv;
  std::vector<float> dsink;  ///< learned sink: dLoss/dsink_h per head (empty otherwise)
  double time_ms = 0;
};


/// The sm90a forward's steps: 0 hopper_mask.cu, 1 steps/v1_two_q_buffers.cu,
/// 2 steps/v2_tile_overlap.cu, 3 steps/v3_document_tiles.cu, 4 steps/v4_row_spans.cu, the
/// lab's 5 (steps/lab/v5_epilogue_in_place.cu, built with TUTORIAL_LAB only), and
/// kHopperFinal, steps/final.cu (the final masked forward, "final" on the command line).
constexpr int kHopperLab = 5;
constexpr int kHopperFinal = 6;
constexpr int kHopperSteps = kHopperFinal + 1;
const char* hopper_step_file(int step);  ///< "steps/v2_tile_overlap.cu", ...
/// Whether this build carries sm90a step `step` (the lab's only with TUTORIAL_LAB).
inline bool hopper_step_built(int step) { return step >= 0 && step < kHopperSteps && (step != kHopperLab || TUTORIAL_LAB); }

/// Empty when `path` runs this problem on `dev`; otherwise why not (d, dtype, GPU). For sm90a,
/// `hopper_step` names the kernel: the final one (steps/final.cu) has d = 64, 128 and 256 in
/// bf16 and fp16, the steps before it d = 128 and bf16 only.
std::string mask_gpu_unsupported(const Problem& p, GpuPath path, const DeviceInfo& dev,
                                 int hopper_step = kHopperFinal);

/// How a forward runs besides its problem: which sm90a step, and how many thread blocks
/// its persistent grid has (0: one per SM; a test gives a few, so each walks many tiles).
struct GpuForwardOptions {
  int hopper_step = kHopperFinal;
  int ctas = 0;
  /// A measurement: every visited tile is listed as partial, so each takes the element
  /// mask (the same output; the time says what the mask costs per tile).
  bool all_partial = false;
  /// --inject-fault: the forward lists as a faulty map builder leaves them (inject_map_fault()).
  Fault fault = Fault::none;
};

/// Forward on the GPU (`path` sm80 or sm90a). Inputs in the layout's order.
GpuMaskForward mask_forward_gpu(const Problem& p, const MaskSpec& s, const TokenLayout& layout, const AttnInputs& in,
                                GpuPath path, bool time, const GpuForwardOptions& opt = {});
/// The two masked backwards. sm80: backward_mask.cu, chapter 04's backward with the policy (sm_80
/// and newer; d = 128, bf16; either layout), the portable path. sm90a: hopper_backward.cu, chapter
/// 05's final backward with the policy (Hopper; d = 64 and 128, bf16 and fp16; the standard
/// layout, so not the document mask's packed rows).
enum class BwdKernel { sm80, sm90a };
const char* bwd_kernel_name(BwdKernel k);  ///< "sm80 backward", "sm90a backward"
/// Empty when `k` runs this problem and mask on `dev`; otherwise why not.
std::string mask_backward_unsupported(const Problem& p, const MaskSpec& s, BwdKernel k, const DeviceInfo& dev);

/// Backward on the GPU from the forward's O and LSE.
/// `deterministic`: dQ's adds in a fixed order (sm80: chapter 04's fixed-order dQ kernel; sm90a:
/// each query step's key blocks in ascending order), the same bits on every run.
GpuMaskBackward mask_backward_gpu(const Problem& p, const MaskSpec& s, const TokenLayout& layout, const AttnInputs& in,
                                  const std::vector<float>& o, const std::vector<float>& lse, bool time,
                                  bool deterministic = false, BwdKernel kernel = BwdKernel::sm80);

}  // namespace attn::ch06
