#pragma once
/// \file types.cuh
/// \brief Device element types for each DType, conversions, and the one dispatch
///        from a runtime DType to a template parameter.

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "common/dtype.hpp"

namespace attn {

template <class T> struct DTypeOf;
template <> struct DTypeOf<float> { static constexpr DType value = DType::f32; };
template <> struct DTypeOf<__half> { static constexpr DType value = DType::f16; };
template <> struct DTypeOf<__nv_bfloat16> { static constexpr DType value = DType::bf16; };

__device__ __forceinline__ float to_float(float x) { return x; }
__device__ __forceinline__ float to_float(__half x) { return __half2float(x); }
__device__ __forceinline__ float to_float(__nv_bfloat16 x) { return __bfloat162float(x); }

template <class T> __device__ __forceinline__ T from_float(float x);
template <> __device__ __forceinline__ float from_float<float>(float x) { return x; }
template <> __device__ __forceinline__ __half from_float<__half>(float x) { return __float2half_rn(x); }
template <> __device__ __forceinline__ __nv_bfloat16 from_float<__nv_bfloat16>(float x) {
  return __float2bfloat16_rn(x);
}

/// Calls f(T{}) with T the device type of `t`: the only place a runtime dtype
/// becomes a template argument, so each kernel is instantiated once per dtype.
template <class F>
decltype(auto) dispatch_dtype(DType t, F&& f) {
  switch (t) {
    case DType::f16: return f(__half{});
    case DType::bf16: return f(__nv_bfloat16{});
    case DType::f32: default: return f(float{});
  }
}

}  // namespace attn
