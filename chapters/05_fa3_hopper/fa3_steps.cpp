// Chapter 05's step list, shared by the CPU-only and the CUDA builds.
#include <string>

#include "fa3_gpu.hpp"

namespace attn::ch05 {

const char* step_name(Step s) {
  switch (s) {
    case Step::v1_tma: return "v1 TMA + mbarrier ring";
    case Step::v2_wgmma: return "v2 wgmma";
    case Step::v3_warp_specialized: return "v3 warp-specialised";
    case Step::v4_pingpong: return "v4 pingpong";
    case Step::v5_intra_overlap: return "v5 intra-warpgroup overlap";
    case Step::v6_masked_first: return "v6 masked blocks first";
    case Step::v7_persistent: return "v7 persistent blocks";
    case Step::v8_head_dims: return "v8 every head dim";
    case Step::v9_fp8: return "v9 fp8 e4m3";
    case Step::v10_tile_sizes: return "v10 key blocks for the tensor cores";
    case Step::v11_two_pipe_exp: return "v11 exponentials on two pipes";
    case Step::v12_fp8_two_pipes: return "v12 fp8 softmax on two pipes";
    case Step::v13_dynamic_tiles: return "v13 dynamic tile scheduler";
    case Step::v14_three_consumers: return "v14 three consumer warpgroups";
    case Step::v15_fp8_lazy_rescale: return "v15 fp8 lazy rescaling";
    case Step::v16_causal_grid: return "v16 causal tiles as a grid";
    case Step::v17_causal_key_blocks: return "v17 causal key blocks";
    case Step::v18_causal_blocks_registers: return "v18 causal key blocks, every head dim";
    case Step::v19_causal_grid_wide_blocks: return "v19 causal grid, wide blocks";
    case Step::v20_exp_one_in_eight: return "v20 one exponential in eight on FMA";
    case Step::v21_softmax_chains: return "v21 row reductions in four chains";
    case Step::v22_three_consumers_chains: return "v22 three consumers, reductions in chains";
    case Step::v23_descriptors_by_addition: return "v23 descriptors by addition";
    case Step::v24_causal_l2_sections: return "v24 causal tiles in L2 sections";
    case Step::v25_three_consumers_descriptors: return "v25 three consumers, descriptors by addition";
    case Step::v26_fp8_wide_blocks_d256: return "v26 fp8 key blocks of 128 at d = 256";
    case Step::v27_fp8_wide_blocks_d128: return "v27 fp8 key blocks of 192 at d = 128";
    case Step::v28_three_consumers_mufu_exp: return "v28 three consumers, every exponential on MUFU";
    case Step::v29_fp8_mufu_exp_d256: return "v29 fp8 d = 256, every exponential on MUFU";
    case Step::v30_final_causal_grid: return "v30 final, d = 128 causal as v6's grid";
    case Step::v31_final_causal_grid_bc128: return "v31 v30 with key blocks of 128";
    case Step::final_fwd: return "final forward";
    case Step::final_fp8: return "final fp8 forward";
  }
  return "?";
}

bool parse_step(const std::string& text, Step* out) {
  if (text == "final" || text == "final-fp8") {
    *out = text == "final" ? Step::final_fwd : Step::final_fp8;
    return true;
  }
  std::string t = text;
  if (!t.empty() && (t[0] == 'v' || t[0] == 'V')) t = t.substr(1);
  if (t.empty() || t.size() > 2 || t[0] < '1' || t[0] > '9' || (t.size() == 2 && (t[1] < '0' || t[1] > '9')))
    return false;
  const int n = std::stoi(t);
  if (n >= int(Step::final_fwd)) return false;  // the final kernels go by name
  for (Step s : kLabSteps)
    if (int(s) == n) {
      *out = s;
      return true;
    }
  for (Step s : kMainSteps)
    if (int(s) == n) {
      *out = s;
      return true;
    }
  return false;
}

bool step_supports(Step s, const Problem& p, std::string* why) {
  auto no = [&](const std::string& w) {
    if (why) *why = std::string(step_name(s)) + ": " + w;
    return false;
  };
  if (p.dtype != DType::bf16 && p.dtype != DType::f16) return no("needs bf16 or fp16 inputs");
  if (p.d != p.dv) return no("needs d == dv");
  if (!step_built(s)) return no("a lab step: this build has no lab (configure with -DTUTORIAL_LAB=ON)");
  const int s_index = int(s);
  if (s_index >= 2 && s_index <= 7 && p.d != 128)
    return no("built for d = 128 only (steps 1 and 8-13 take d = 64, 128, 256)");
  if (p.d != 64 && p.d != 128 && p.d != 256) return no("built for d = 64, 128 and 256");
  if (s == Step::v14_three_consumers && p.d != 64) return no("built for d = 64 only (three consumer warpgroups)");
  if (s == Step::v17_causal_key_blocks && p.d != 64) return no("built for d = 64 only (its other kernels would be v11's)");
  if (s == Step::v20_exp_one_in_eight && p.d != 64) return no("built for d = 64 only (as v17)");
  if (s == Step::v22_three_consumers_chains && p.d != 64) return no("built for d = 64 only (as v14)");
  if (s == Step::v25_three_consumers_descriptors && p.d != 64) return no("built for d = 64 only (as v14)");
  if (s == Step::v26_fp8_wide_blocks_d256 && p.d != 256) return no("built for d = 256 only (its other kernels would be v15's)");
  if (s == Step::v27_fp8_wide_blocks_d128 && p.d != 128) return no("built for d = 128 only (its other kernels would be v15's)");
  if (s == Step::v28_three_consumers_mufu_exp && p.d != 64) return no("built for d = 64 only (as v14)");
  if (s == Step::v29_fp8_mufu_exp_d256 && p.d != 256) return no("built for d = 256 only (as v26)");
  if ((s == Step::v30_final_causal_grid || s == Step::v31_final_causal_grid_bc128) && !(p.d == 128 && p.causal))
    return no("built for d = 128 causal only (elsewhere it is the final kernel)");
  if (s == Step::v19_causal_grid_wide_blocks && p.d == 64) return no("built for d = 128 and 256 (the grid lost at d = 64: v16)");
  return true;
}

}  // namespace attn::ch05
