#pragma once
/// \file hd.hpp
/// \brief `ATTN_HD`: a function that host C++ and CUDA device code both call.
///
/// Under nvcc it is `__host__ __device__ __forceinline__`; in a plain C++ build it is
/// `inline`, so the CPU models and the kernels share one definition of the online
/// softmax (online_softmax.hpp) and of the index arithmetic (index.hpp).

#if defined(__CUDACC__)
#define ATTN_HD __host__ __device__ __forceinline__
#else
#define ATTN_HD inline
#endif
