#pragma once
/// \file ceilings.cuh
/// \brief What this GPU actually does, measured in this run, so every figure can be
///        shown as a share of it: a read-only bandwidth and a cuBLAS GEMM rate.

#include "common/dtype.hpp"
#include "common/report.hpp"

namespace attn {

/// GB/s of a read-only streaming kernel (16-byte loads, 2 GiB buffer, bytes read / time).
double measure_read_gbps();
/// TFLOP/s of a cuBLAS 8192^3 GEMM: bf16/fp16 inputs with fp32 accumulation on tensor
/// cores, or plain fp32 SGEMM (no TF32) for DType::f32. Inputs are random, not zeros.
double measure_gemm_tflops(DType t);
/// Both, for the report (cached per process).
Ceilings measure_ceilings(DType t);

}  // namespace attn
