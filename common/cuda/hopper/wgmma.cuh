#pragma once
/// \file wgmma.cuh
/// \brief Hopper's warpgroup MMA (`wgmma.mma_async`, sm_90a), wrapped once: the
///        shared-memory matrix descriptor, the fence / commit / wait protocol, and
///        one call per operand form. No library exposes wgmma, so this is inline PTX.
///
/// Wraps PTX ISA "Warpgroup Level Matrix Multiply-Accumulate Instructions":
/// wgmma.mma_async (the wrappers generated into wgmma_ops.cuh by gen_wgmma_ops.py),
/// wgmma.fence, wgmma.commit_group, wgmma.wait_group, and the "Matrix Descriptor
/// Format" of its shared-memory operands. sm_90a.
///
/// **What one instruction does.** The four warps of a *warpgroup* (128 threads,
/// warps 4k..4k+3) together compute
/// \f[ D_{64\times N} \mathrel{+}= A_{64\times K}\, B_{K\times N} \f]
/// with K = 16 for 16-bit inputs (K = 32 for fp8: always 32 bytes per row) and
/// N a multiple of 8 up to 256. B always comes from shared memory, through a
/// 64-bit *descriptor*; A comes from shared memory too (form SS) or from
/// registers (form RS). D stays in registers, fp32, N/2 of them per thread:
///
///     thread (warp w of the group, lane l):  rows  r0 = 16 w + l / 4,  r1 = r0 + 8
///     d[4c + 0], d[4c + 1] = D(r0, 8c + 2 (l % 4) + {0, 1})      c = 0 .. N/8 - 1
///     d[4c + 2], d[4c + 3] = D(r1, 8c + 2 (l % 4) + {0, 1})
///
/// The same per-warp layout as `mma.sync.m16n8k16`'s accumulator: a quad of four
/// lanes holds two full rows, which is what the softmax's row reductions use.
///
/// **A from registers (16-bit), one k16 slice:** four `.b32` registers, each two
/// elements, `a[0] = A(r0, 2t..2t+1)`, `a[1] = A(r1, 2t..)`, `a[2] = A(r0, 8+2t..)`,
/// `a[3] = A(r1, 8+2t..)` with t = l % 4. Comparing with D: the registers of k-slice
/// kk are the accumulators `d[8kk .. 8kk+7]` taken in pairs, so P = softmax(S)
/// goes from the S accumulator into the PV product without touching memory.
/// (For fp8 each register holds four elements and the columns do not line up;
/// chapter 05's fp8 step explains how V's layout absorbs the difference.)
///
/// **The protocol.** wgmma is asynchronous:
///
///     wgmma_fence();                 // registers written by ordinary code are ready
///     WgmmaSS<T, N>::mma(...) x k    // issue; returns at once
///     wgmma_commit();                // close a group
///     ... other work ...
///     wgmma_wait<n>();               // all but the n most recent groups are done
///
/// Between issue and wait the accumulators and A registers belong to the tensor
/// core: reading or writing them is a race (the compiler then serialises the MMAs
/// and says so in a "wgmma ... serialized" advisory, which chapter 05's build treats
/// as a defect). fence_operand() keeps the compiler from moving register accesses
/// across those points.

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include <cstdint>

#include "common/cuda/smem_addr.cuh"

