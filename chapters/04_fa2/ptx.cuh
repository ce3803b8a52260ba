#pragma once
/// \file ptx.cuh
/// \brief The handful of Ampere-era instructions chapter 04 is built from, each
///        wrapped once: `mma.sync` m16n8k16, `ldmatrix`, `cp.async`, and the
///        XOR swizzle of shared-memory tiles.
///
/// Fragment layouts of `mma.sync.m16n8k16` (bf16/fp16 inputs, fp32 accumulators),
/// for lane l of a warp, with g = l / 4 (the "group") and t = l % 4:
///
///     A (16 x 16, row major), 4 registers of 2 halves:
///         a0 = A[g    ][2t, 2t+1]    a2 = A[g    ][2t+8, 2t+9]
///         a1 = A[g + 8][2t, 2t+1]    a3 = A[g + 8][2t+8, 2t+9]
///     B (16 x 8, "column major": element (k, n) at n * ld + k), 2 registers:
///         b0 = B[2t, 2t+1  ][g]      b1 = B[2t+8, 2t+9][g]
///     C, D (16 x 8 fp32), 4 floats:
///         c0, c1 = C[g    ][2t, 2t+1]
///         c2, c3 = C[g + 8][2t, 2t+1]
///
///            n ->  0 1 | 2 3 | 4 5 | 6 7
///          row g : t=0 | t=1 | t=2 | t=3      (c0 c1)
///          row g+8: t=0 | t=1 | t=2 | t=3      (c2 c3)
///
/// The C layout of two neighbouring 16x8 tiles is exactly the A layout of one
/// 16x16 tile, which is why P = softmax(S) can stay in registers between the two
/// products of attention.

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstddef>
#include <cstdint>

