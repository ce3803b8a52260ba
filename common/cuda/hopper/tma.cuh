#pragma once
/// \file tma.cuh
/// \brief The Tensor Memory Accelerator: a *tensor map* (built once on the host by the
///        driver) describes a global tensor and a box; one thread then asks the copy
///        engine for a whole box with one instruction, and the bytes land in shared
///        memory (swizzled) while every thread does something else.
///
/// Wraps the PTX `cp.async.bulk.tensor` (3d, `.shared::cluster`, `.global`, `.mbarrier::complete_tx::bytes`)
/// through CCCL's `cuda::ptx::cp_async_bulk_tensor`, PTX ISA "Data Movement and
/// Conversion Instructions: cp.async.bulk.tensor" (the tensor map's fields: "Tensor
/// Access Modes" and the CUDA driver API's cuTensorMapEncodeTiled). sm_90.
///
///     host:    CUtensorMap map = make_tensor_map_3d(ptr, type, ...);   // 128 bytes
///              kernel<<<...>>>(map, ...);       // passed as `const __grid_constant__ CUtensorMap`
///     device:  mbarrier_arrive_expect_tx(bar, bytes);                  // "bytes are coming"
///              tma_load_3d(smem, &map, bar, c_inner, c_row, c_outer);  // returns at once
///              ... consumers wait on `bar`'s phase ...                  // completes when all bytes landed
///
/// The map lives in the kernel's parameter space (`__grid_constant__` keeps it there:
/// the copy engine reads it by address, so it must not be copied to registers).
/// Rows outside the tensor (N not a multiple of the tile) are filled with zeros, and
/// their bytes still count towards the transaction, so the barrier always expects
/// the full box.
///
/// Every tensor of the chapter is viewed as 3-D: [outer = batch x heads][rows][inner],
/// inner contiguous. A box is [1][box_rows][box_inner]; box_inner is 128 bytes (or
/// 64 for fp8 with d = 64), the widest row the 128-byte swizzle allows, so a d = 128
/// bf16 tile arrives as two boxes side by side (see wgmma.cuh for the swizzle).

#include <cuda.h>  // CUtensorMap and its enums (the types only: the driver is reached at run time)
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>
#include <cuda/ptx>

#include <cstdint>

namespace attn::hopper {

/// Encodes a tiled 3-D tensor map through the driver's cuTensorMapEncodeTiled,
/// found at run time with cudaGetDriverEntryPointByVersion (so nothing links libcuda).
/// `inner` and `rows` are in elements; the row pitch is inner * elem_bytes and must be a
/// multiple of 16 bytes. The swizzle is 128B or 64B to match box_inner * elem_bytes.
/// Throws CudaError with the driver's code on failure.
CUtensorMap make_tensor_map_3d(const void* base, CUtensorMapDataType type, int elem_bytes, uint64_t inner,
                               uint64_t rows, uint64_t outer, uint32_t box_inner, uint32_t box_rows);

/// The tensor-map element type of a device element type.
template <class T> constexpr CUtensorMapDataType tma_type();
template <> constexpr CUtensorMapDataType tma_type<__nv_bfloat16>() { return CU_TENSOR_MAP_DATA_TYPE_BFLOAT16; }
template <> constexpr CUtensorMapDataType tma_type<__half>() { return CU_TENSOR_MAP_DATA_TYPE_FLOAT16; }
template <> constexpr CUtensorMapDataType tma_type<__nv_fp8_e4m3>() { return CU_TENSOR_MAP_DATA_TYPE_UINT8; }

#if defined(__CUDACC__)
/// Copies box (c_inner, c_row, c_outer) of `map` into `smem_dst` and reports its bytes
/// to the mbarrier `bar` (complete_tx). Issued by one thread. `smem_dst` must be
/// 1024-byte aligned for the 128-byte swizzle (512 for 64-byte).
__device__ __forceinline__ void tma_load_3d(void* smem_dst, const CUtensorMap* map, uint64_t* bar, int c_inner,
                                            int c_row, int c_outer) {
  const int32_t coords[3] = {c_inner, c_row, c_outer};
  ::cuda::ptx::cp_async_bulk_tensor(::cuda::ptx::space_cluster, ::cuda::ptx::space_global, smem_dst, map, coords, bar);
}
#endif

}  // namespace attn::hopper
