#pragma once
/// \file fa2_kernels.cuh
/// \brief What every chapter 04 kernel receives, and the launchers of each step.
///
/// Layout as everywhere in the project: Q, O [B][Hq][Nq][d]; K, V [B][Hkv][Nk][d];
/// LSE [B][Hq][Nq] in fp32 (natural log). d == dv in this chapter.

#include <cuda_runtime.h>

#include "common/dtype.hpp"

namespace attn::ch04 {

struct FwdParams {
  const void* q;
  const void* k;
  const void* v;
  void* o;
  float* lse;
  int batch, heads, kv_heads;  ///< query head h reads KV head h / (heads / kv_heads)
  int nq, nk, d;
  float scale;       ///< tau
  float scale_log2;  ///< tau * log2(e): the base-2 kernels fold it into one FFMA
  bool causal;       ///< bottom-right aligned: row i sees keys j <= i + (nk - nq)
};

/// The forward steps, steps/vN_*.cu (the main path v1-v6 and the final kernel, steps/final.cu)
/// and steps/lab/vN_*.cu (the lab's v7-v9, built with TUTORIAL_LAB=ON): each in its own
/// namespace (vN, final_fwd), with the same names in every step (kernel `fwd_kernel`, this
/// launcher), so that a step's diff against its predecessor shows only its idea. The launcher dispatches on dtype and
/// head dim; it returns false when the step has no kernel for them (the caller
/// reports "not supported"), and launches on stream `s` otherwise.
namespace v1 { bool launch(const FwdParams& p, DType t, cudaStream_t s); }
namespace v2 { bool launch(const FwdParams& p, DType t, cudaStream_t s); }
namespace v3 { bool launch(const FwdParams& p, DType t, cudaStream_t s); }
namespace v4 { bool launch(const FwdParams& p, DType t, cudaStream_t s); }
namespace v5 { bool launch(const FwdParams& p, DType t, cudaStream_t s); }
namespace v6 { bool launch(const FwdParams& p, DType t, cudaStream_t s); }
namespace v7 { bool launch(const FwdParams& p, DType t, cudaStream_t s); }
namespace v8 { bool launch(const FwdParams& p, DType t, cudaStream_t s); }
namespace v9 { bool launch(const FwdParams& p, DType t, cudaStream_t s); }
namespace final_fwd { bool launch(const FwdParams& p, DType t, cudaStream_t s); }

struct BwdParams {
  const void* q;
  const void* k;
  const void* v;
  const void* o;
  const void* dout;
  const float* lse;
  void* dq;
  void* dk;
  void* dv;
  float* dq_accum;  ///< [B][Hq][Nq][d] fp32, zeroed by the preprocess kernel
  float* delta;     ///< D_i = rowsum(dO o O), [B][Hq][Nq]
  int batch, heads, kv_heads;
  int nq, nk, d;
  float scale, scale_log2;
  bool causal;
};

/// FA2 backward: preprocess (D, zero dQ accumulator), the K/V-parallel main kernel
/// with fp32 atomics on dQ, then dQ converted. With `deterministic`, dQ comes from
/// a separate Q-parallel kernel with a fixed reduction order instead of atomics.
bool launch_backward(const BwdParams& p, DType t, bool deterministic, cudaStream_t s);

}  // namespace attn::ch04
