#pragma once
/// \file barrier_unaligned.cuh
/// \brief A named barrier that different instructions may meet at: `barrier.sync` without
///        `.aligned`.
///
/// Wraps `barrier.sync id, n`, PTX ISA "Parallel Synchronization and Communication
/// Instructions: bar, barrier" (PTX 6.0, sm_70+). `bar.sync` (named_barrier.cuh) is
/// `barrier.sync.aligned`: "all threads in CTA will execute the same barrier instruction".
/// Two warpgroups that wait for each other at *different* places of the code, each with
/// its own `bar.sync` on the same barrier, break that promise (compute-sanitizer's synccheck
/// reports "Divergent thread(s) in block"); a producer's `bar.arrive` against a consumer's
/// `bar.sync` does not (different forms of the instruction may meet). Without `.aligned`
/// every thread may reach the barrier through an instruction of its own, and a warp may
/// even arrive divergent, at the price of the aligned form's faster path.
///
///     warpgroup 1:  ... loads of P_j ... P_j V_j ...  barrier.sync 2, 256   ("P read")
///     warpgroup 0:  ... softmax of block j + 1 ...    barrier.sync 2, 256   then P_{j+1} stores

namespace attn::hopper {

/// Waits until `threads` threads have arrived on barrier `id` (1-15), through this or any
/// other barrier instruction on `id`.
__device__ __forceinline__ void named_barrier_sync_unaligned(int id, int threads) {
  asm volatile("barrier.sync %0, %1;" ::"r"(id), "r"(threads) : "memory");
}

}  // namespace attn::hopper
