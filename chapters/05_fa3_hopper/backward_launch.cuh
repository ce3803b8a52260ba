#pragma once
/// \file backward_launch.cuh
/// \brief How the backward's host side (backward_gpu.cu) hands a problem to one
///        backward step's main kernel: the kernel parameters, and the launcher
///        convention of the forward steps (step_launch.cuh): every steps/bN_*.cu defines
///        `attn::ch05::bN::prepare(const BwdStepArgs&)` returning a ready launch.

#include <cuda_runtime.h>

#include "common/problem.hpp"
#include "step_launch.cuh"  // PreparedStep

namespace attn::ch05 {

/// Everything the backward's kernels need besides the tensor maps of Q, K, V and dO.
struct Fa3BwdParams {
  const void* o = nullptr;     ///< [B][Hq][Nq][d], the forward's output (preprocess)
  const void* dout = nullptr;  ///< [B][Hq][Nq][d] (preprocess)
  const float* lse = nullptr;  ///< [B][Hq][Nq], natural log, -inf for empty rows (preprocess)
  float* lse2 = nullptr;       ///< [B Hq][Tr block_rows]: LSE log2(e), +inf where P must be 0 (empty and padding rows)
  float* delta = nullptr;      ///< [B Hq][Tr block_rows]: D_i = rowsum(dO_i o O_i), 0 on padding rows
  float* dq_accum = nullptr;   ///< fp32, the layout of dq_accum_index() (backward_tiles.hpp)
  int* dq_order = nullptr;     ///< [B Hq][Tr][2]: deterministic mode's counters (zeroed by the preprocess)
  void* dq = nullptr;          ///< [B][Hq][Nq][d], the input dtype
  void* dk = nullptr;          ///< [B][Hkv][Nk][d]
  void* dv = nullptr;          ///< [B][Hkv][Nk][d]
  int batch = 1, heads = 1, kv_heads = 1, nq = 0, nk = 0, d = 0;
  int n_qblocks = 0;           ///< Tr = ceil(nq / block_rows) (b12: rounded up to an even count)
  int block_rows = 64;         ///< rows of the walk's query blocks and the accumulator's tiles (b13-b15: 80)
  float scale = 0;             ///< tau
  float scale_log2 = 0;        ///< tau log2(e)
  bool causal = false;
  bool deterministic = false;  ///< add dQ tiles in the order of the key blocks
  bool dq_fragment_order = false;  ///< the accumulator's tiles in fragment order (b3), else by rows
  bool dq_whole_tiles = false;     ///< whole tiles in fragment order (b7, b12), not halves
  bool dq_transposed = false;      ///< halves in the transposed product's fragment order (b13-b15)
};

struct BwdStepArgs {
  Problem problem;
  const void* q = nullptr;  ///< device Q, K, V, dO in the problem's dtype
  const void* k = nullptr;
  const void* v = nullptr;
  const void* dout = nullptr;
  Fa3BwdParams params;
};

// One launcher per backward step (steps/bN_*.cu).
namespace b1 { PreparedStep prepare(const BwdStepArgs& a); }
namespace b2 { PreparedStep prepare(const BwdStepArgs& a); }
namespace b3 { PreparedStep prepare(const BwdStepArgs& a); }
namespace b4 { PreparedStep prepare(const BwdStepArgs& a); }
namespace b5 { PreparedStep prepare(const BwdStepArgs& a); }
namespace b6 { PreparedStep prepare(const BwdStepArgs& a); }
namespace b7 { PreparedStep prepare(const BwdStepArgs& a); }
namespace b8 { PreparedStep prepare(const BwdStepArgs& a); }
namespace b9 { PreparedStep prepare(const BwdStepArgs& a); }
namespace b10 { PreparedStep prepare(const BwdStepArgs& a); }
namespace b11 { PreparedStep prepare(const BwdStepArgs& a); }
namespace b12 { PreparedStep prepare(const BwdStepArgs& a); }
namespace b13 { PreparedStep prepare(const BwdStepArgs& a); }
namespace b14 { PreparedStep prepare(const BwdStepArgs& a); }
namespace b15 { PreparedStep prepare(const BwdStepArgs& a); }
namespace b16 { PreparedStep prepare(const BwdStepArgs& a); }
namespace b17 { PreparedStep prepare(const BwdStepArgs& a); }
// The final backward (steps/final_backward.cu).
namespace final_bwd { PreparedStep prepare(const BwdStepArgs& a); }

}  // namespace attn::ch05
