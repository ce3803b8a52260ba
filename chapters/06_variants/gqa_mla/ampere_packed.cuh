#pragma once
/// \file ampere_packed.cuh
/// \brief The packed GQA forward for GPUs other than Hopper (ampere_packed.cu,
///        sm_80+): chapter 04's forward step v9 with the G query heads of a KV head
///        packed on a tile's rows.

#include <cuda_runtime.h>

// Chapter 04's FwdParams and launch convention, by path: the kernel is its v9 with the packed view.
#include "chapters/04_fa2/fa2_kernels.cuh"

namespace attn::ch06::ampere_packed {

/// Launches the forward for the problem in `p` (as it is, not packed) on stream `s`:
/// pack = true puts the G = heads / kv_heads query heads of each KV head on one tile's
/// rows; false runs one query head per tile (chapter 04's v9). bf16 or fp16, d = dv in
/// {64, 128, 256}; false (nothing launched) otherwise.
bool launch(const attn::ch04::FwdParams& p, DType t, cudaStream_t s, bool pack);

}  // namespace attn::ch06::ampere_packed
