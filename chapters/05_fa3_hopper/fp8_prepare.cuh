#pragma once
/// \file fp8_prepare.cuh
/// \brief Step 7's input preparation on the GPU (see fp8_prepare.cu): E4M3 copies of
///        Q and K (Hadamard-rotated, one scale per 64 rows) and of V^T (one scale per
///        channel, keys permuted for the fp8 P V product).

#include <cstdint>

#include "common/cuda/buffer.cuh"
#include "common/problem.hpp"

namespace attn::ch05 {

struct Fp8Device {
  explicit Fp8Device(const Problem& p);
  DeviceBuffer<uint8_t> q8, k8;  ///< [B][H][N][d]
  int nk_pad;                    ///< V^T row pitch: Nk rounded up to 32 keys
  DeviceBuffer<uint8_t> vt8;     ///< [B][Hkv][d][nk_pad]
  DeviceBuffer<float> q_scale;   ///< [B][Hq][ceil(Nq / 64)]
  DeviceBuffer<float> k_scale;   ///< [B][Hkv][ceil(Nk / 64)]
  DeviceBuffer<float> v_scale;   ///< [B][Hkv][d]
  DeviceBuffer<unsigned> v_amax; ///< scratch for the channel maxima
};

/// Runs the preparation kernels on the default stream (q, k, v in p.dtype on the device).
void fp8_prepare(const Problem& p, const void* q, const void* k, const void* v, Fp8Device& out);

}  // namespace attn::ch05
