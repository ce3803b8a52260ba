#pragma once
/// \file cp_async.cuh
/// \brief `cp.async.cg.shared.global` (16 bytes, zero-fill) and its group
///        bookkeeping `cp.async.commit_group` / `cp.async.wait_group` (sm_80+).
///
/// PTX ISA: "Data Movement and Conversion Instructions", instructions `cp.async`,
/// `cp.async.commit_group`, `cp.async.wait_group`. CCCL's `cuda::ptx` (CUDA 13.0)
/// wraps only the bulk (TMA) forms `cp.async.bulk*`, not this one, hence the
/// inline PTX.
///
/// A copy goes from global to shared memory without passing through registers;
/// the issuing thread goes on at once. Copies issued since the last commit form a
/// group; `cp_async_wait<N>()` blocks until at most N of this thread's groups are
/// still in flight. The wait covers only the calling thread's copies: a
/// `__syncthreads()` after it makes the whole tile visible to every thread.
///
///     issue K_{j+1} -> commit -> ... compute on V_j ... -> wait<0> -> __syncthreads -> use K_{j+1}

#include <cstdint>

namespace attn::cuda {

/// 16 bytes from `gmem` (16-byte aligned) to shared address `smem_addr`. With
/// `valid` false nothing is read (`gmem` must still be a valid address to form)
/// and the 16 bytes are zero-filled, which is how rows past the end of a sequence
/// become zeros. `.cg` caches in L2 only: the tile is reused from shared memory.
__device__ __forceinline__ void cp_async_16(uint32_t smem_addr, const void* gmem, bool valid) {
  const int src_bytes = valid ? 16 : 0;
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(smem_addr), "l"(gmem), "r"(src_bytes));
}

/// Closes the group of copies issued since the last commit.
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }

/// Waits until at most N of this thread's committed groups are still in flight.
template <int N>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N));
}

}  // namespace attn::cuda

namespace attn::cuda {

/// 4 bytes from `gmem` (4-byte aligned) to shared address `smem_addr`, zero-filled
/// when `valid` is false: `cp.async.ca` (cached in L1 as well), the only form that
/// copies fewer than 16 bytes. Chapter 07 loads the per-page scales of an 8-bit KV
/// cache with it, next to the 16-byte copies of the page's codes.
__device__ __forceinline__ void cp_async_4(uint32_t smem_addr, const void* gmem, bool valid) {
  const int src_bytes = valid ? 4 : 0;
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(smem_addr), "l"(gmem), "r"(src_bytes));
}

}  // namespace attn::cuda