namespace attn::ch04 {

/// Two 16-bit values packed in one 32-bit register, lower address first.
template <class T> __device__ __forceinline__ uint32_t pack2(float lo, float hi);
template <> __device__ __forceinline__ uint32_t pack2<__nv_bfloat16>(float lo, float hi) {
  __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
  return *reinterpret_cast<uint32_t*>(&v);
}
template <> __device__ __forceinline__ uint32_t pack2<__half>(float lo, float hi) {
  __half2 v = __floats2half2_rn(lo, hi);
  return *reinterpret_cast<uint32_t*>(&v);
}

/// D = A * B + D for one 16x8x16 tile (fp32 accumulators).
template <class T>
__device__ __forceinline__ void mma_16816(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1);

template <>
__device__ __forceinline__ void mma_16816<__nv_bfloat16>(float (&d)[4], const uint32_t (&a)[4], uint32_t b0,
                                                         uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
      "{%0,%1,%2,%3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

template <>
__device__ __forceinline__ void mma_16816<__half>(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
      "{%0,%1,%2,%3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

/// 2^x in one instruction (`ex2.approx`); 2^-inf = 0.
__device__ __forceinline__ float exp2_approx(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
  return y;
}

/// Shared-memory address as the 32-bit value ldmatrix and cp.async take.
__device__ __forceinline__ uint32_t smem_u32(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

/// Four 8x8 matrices of 16-bit elements: lanes 8k..8k+7 give the row addresses of
/// matrix k; lane l receives, of each matrix, row l/4, elements 2(l%4) and 2(l%4)+1.
__device__ __forceinline__ void ldmatrix_x4(uint32_t (&r)[4], uint32_t addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
}

/// The same, each matrix transposed on the way: lane l receives column l/4,
/// elements (rows) 2(l%4) and 2(l%4)+1.
__device__ __forceinline__ void ldmatrix_x4_trans(uint32_t (&r)[4], uint32_t addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
}

/// 16 bytes global -> shared without passing through registers (sm_80+). With
/// `valid` false nothing is read and the 16 bytes are zero-filled, which is how
/// rows past the end of a sequence become zeros.
__device__ __forceinline__ void cp_async_16(uint32_t smem_addr, const void* gmem, bool valid) {
  const int src_bytes = valid ? 16 : 0;
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(smem_addr), "l"(gmem), "r"(src_bytes));
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
/// Waits until at most N committed groups are still in flight.
template <int N>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N));
}

/// Index (in 16-byte chunks) of chunk `c` of row `r` in a tile whose rows are
/// `kChunks` chunks long, with the XOR swizzle: the chunk moves to c ^ (r % 8).
///
///     row r, logical chunk:   0 1 2 3 4 5 6 7      (8 chunks = 128 bytes = all 32 banks)
///     r = 0 stored at chunk:  0 1 2 3 4 5 6 7
///     r = 1 stored at chunk:  1 0 3 2 5 4 7 6
///     r = 2 stored at chunk:  2 3 0 1 6 7 4 5
///     ...
/// Eight rows read at the same logical chunk (what one ldmatrix phase does) land
/// in eight different 16-byte bank groups: no conflicts, no padding.
template <int kChunks>
__device__ __forceinline__ int swizzle(int r, int c) {
  static_assert(kChunks % 8 == 0, "the swizzle permutes groups of 8 chunks");
  return r * kChunks + (c ^ (r & 7));
}

/// A lane's ldmatrix addresses into a swizzled tile, precomputed. Each lane reads
/// rows whose index mod 8 never changes (fragments move in steps of 8 or 16 rows)
/// and chunks 2k + hi for a fixed parity bit hi, so the swizzle c ^ (r % 8) takes
/// only four values per lane: four base registers plus compile-time offsets reach
/// every fragment, instead of one register per fragment address.
template <int kChunks>
struct SwizzledLane {
  uint32_t base[4];
  /// `tile`: shared address of the tile; `row`: the row this lane points at when
  /// row_off = 0; `hi`: the lane's chunk parity bit.
  __device__ __forceinline__ SwizzledLane(uint32_t tile, int row, int hi) {
#pragma unroll
    for (int q = 0; q < 4; ++q) base[q] = tile + uint32_t(row * kChunks + ((2 * q + hi) ^ (row & 7))) * 16u;
  }
  /// Address of row (row + row_off), chunk (c2 + hi); row_off a multiple of 8 and c2
  /// even, both compile-time constants after unrolling.
  __device__ __forceinline__ uint32_t at(int row_off, int c2) const {
    return base[(c2 & 7) >> 1] + uint32_t(row_off * kChunks + (c2 & ~7)) * 16u;
  }
};

/// Rows [r0, r0 + ROWS) of a [n][D] tensor of 16-bit elements into a [ROWS][D]
/// shared tile the plain way: each thread loads 16 bytes into registers and stores
/// them, then the caller's barrier makes the tile visible. kSwizzled selects the
/// XOR-swizzled layout; otherwise rows are stored as they are in global memory.
/// Rows at or past n are zero.
template <int ROWS, int D, int kThreads, bool kSwizzled, class T>
__device__ __forceinline__ void copy_tile(T* tile, const T* g, int r0, int n) {
  constexpr int KC = D / 8;
#pragma unroll
  for (int k = 0; k < ROWS * KC / kThreads; ++k) {
    const int idx = threadIdx.x + k * kThreads, r = idx / KC, c = idx % KC;
    const uint4 v = r0 + r < n ? *reinterpret_cast<const uint4*>(g + std::size_t(r0 + r) * D + c * 8)
                               : make_uint4(0u, 0u, 0u, 0u);
    *reinterpret_cast<uint4*>(tile + (kSwizzled ? swizzle<KC>(r, c) : r * KC + c) * 8) = v;
  }
}

/// Rows [r0, r0 + ROWS) of a [n][D] tensor of 16-bit elements into a swizzled
/// [ROWS][D] shared tile at `tile`, 16 bytes per cp.async, by all kThreads threads;
/// rows at or past n are zero-filled. Thread x always copies chunk x % (D/8) of
/// rows x / (D/8) + k * RS, so its source and destination advance by constant
/// strides (immediate offsets, no per-chunk address registers).
template <int ROWS, int D, int kThreads, class T>
__device__ __forceinline__ void load_tile(uint32_t tile, const T* g, int r0, int n) {
  constexpr int KC = D / 8, RS = kThreads / KC;  // chunks per row; rows one pass covers
  static_assert(RS % 8 == 0 && ROWS % RS == 0, "whole passes; the swizzle repeats every 8 rows");
  const int rb = threadIdx.x / KC, c = threadIdx.x % KC;
  const uint32_t dst = tile + uint32_t(rb * KC + (c ^ (rb & 7))) * 16u;
  const T* src = g + std::size_t(r0 + rb) * D + c * 8;
#pragma unroll
  for (int k = 0; k < ROWS / RS; ++k) {
    const bool valid = r0 + rb + k * RS < n;
    cp_async_16(dst + uint32_t(k * RS * KC) * 16u, valid ? src + std::size_t(k) * RS * D : g, valid);
  }
}

}  // namespace attn::ch04
