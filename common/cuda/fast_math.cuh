#pragma once
/// \file fast_math.cuh
/// \brief `ex2.approx.ftz.f32`: 2^x in one MUFU instruction.
///
/// PTX ISA: "Floating Point Instructions", instruction `ex2`. The approximation
/// has a maximum relative error of about 2^-22 over the full range; `.ftz` flushes
/// subnormal inputs and results to zero. 2^-inf = +0, which is what makes a
/// masked score (-inf) contribute exactly nothing. Softmax kernels fold log2(e)
/// into the softmax scale so that e^(x - m) = 2^(x log2 e - m log2 e) costs one
/// FFMA and one ex2 (common/online_softmax.hpp, `Base2`). CCCL's `cuda::ptx`
/// (CUDA 13.0) has no `ex2` wrapper, and `exp2f` adds range handling around
/// the same instruction, hence the inline PTX.

namespace attn::cuda {

/// 2^x, approximately (see above); 2^-inf = 0.
__device__ __forceinline__ float exp2_approx(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
  return y;
}

/// tanh(x), approximately: `tanh.approx.f32` (PTX ISA, "Floating Point Instructions",
/// sm_75+), one MUFU instruction with a maximum relative error of about 2^-11, where
/// `tanhf` is a branchy sequence of a dozen instructions. Used by chapter 06's softcap
/// (cap tanh(s / cap) on every score): an absolute error of at most cap 2^-11 |tanh| on a
/// score, smaller than the bf16 rounding of the P it becomes.
__device__ __forceinline__ float tanh_approx(float x) {
  float y;
  asm("tanh.approx.f32 %0, %1;\n" : "=f"(y) : "f"(x));
  return y;
}

}  // namespace attn::cuda
