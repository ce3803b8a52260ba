// Host side of tma.cuh: encoding tensor maps through the driver entry point.
#include <cudaTypedefs.h>  // PFN_cuTensorMapEncodeTiled_v12000

#include <string>

#include "common/cuda/check.cuh"
#include "common/cuda/hopper/tma.cuh"

namespace attn::hopper {
namespace {

PFN_cuTensorMapEncodeTiled_v12000 encode_fn() {
  static PFN_cuTensorMapEncodeTiled_v12000 fn = [] {
    void* p = nullptr;
    cudaDriverEntryPointQueryResult status{};
    CUDA_CHECK(cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &p, 12000, cudaEnableDefault, &status));
    if (status != cudaDriverEntryPointSuccess || !p)
      throw CudaError("cuTensorMapEncodeTiled not found in the driver (needs a CUDA 12 driver)");
    return reinterpret_cast<PFN_cuTensorMapEncodeTiled_v12000>(p);
  }();
  return fn;
}

}  // namespace

CUtensorMap make_tensor_map_3d(const void* base, CUtensorMapDataType type, int elem_bytes, uint64_t inner,
                               uint64_t rows, uint64_t outer, uint32_t box_inner, uint32_t box_rows) {
  CUtensorMap map{};
  const cuuint64_t dims[3] = {inner, rows, outer};
  // Strides of dimensions 1 and 2 in bytes (dimension 0 is contiguous).
  const cuuint64_t strides[2] = {inner * elem_bytes, inner * rows * elem_bytes};
  const cuuint32_t box[3] = {box_inner, box_rows, 1};
  const cuuint32_t elem_strides[3] = {1, 1, 1};
  const uint32_t row_bytes = box_inner * uint32_t(elem_bytes);
  const CUtensorMapSwizzle swizzle = row_bytes == 128 ? CU_TENSOR_MAP_SWIZZLE_128B
                                     : row_bytes == 64 ? CU_TENSOR_MAP_SWIZZLE_64B
                                                       : CU_TENSOR_MAP_SWIZZLE_NONE;
  const CUresult r = encode_fn()(&map, type, 3, const_cast<void*>(base), dims, strides, box, elem_strides,
                                 CU_TENSOR_MAP_INTERLEAVE_NONE, swizzle, CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
                                 CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  if (r != CUDA_SUCCESS)
    throw CudaError("cuTensorMapEncodeTiled failed with CUresult " + std::to_string(int(r)) + " (dims " +
                    std::to_string(inner) + " x " + std::to_string(rows) + " x " + std::to_string(outer) + ", box " +
                    std::to_string(box_inner) + " x " + std::to_string(box_rows) + ")");
  return map;
}

}  // namespace attn::hopper
