#pragma once
/// \file smem_addr.cuh
/// \brief The 32-bit shared-memory address that `ldmatrix`, `cp.async` and the
///        other shared-state-space instructions take.
///
/// PTX ISA, "State Spaces: Shared" and "cvta": a generic pointer into shared
/// memory converts to a `.shared` window offset, which fits 32 bits. Passing the
/// 32-bit form (`"r"`) instead of a generic 64-bit pointer saves the conversion in
/// every instruction that uses it.

#include <cstdint>

namespace attn::cuda {

/// Shared-memory address of `p` (a pointer into `__shared__` storage).
__device__ __forceinline__ uint32_t smem_u32(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

}  // namespace attn::cuda
