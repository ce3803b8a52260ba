#pragma once
/// \file mma_sync.cuh
/// \brief Warp-level tensor-core product `mma.sync.aligned.m16n8k16.row.col`
///        with bf16 or fp16 inputs and fp32 accumulators (sm_80+), and `pack2`,
///        which turns two fp32 accumulators into one 16-bit-pair input register.
///
/// PTX ISA: "Warp Level Matrix Multiply-Accumulate Instructions", instruction
/// `mma` (section "Matrix Fragments for mma.m16n8k16 with floating point type"
/// gives the layouts below). CCCL's `cuda::ptx` (CUDA 13.0) has no `mma.sync`
/// wrapper, hence the inline PTX.
///
/// Fragment layouts for lane l of a warp, with g = l / 4 (the "group") and
/// t = l % 4 (the thread in the group):
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
/// 16x16 tile (pack2 of c0,c1 of tile 2k is a0, of c2,c3 a1; of tile 2k+1, a2 and
/// a3), which is why P = softmax(S) can stay in registers between the two products
/// of attention. The 4 lanes of a quad (same g) hold one row: a row reduction is
/// two `__shfl_xor_sync` steps (offsets 1 and 2).

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>

namespace attn::cuda {

/// Two 16-bit values packed in one 32-bit register, lower address (column) first,
/// rounded to nearest.
template <class T> __device__ __forceinline__ uint32_t pack2(float lo, float hi);
template <> __device__ __forceinline__ uint32_t pack2<__nv_bfloat16>(float lo, float hi) {
  __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
  return *reinterpret_cast<uint32_t*>(&v);
}
template <> __device__ __forceinline__ uint32_t pack2<__half>(float lo, float hi) {
  __half2 v = __floats2half2_rn(lo, hi);
  return *reinterpret_cast<uint32_t*>(&v);
}

/// D = A * B + D for one 16x8x16 tile, T = __nv_bfloat16 or __half, fp32 accumulators.
/// `a`: the A fragment, `b0, b1`: the B fragment, `d`: accumulators (layouts above).
template <class T>
__device__ __forceinline__ void mma_m16n8k16(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1);

template <>
__device__ __forceinline__ void mma_m16n8k16<__nv_bfloat16>(float (&d)[4], const uint32_t (&a)[4], uint32_t b0,
                                                            uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
      "{%0,%1,%2,%3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

template <>
__device__ __forceinline__ void mma_m16n8k16<__half>(float (&d)[4], const uint32_t (&a)[4], uint32_t b0,
                                                     uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
      "{%0,%1,%2,%3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

}  // namespace attn::cuda
