#pragma once
/// \file step_launch.cuh
/// \brief The one launcher convention of chapter 05: how the host side (fa3_gpu.cu)
///        hands a problem to one step's kernel. Device pointers and parameters in, a
///        ready-to-call launch out.
///
/// Every step file steps/vN_idea.cu defines its kernel as `kernel` and its launcher as
/// `attn::ch05::vN::prepare(const StepArgs&)`, the same names in every step, so that a
/// diff between two steps shows the idea and not a rename. prepare() builds the step's
/// tensor maps (their boxes are the step's tiles) and sets the kernel's attributes
/// once, so that a timed launch is nothing but the kernel launch.

#include <cuda_runtime.h>

#include <functional>

#include "common/problem.hpp"
#include "fa3_common.cuh"

namespace attn::ch05 {

struct StepArgs {
  Problem problem;
  const void* q = nullptr;  ///< device Q, K, V in the problem's dtype (fp8 step: Q8, K8, V8^T)
  const void* k = nullptr;
  const void* v = nullptr;
  Fa3Params params;         ///< o, lse and the sizes filled in; scale pointers for fp8
  int sms = 132;            ///< multiprocessors, for the persistent grid
  int nk_pad = 0;           ///< fp8: row pitch of V^T in keys (a multiple of 16)
};

struct PreparedStep {
  std::function<void()> launch;  ///< enqueues the kernel on the default stream
  int grid = 0;
  int smem_bytes = 0;
};

// One launcher per step (steps/vN_*.cu on the main path, steps/lab/vN_*.cu in the lab,
// built with TUTORIAL_LAB=ON only). Each throws UsageError for a problem its
// kernels were not built for (fa3_gpu.hpp: step_supports() says which).
namespace v1 { PreparedStep prepare(const StepArgs& a); }
namespace v2 { PreparedStep prepare(const StepArgs& a); }
namespace v3 { PreparedStep prepare(const StepArgs& a); }
namespace v4 { PreparedStep prepare(const StepArgs& a); }
namespace v5 { PreparedStep prepare(const StepArgs& a); }
namespace v6 { PreparedStep prepare(const StepArgs& a); }
namespace v7 { PreparedStep prepare(const StepArgs& a); }
namespace v8 { PreparedStep prepare(const StepArgs& a); }
namespace v9 { PreparedStep prepare(const StepArgs& a); }
namespace v10 { PreparedStep prepare(const StepArgs& a); }
namespace v11 { PreparedStep prepare(const StepArgs& a); }
namespace v12 { PreparedStep prepare(const StepArgs& a); }
namespace v13 { PreparedStep prepare(const StepArgs& a); }
namespace v14 { PreparedStep prepare(const StepArgs& a); }
namespace v15 { PreparedStep prepare(const StepArgs& a); }
namespace v16 { PreparedStep prepare(const StepArgs& a); }
namespace v17 { PreparedStep prepare(const StepArgs& a); }
namespace v18 { PreparedStep prepare(const StepArgs& a); }
namespace v19 { PreparedStep prepare(const StepArgs& a); }
namespace v20 { PreparedStep prepare(const StepArgs& a); }
namespace v21 { PreparedStep prepare(const StepArgs& a); }
namespace v22 { PreparedStep prepare(const StepArgs& a); }
namespace v23 { PreparedStep prepare(const StepArgs& a); }
namespace v24 { PreparedStep prepare(const StepArgs& a); }
namespace v25 { PreparedStep prepare(const StepArgs& a); }
namespace v26 { PreparedStep prepare(const StepArgs& a); }
namespace v27 { PreparedStep prepare(const StepArgs& a); }
namespace v28 { PreparedStep prepare(const StepArgs& a); }
namespace v29 { PreparedStep prepare(const StepArgs& a); }
namespace v30 { PreparedStep prepare(const StepArgs& a); }
namespace v31 { PreparedStep prepare(const StepArgs& a); }
// The final kernels (steps/final.cu, steps/final_fp8.cu).
namespace final_fwd { PreparedStep prepare(const StepArgs& a); }
namespace final_fp8 { PreparedStep prepare(const StepArgs& a); }

}  // namespace attn::ch05
