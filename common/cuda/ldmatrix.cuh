#pragma once
/// \file ldmatrix.cuh
/// \brief `ldmatrix.sync.aligned.m8n8.x4(.trans).shared.b16`: four 8x8 matrices
///        of 16-bit elements from shared memory straight into mma fragments.
///
/// PTX ISA: "Warp Level Matrix Multiply-Accumulate Instructions", instruction
/// `ldmatrix` (sm_75+). CCCL's `cuda::ptx` (CUDA 13.0) has no `ldmatrix` wrapper,
/// hence the inline PTX.
///
/// Lanes 8k..8k+7 give the row addresses (16 bytes each, 16-byte aligned) of
/// matrix k; lane l receives, of each matrix k in register r[k], row l/4,
/// elements 2(l%4) and 2(l%4)+1 (the A/B/C fragment pattern of mma_sync.cuh).
///
///     lanes 0-7 -> rows of matrix 0 -> r[0]     lanes 16-23 -> matrix 2 -> r[2]
///     lanes 8-15 -> rows of matrix 1 -> r[1]    lanes 24-31 -> matrix 3 -> r[3]
///
/// With `.trans` each matrix is transposed on the way: lane l receives column
/// l/4, elements (rows) 2(l%4) and 2(l%4)+1, which makes a row-major [keys][d]
/// V tile the "column major" B operand of P V.
///
/// **The "memory" clobber.** ldmatrix reads shared memory through a 32-bit
/// address the compiler cannot see as a memory operand, so without a clobber it
/// could move the load above a plain C++ store to the same tile. In every kernel
/// of this project a `__syncthreads()` or `__syncwarp()` (both compiler memory
/// barriers) separates the store from the load anyway, so the clobber changes
/// nothing there: chapter 04's forward steps and backward compile to byte-identical
/// machine code with and without it (compared section by section in the cubins).
/// It stays, because it makes the wrapper correct on its own, also for a caller
/// that writes a fragment's source and reads it back without a barrier between.

#include <cstdint>

namespace attn::cuda {

/// Four 8x8 b16 matrices at the lanes' row addresses `addr` (shared window, see
/// smem_addr.cuh) into r[0..3].
__device__ __forceinline__ void ldmatrix_x4(uint32_t (&r)[4], uint32_t addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr)
               : "memory");
}

/// The same, each matrix transposed on the way.
__device__ __forceinline__ void ldmatrix_x4_trans(uint32_t (&r)[4], uint32_t addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr)
               : "memory");
}

}  // namespace attn::cuda
