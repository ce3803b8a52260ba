#pragma once
/// \file ring_nccl.hpp
/// \brief The NCCL backend's entry point (ring_nccl.cu when NCCL is found, else
///        ring_nccl_none.cpp, which says so).
#include "ring_gpu.hpp"

namespace attn::ch06::ring {

/// One GPU per rank, one host thread per GPU in this process; K/V and dK/dV move
/// with ncclSend/ncclRecv in one group per rotation. P = 1 runs on one GPU.
GpuRingResult ring_nccl(const Problem& p, const AttnInputs& in, const GpuRingOptions& opt);

}  // namespace attn::ch06::ring
