#pragma once
/// \file roles.cuh
/// \brief Fresh reads of the special registers, for warp-specialised kernels.
///
/// Wraps `mov.u32 %r, %tid.x` (and %ctaid, %nctaid), PTX ISA "Special Registers".
/// A warp-specialised kernel splits into a producer branch and a consumer branch that
/// re-divide the registers with setmaxnreg (setmaxnreg.cuh). Any value computed
/// before the split and used after it must survive the producer's 24-register
/// budget, and ptxas then squeezes the consumers' wgmma pipeline (it reports
/// "wgmma ... serialized due to insufficient register resources" and spills). So each
/// role computes what it needs from scratch: these read the special registers again
/// (the `volatile` keeps the compiler from reusing a value it read before the split,
/// which CCCL's `cuda::ptx::get_sreg_*` would allow).

namespace attn::hopper {

/// threadIdx.x, read anew.
__device__ __forceinline__ int fresh_thread_index() {
  int v;
  asm volatile("mov.u32 %0, %%tid.x;" : "=r"(v));
  return v;
}
/// blockIdx.x, read anew.
__device__ __forceinline__ int fresh_block_index_x() {
  int v;
  asm volatile("mov.u32 %0, %%ctaid.x;" : "=r"(v));
  return v;
}
/// blockIdx.y, read anew.
__device__ __forceinline__ int fresh_block_index_y() {
  int v;
  asm volatile("mov.u32 %0, %%ctaid.y;" : "=r"(v));
  return v;
}
/// gridDim.x, read anew.
__device__ __forceinline__ int fresh_grid_size_x() {
  int v;
  asm volatile("mov.u32 %0, %%nctaid.x;" : "=r"(v));
  return v;
}
/// A zero the compiler cannot see through: `p + fresh_zero()` is an address it must
/// compute again rather than keep alive across the role split.
__device__ __forceinline__ int fresh_zero() {
  int zero;
  asm volatile("mov.u32 %0, 0;" : "=r"(zero));
  return zero;
}

}  // namespace attn::hopper
