#pragma once
/// \file kv_values.hpp
/// \brief The contents of the decode benchmarks' K/V pools as a pure function of the
///        element index, computed the same way on the host and on the device.
///
/// A 64K-token cache for 32 heads is gigabytes; generating it on the host and
/// copying it over would take longer than every measurement of the chapter. Instead
/// the GPU fills its pool with kv_value(index), and the host recomputes exactly the
/// elements a reference check needs. Both round the same float to bf16 with
/// round-to-nearest-even, so they agree bit for bit.
///
/// The values are close to normal: the sum of four uniform 16-bit integers, centred
/// and scaled by 2^-15 (standard deviation 1.15, all arithmetic exact in fp32). The
/// distributions of common/inputs.hpp are honoured: mean-shifted adds 2 to K (Q is
/// shifted by fill()), outliers scales one element in 256 by 20, integers are
/// uniform over {-2, ..., 2}.

#include <cstdint>

#include "common/inputs.hpp"

#if defined(__CUDACC__)
#define CH07_HD __host__ __device__ __forceinline__
#else
#define CH07_HD inline
#endif

namespace attn::ch07 {

/// The streams of the two pools (Q uses stream 1 through fill()).
constexpr uint32_t kStreamK = 2, kStreamV = 3;

CH07_HD uint64_t kv_mix(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

/// Element `index` of pool `stream` (kStreamK or kStreamV), before rounding to the dtype.
CH07_HD float kv_value(uint64_t seed, uint32_t stream, uint64_t index, Dist dist) {
  const uint64_t h = kv_mix((seed * 0x9e3779b97f4a7c15ull) ^ (uint64_t(stream) << 58) ^ kv_mix(index + 0x632be59bd9b4e019ull));
  if (dist == Dist::integers) return float(int(h % 5u) - 2);
  const int s = int(h & 0xffffu) + int((h >> 16) & 0xffffu) + int((h >> 32) & 0xffffu) + int(h >> 48) - 131070;
  float x = float(s) * (1.0f / 32768.0f);  // exact: |s| < 2^18
  if (dist == Dist::mean_shifted && stream == kStreamK) x += 2.0f;
  if (dist == Dist::outliers && (kv_mix(h) & 255u) == 0) x *= 20.0f;
  return x;
}

}  // namespace attn::ch07
