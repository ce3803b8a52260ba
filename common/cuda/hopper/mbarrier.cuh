#pragma once
/// \file mbarrier.cuh
/// \brief Hopper's transaction mbarriers, through CCCL's `cuda::ptx` (one PTX
///        instruction per call), and the phase bookkeeping of a ring of stages.
///
/// Wraps, PTX ISA "Parallel Synchronization and Communication Instructions: mbarrier"
/// (mbarrier.init, mbarrier.arrive, mbarrier.arrive.expect_tx, mbarrier.try_wait.parity)
/// and "Membar/Fence Instructions" (fence.mbarrier_init). sm_90.
///
/// **mbarrier: phases and parity.** An mbarrier is a 64-bit word in shared memory
/// with an expected arrival count, a pending transaction-byte count, and a *phase*.
/// A phase completes when every expected thread has arrived *and* every expected
/// byte has landed; the barrier then starts the next phase by itself. A waiter does
/// not ask "is it done?" but "has the phase with parity P completed?":
///
///     try_wait.parity(P)  is true  when the barrier's current phase has parity != P
///
/// A freshly initialised barrier is in phase 0, so a wait for parity 0 blocks until
/// the first completion, and a wait for parity 1 passes at once (it reads as "the
/// phase before phase 0 completed"). A ring of S stages uses this as follows:
///
///     iteration j:  stage s = j % S,   round r = j / S,   phase bit = r & 1
///     consumer:  wait(full[s],  r & 1)      -- the r-th filling of stage s has landed
///     producer:  wait(empty[s], (r & 1) ^ 1) -- the (r-1)-th emptying has happened;
///                                            for r = 0 this passes at once: the ring starts empty
///
/// One bit suffices because producer and consumer can never be more than one phase
/// apart on the same barrier: the other barrier of the pair holds them back.
///
/// **Why cuda::ptx and not cuda::barrier.** cuda::barrier's arrive-then-wait-on-token
/// model fits threads that both arrive and wait; a ring's consumers wait on a phase
/// they never arrived on, which is the parity form above, so these wrappers call the
/// `cuda::ptx::mbarrier_*` functions (one PTX instruction each) directly.

#include <cuda/ptx>

#include <cstdint>

namespace attn::hopper {

/// Initialises an mbarrier for `count` arrivals per phase. One thread, before any use;
/// follow with mbarrier_init_fence() and a __syncthreads().
__device__ __forceinline__ void mbarrier_init(uint64_t* bar, uint32_t count) { ::cuda::ptx::mbarrier_init(bar, count); }

/// Makes initialised barriers visible to the copy engine (the async proxy).
__device__ __forceinline__ void mbarrier_init_fence() { ::cuda::ptx::fence_mbarrier_init(::cuda::ptx::sem_release, ::cuda::ptx::scope_cluster); }

/// One arrival (release semantics: this thread's earlier accesses happen before the phase completes).
__device__ __forceinline__ void mbarrier_arrive(uint64_t* bar) { (void)::cuda::ptx::mbarrier_arrive(bar); }

/// One arrival that also announces `bytes` more bytes the copy engine will deliver.
__device__ __forceinline__ void mbarrier_arrive_expect_tx(uint64_t* bar, uint32_t bytes) {
  (void)::cuda::ptx::mbarrier_arrive_expect_tx(::cuda::ptx::sem_release, ::cuda::ptx::scope_cta, ::cuda::ptx::space_shared,
                                             bar, bytes);
}

/// Blocks until the phase with parity `parity` has completed (acquire semantics).
/// try_wait itself suspends the thread for a while before it reports "not yet", so
/// the loop does not hammer shared memory. (A wrong parity or a missing arrival hangs
/// here forever; the tests run under a timeout. A hang detector with a timer and a
/// trap in this loop costs the consumers' wgmma pipeline its registers, so there is none.)
__device__ __forceinline__ void mbarrier_wait(uint64_t* bar, uint32_t parity) {
  while (!::cuda::ptx::mbarrier_try_wait_parity(bar, parity)) {
  }
}

/// Position in a ring of kStages stages: which stage, and the phase bit of its round.
template <int kStages>
struct RingState {
  int stage = 0;
  uint32_t phase = 0;
  __device__ __forceinline__ void advance() {
    if (++stage == kStages) {
      stage = 0;
      phase ^= 1u;
    }
  }
};

}  // namespace attn::hopper
