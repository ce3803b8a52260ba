#pragma once
/// \file named_barrier.cuh
/// \brief Named barriers: a barrier for a subset of a block's warps.
///
/// Wraps `bar.sync` and `bar.arrive`, PTX ISA "Parallel Synchronization and
/// Communication Instructions: bar, barrier". A thread block has sixteen hardware
/// barriers; id 0 is the one __syncthreads() uses. `bar.sync id, n` counts the
/// calling warp's 32 threads as arrived and waits until n threads have arrived;
/// `bar.arrive id, n` counts them and goes on without waiting. n (a multiple of 32)
/// is the same for every participant. CCCL's `cuda::ptx` has no form with a thread
/// count, so this is inline PTX.
///
/// Warp-specialised kernels use them where __syncthreads() would also stop the
/// producer: two consumer warpgroups taking turns (pingpong) sync on "my turn"
/// and arrive on "your turn":
///
///     consumer 0:  bar.sync(1, 256) ... issue ... bar.arrive(2, 256)
///     consumer 1:  bar.sync(2, 256) ... issue ... bar.arrive(1, 256)

namespace attn::hopper {

/// Waits until `threads` threads (this warp included) have arrived on barrier `id` (1-15).
__device__ __forceinline__ void named_barrier_sync(int id, int threads) {
  asm volatile("bar.sync %0, %1;" ::"r"(id), "r"(threads) : "memory");
}
/// Counts this warp as arrived on barrier `id` and returns at once.
__device__ __forceinline__ void named_barrier_arrive(int id, int threads) {
  asm volatile("bar.arrive %0, %1;" ::"r"(id), "r"(threads) : "memory");
}

}  // namespace attn::hopper
