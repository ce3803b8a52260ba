#pragma once
/// \file shared_access.cuh
/// \brief Loads and stores that name the shared state space: `ld.shared`, `st.shared`
///        and `stmatrix`, each on a 32-bit shared-memory address (smem_u32()).
///
/// PTX ISA, "Data Movement and Conversion Instructions: ld, st, stmatrix". A C++
/// access through a pointer into shared memory compiles to a shared load (SASS `LDS`)
/// only while the compiler can prove where the pointer came from. Once the address
/// went through integer arithmetic (an alignment to 1024, or `+ fresh_zero()` from
/// roles.cuh) that proof is gone and the access is *generic* (`LD.E`, `ST.E`): the
/// hardware then finds out at run time that the address is shared, and a generic load
/// is waited for like a global one. These helpers take the `.shared` address itself,
/// so the instruction is a shared one whatever the compiler knows.
///
/// Each is `asm volatile` with a "memory" clobber: the compiler keeps them in program
/// order with the barriers and waits around them (the data they read may have been
/// written by TMA, and what they write is read by wgmma or the bulk copy engine).

#include <cstdint>

#include "common/cuda/smem_addr.cuh"

namespace attn::hopper {

/// Two floats from shared memory (8-byte aligned address).
__device__ __forceinline__ float2 lds_f32x2(uint32_t addr) {
  float2 v;
  asm volatile("ld.shared.v2.f32 {%0, %1}, [%2];" : "=f"(v.x), "=f"(v.y) : "r"(addr) : "memory");
  return v;
}

/// Two floats to shared memory (8-byte aligned address).
__device__ __forceinline__ void sts_f32x2(uint32_t addr, float x, float y) {
  asm volatile("st.shared.v2.f32 [%0], {%1, %2};" ::"r"(addr), "f"(x), "f"(y) : "memory");
}

/// Four 8x8 matrices of 16-bit elements from the registers of a warp to shared memory
/// (`stmatrix.sync.aligned.m8n8.x4.shared.b16`). Register r_m holds matrix m in the mma
/// fragment layout: lane l has row l / 4, elements 2 (l % 4) and 2 (l % 4) + 1 (low half
/// first), which is the layout of two adjacent columns of a wgmma accumulator. Lane l
/// gives the address of row l % 8 of matrix l / 8: 16 contiguous bytes, 16-byte aligned.
__device__ __forceinline__ void stmatrix_x4(uint32_t addr, uint32_t r0, uint32_t r1, uint32_t r2, uint32_t r3) {
  asm volatile("stmatrix.sync.aligned.m8n8.x4.shared.b16 [%0], {%1, %2, %3, %4};" ::"r"(addr), "r"(r0), "r"(r1),
               "r"(r2), "r"(r3)
               : "memory");
}

}  // namespace attn::hopper
