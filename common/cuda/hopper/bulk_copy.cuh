#pragma once
/// \file bulk_copy.cuh
/// \brief Hopper's non-tensor bulk copies: a contiguous run of bytes moved by the copy
///        engine, global -> shared (completing on an mbarrier) and shared -> global
///        *with an add* (`cp.reduce.async.bulk ... .add.f32`), plus the proxy fences
///        and the bulk-group waits they need, and the release/acquire counter that
///        orders the adds of several thread blocks.
///
/// Wraps, through CCCL's `cuda::ptx` (one PTX instruction per call), PTX ISA "Data
/// Movement and Conversion Instructions": cp.async.bulk (shared::cluster.global,
/// mbarrier::complete_tx::bytes), cp.reduce.async.bulk (global.shared::cta.bulk_group,
/// add.f32), cp.async.bulk.commit_group, cp.async.bulk.wait_group[.read], and
/// "Membar/Fence Instructions: fence.proxy.async". sm_90.
///
/// **Why a reduce-add.** Chapter 05's backward adds each key block's share of dQ_i
/// (a 64 x d fp32 tile) into one accumulator in global memory that every key block
/// of the sequence adds to. Element atomics (chapter 04) issue one instruction per
/// two floats from every thread; a bulk reduce-add hands the whole tile, staged in
/// shared memory, to the copy engine in one instruction from one thread, and the
/// adds happen in L2, next to the data:
///
///     threads:     write the tile to shared memory; fence_proxy_async_shared(); barrier
///     one thread:  bulk_reduce_add_f32(global, shared, bytes); bulk_commit();
///     before the tile is overwritten:  bulk_wait_read<0>()  (the engine has read it)
///     before the block exits, or before another block may rely on the sums:
///                  bulk_wait<0>()       (the adds are done)
///
/// The adds of one instruction are atomic element by element, so concurrent blocks
/// may add into the same tile; the order in which blocks add (and so the rounding of
/// the fp32 sum) is whatever the schedule makes it. ordered_wait() / ordered_release()
/// below fix it (deterministic mode).
///
/// **Proxies.** The copy engine is the *async proxy*; ordinary loads and stores are the
/// generic proxy. Shared memory written by threads must be fenced
/// (fence_proxy_async_shared) before the engine (or wgmma) reads it.

#include <cuda/atomic>
#include <cuda/ptx>

#include <cstdint>

namespace attn::hopper {

#if defined(__CUDACC__)
/// Copies `bytes` (a multiple of 16, both addresses 16-aligned) from global `src` to
/// shared `dst` and reports them to the mbarrier `bar` (complete_tx). One thread.
__device__ __forceinline__ void bulk_load(void* dst, const void* src, uint32_t bytes, uint64_t* bar) {
  ::cuda::ptx::cp_async_bulk(::cuda::ptx::space_cluster, ::cuda::ptx::space_global, dst, src, bytes, bar);
}

/// global[dst .. dst + bytes) += shared[src ..), fp32, element-wise atomic adds done by
/// the copy engine. `bytes` a multiple of 16, both addresses 16-aligned. One thread;
/// joins the current bulk group (bulk_commit() closes it).
__device__ __forceinline__ void bulk_reduce_add_f32(float* dst, const float* src, uint32_t bytes) {
  ::cuda::ptx::cp_reduce_async_bulk(::cuda::ptx::space_global, ::cuda::ptx::space_shared, ::cuda::ptx::op_add, dst,
                                    src, bytes);
}

/// Closes the group of bulk operations this thread issued since the last commit.
__device__ __forceinline__ void bulk_commit() { ::cuda::ptx::cp_async_bulk_commit_group(); }

/// Waits until at most N of this thread's bulk groups are still pending (complete: the
/// writes to global memory are done).
template <int N>
__device__ __forceinline__ void bulk_wait() {
  ::cuda::ptx::cp_async_bulk_wait_group(::cuda::ptx::n32_t<N>{});
}

/// Waits until at most N of this thread's bulk groups still *read* their shared-memory
/// source: the source may be overwritten, the writes may still be in flight.
template <int N>
__device__ __forceinline__ void bulk_wait_read() {
  ::cuda::ptx::cp_async_bulk_wait_group_read(::cuda::ptx::n32_t<N>{});
}

/// This thread's earlier shared-memory writes become visible to the async proxy (the
/// copy engine and wgmma's shared-memory operands).
__device__ __forceinline__ void fence_proxy_async_shared() { ::cuda::ptx::fence_proxy_async(::cuda::ptx::space_shared); }

/// The same for global memory: generic accesses before it are ordered with the async
/// proxy's after it (and the other way round).
__device__ __forceinline__ void fence_proxy_async_global() { ::cuda::ptx::fence_proxy_async(::cuda::ptx::space_global); }

/// Deterministic order of the adds into one tile: block `rank` waits until the counter
/// says every block before it has finished its add (acquire, device scope) ...
__device__ __forceinline__ void ordered_wait(int* counter, int rank) {
  ::cuda::atomic_ref<int, ::cuda::thread_scope_device> c(*counter);
  while (c.load(::cuda::memory_order_acquire) != rank) {
  }
  fence_proxy_async_global();  // the adds issued next come after what the counter published
}

/// ... and, once its own add is complete (bulk_wait<0>()), lets the next one go (release).
__device__ __forceinline__ void ordered_release(int* counter) {
  fence_proxy_async_global();  // the completed bulk adds before the release
  ::cuda::atomic_ref<int, ::cuda::thread_scope_device> c(*counter);
  c.fetch_add(1, ::cuda::memory_order_release);
}
#endif

}  // namespace attn::hopper