namespace attn::hopper {

// ----------------------------------------------------------------------------- descriptors
//
// **The 128-byte swizzle.** TMA writes a tile whose rows are 128 bytes (64 bf16, or
// 128 fp8) in shared memory with its 16-byte chunks permuted inside each group of
// 8 rows (a 1024-byte *atom*, which must start 1024-aligned):
//
//     byte offset of (row r, byte b of the row) = r * 128 + ((b / 16) ^ (r % 8)) * 16 + b % 16
//
//              chunk: 0   1   2   3   4   5   6   7        (16 bytes = 8 bf16 each)
//     row 0          0   1   2   3   4   5   6   7
//     row 1          1   0   3   2   5   4   7   6
//     row 2          2   3   0   1   6   7   4   5         stored position of each logical
//     ...                                                   chunk: c ^ (r % 8)
//     row 7          7   6   5   4   3   2   1   0
//
// Eight rows reading the same logical chunk (what an MMA operand fetch does) hit
// eight different bank groups: no bank conflicts, and no padding. The tensor core
// applies the same XOR when it reads through a descriptor whose mode says 128B, so
// TMA and wgmma agree without either side computing an address. A 64-byte swizzle
// (rows of 64 bytes: fp8 with d = 64) is the same with 4 chunks and 512-byte atoms.
//
// **The descriptor** (PTX ISA "Matrix Descriptor Format"), all offsets in 16-byte units:
//
//     bits  0-13  start address            bits 32-45  stride byte offset (SBO)
//     bits 16-29  leading byte offset (LBO)  bits 49-51  base offset (0: atoms 1024-aligned)
//     bits 62-63  swizzle: 1 = 128B, 2 = 64B
//
// K-major operand (K contiguous: Q, K, and fp8's V^T). Rows of the operand are
// rows of the tile, SBO = distance between consecutive 8-row groups = 8 * row bytes;
// LBO is unused. The k-th K-step of an instruction (32 bytes of every row) starts
// 32 k bytes further into the row: the hardware swizzles the final address, so
// advancing the start address inside the 128-byte row is exact.
//
// MN-major operand (N contiguous: the 16-bit V of P V, stored [keys][d]). The
// K-steps walk down the rows (16 keys = 2 atoms = 2048 bytes per step); SBO =
// distance between 8-key groups = 1024; LBO = distance between 64-column slabs
// of d, which TMA loaded as separate boxes.

/// Swizzle mode of a tile whose rows are `row_bytes` long (64 or 128).
__host__ __device__ constexpr uint64_t swizzle_mode(int row_bytes) { return row_bytes == 128 ? 1 : 2; }

using attn::cuda::smem_u32;  // common/cuda/smem_addr.cuh

/// Descriptor of an operand in shared memory starting at `p`.
__device__ __forceinline__ uint64_t make_desc(const void* p, uint32_t lbo_bytes, uint32_t sbo_bytes,
                                              int row_bytes) {
  const uint32_t a = smem_u32(p);
  uint64_t d = 0;
  d |= uint64_t((a & 0x3FFFF) >> 4);
  d |= uint64_t((lbo_bytes & 0x3FFFF) >> 4) << 16;
  d |= uint64_t((sbo_bytes & 0x3FFFF) >> 4) << 32;
  d |= swizzle_mode(row_bytes) << 62;
  return d;
}

/// K-major tile with `row_bytes`-byte swizzled rows.
__device__ __forceinline__ uint64_t desc_k_major(const void* p, int row_bytes) {
  return make_desc(p, 16, 8 * row_bytes, row_bytes);
}

/// MN-major tile (128-byte swizzle) whose 64-column slabs are `slab_bytes` apart.
__device__ __forceinline__ uint64_t desc_mn_major(const void* p, uint32_t slab_bytes) {
  return make_desc(p, slab_bytes, 1024, 128);
}

// ----------------------------------------------------------------------------- protocol

/// Orders this thread's earlier register writes (accumulators, A fragments) before
/// the wgmma that follows; required before the first MMA of a batch.
__device__ __forceinline__ void wgmma_fence() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }

/// Closes the group of every wgmma issued since the last commit.
__device__ __forceinline__ void wgmma_commit() { asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory"); }

/// Waits until at most `N` committed groups are still in flight (groups finish in order).
template <int N>
__device__ __forceinline__ void wgmma_wait() {
  asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory");
}

/// A compiler barrier on registers: the value must be in `r` here, and nothing that
/// reads or writes it moves across this point. Used around the issue and the wait.
template <int N>
__device__ __forceinline__ void fence_operand(float (&r)[N]) {
#pragma unroll
  for (int i = 0; i < N; ++i) asm volatile("" : "+f"(r[i])::"memory");
}
template <int N>
__device__ __forceinline__ void fence_operand(uint32_t (&r)[N]) {
#pragma unroll
  for (int i = 0; i < N; ++i) asm volatile("" : "+r"(r[i])::"memory");
}

// ----------------------------------------------------------------------------- the instructions

/// D(64 x N) (+)= A(64 x K) B(K x N), A and B from shared memory, both K-major.
/// `scale_d` = 0 overwrites D (the first K-step of a product), 1 accumulates.
template <class T, int N> struct WgmmaSS;
/// D(64 x N) (+)= A(64 x K) B(K x N), A from registers. 16-bit B is N-major
/// (transposed); fp8 B is K-major (fp8 wgmma has no transpose).
template <class T, int N> struct WgmmaRS;
/// D(64 x N) (+)= A(64 x K) B(K x N), A and B from shared memory, both MN-major
/// (16-bit only): A stored [K][M] and B stored [K][N], M and N contiguous. The
/// backward's dQ = dS K_j reads dS from dS^T ([keys][queries]) and K_j as stored.
/// Descriptors: desc_mn_major() for both (K-step kk starts 16 kk rows down).
template <class T, int N> struct WgmmaSSMN;
/// D(64 x N) (+)= A(64 x K) B(K x N), A and B from shared memory, A MN-major (stored [K][M])
/// and B K-major (16-bit only). The backward's b14: dQ^T = K_j^T dS^T with K_j as stored
/// and dS stored [queries][keys]. Descriptors: desc_mn_major() for A, desc_k_major() for B.
template <class T, int N> struct WgmmaSSTA;

#include "wgmma_ops.cuh"  // the generated wrappers, next to this file

}  // namespace attn::hopper
