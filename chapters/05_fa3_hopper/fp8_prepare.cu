// Chapter 05, step 7's preparation pass: Q, K, V (bf16 / fp16) -> E4M3 tensors and scales.
//
//   quantize_qk     Q or K: rotate every row by H / sqrt(d) (fast Walsh-Hadamard), then
//                   one scale per 64 rows of a head; writes [BH][N][d] E4M3 + scales
//   v_channel_amax  V: the largest |v| of each channel of each KV head (atomicMax on bits)
//   quantize_vt     V: quantise by the channel scale and write V^T, [BH][d][Nk_pad], with
//                   the keys of every 32-key slice permuted (fp8_key_at(), fa3_tiles.hpp)
//
// The butterflies, the scale s = amax / 448 and the division x / s are the ones of
// fp8_model.cpp, in the same order and IEEE single precision, and the conversion is
// cvt.rn.satfinite (round to nearest even, saturate at 448): the E4M3 tensors equal the
// CPU's bit for bit. FA3 transposes V inside the attention kernel (its producer warps
// use ldmatrix.trans / stmatrix); here the pass that must read V to quantise it writes
// it transposed, so the kernel gets V^T for free.
#include <cuda_fp8.h>

#include "common/cuda/check.cuh"
#include "common/cuda/types.cuh"
#include "fa3_tiles.hpp"
#include "fp8_prepare.cuh"

namespace attn::ch05 {
namespace {

constexpr int kRowsPerBlock = 64;  // kFp8ScaleRows
constexpr int kWarps = 8;

__device__ __forceinline__ uint8_t to_e4m3(float x) {
  return uint8_t(__nv_cvt_float_to_fp8(x, __NV_SATFINITE, __NV_E4M3));
}

/// One thread block per 64-row block of one head; warp w takes rows w, w + 8, ...;
/// lane l holds the E = d/32 consecutive elements [l E, l E + E) of a row.
template <class T, int D>
__global__ void __launch_bounds__(kWarps * 32) quantize_qk(const T* __restrict__ x, uint8_t* __restrict__ x8,
                                                           float* __restrict__ scales, int n) {
  constexpr int E = D / 32;
  constexpr int kRows = kRowsPerBlock / kWarps;
  const int blk = blockIdx.x, bh = blockIdx.y, warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int n_blocks = (n + kRowsPerBlock - 1) / kRowsPerBlock;
  const float r = float(1.0 / sqrt(double(D)));
  float v[kRows][E];
  float amax = 0.f;
#pragma unroll
  for (int rr = 0; rr < kRows; ++rr) {
    const int row = blk * kRowsPerBlock + warp + kWarps * rr;
    float* e = v[rr];
#pragma unroll
    for (int i = 0; i < E; ++i) e[i] = row < n ? to_float(x[(size_t(bh) * n + row) * D + lane * E + i]) : 0.f;
    // Butterfly h pairs element k with k + h (k without bit h): x[k] + x[k+h], x[k] - x[k+h].
#pragma unroll
    for (int h = 1; h < D; h *= 2) {
      if (h < E) {
#pragma unroll
        for (int i = 0; i < E; ++i)
          if ((i & h) == 0) {
            const float a = e[i], b = e[i + h];
            e[i] = a + b;
            e[i + h] = a - b;
          }
      } else {
        const int lane_bit = h / E;  // bit h of k = lane * E + i is this bit of the lane
        const bool upper = (lane & lane_bit) != 0;
#pragma unroll
        for (int i = 0; i < E; ++i) {
          const float other = __shfl_xor_sync(0xffffffffu, e[i], lane_bit);
          e[i] = upper ? other - e[i] : e[i] + other;
        }
      }
    }
#pragma unroll
    for (int i = 0; i < E; ++i) {
      e[i] *= r;
      if (row < n) amax = fmaxf(amax, fabsf(e[i]));
    }
  }
  // amax over the block: the warp, then the eight warps.
  __shared__ float warp_max[kWarps];
#pragma unroll
  for (int o = 16; o > 0; o /= 2) amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, o));
  if (lane == 0) warp_max[warp] = amax;
  __syncthreads();
  amax = 0.f;
#pragma unroll
  for (int w = 0; w < kWarps; ++w) amax = fmaxf(amax, warp_max[w]);
  const float s = amax > 0.f ? __fdiv_rn(amax, 448.f) : 1.f;
  if (threadIdx.x == 0) scales[size_t(bh) * n_blocks + blk] = s;
#pragma unroll
  for (int rr = 0; rr < kRows; ++rr) {
    const int row = blk * kRowsPerBlock + warp + kWarps * rr;
    if (row >= n) continue;
    uint8_t* dst = x8 + (size_t(bh) * n + row) * D + lane * E;
#pragma unroll
    for (int i = 0; i < E; ++i) dst[i] = to_e4m3(__fdiv_rn(v[rr][i], s));
  }
}

/// amax of each channel of V, over a slice of keys per thread block (atomicMax on the
/// bits of a non-negative float orders like the float).
template <class T>
__global__ void v_channel_amax(const T* __restrict__ v, unsigned* __restrict__ amax_bits, int nk, int d,
                               int keys_per_block) {
  const int bh = blockIdx.y, k0 = blockIdx.x * keys_per_block;
  for (int c = threadIdx.x; c < d; c += blockDim.x) {
    float m = 0.f;
    for (int j = k0; j < min(nk, k0 + keys_per_block); ++j) m = fmaxf(m, fabsf(to_float(v[(size_t(bh) * nk + j) * d + c])));
    atomicMax(amax_bits + size_t(bh) * d + c, __float_as_uint(m));
  }
}

__global__ void v_scales_from_amax(const unsigned* __restrict__ amax_bits, float* __restrict__ scales, int n) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) {
    const float a = __uint_as_float(amax_bits[i]);
    scales[i] = a > 0.f ? __fdiv_rn(a, 448.f) : 1.f;
  }
}

/// One thread per channel c and 32-key slice: writes V8^T[c][32 slice + p] = e4m3(V[32 slice + sigma(p)][c] / s_c),
/// zero for keys past Nk.
template <class T>
__global__ void quantize_vt(const T* __restrict__ v, const float* __restrict__ scales, uint8_t* __restrict__ vt,
                            int nk, int nk_pad, int d) {
  const int slice = blockIdx.x, bh = blockIdx.y;
  for (int c = threadIdx.x; c < d; c += blockDim.x) {
    const float s = scales[size_t(bh) * d + c];
    uint32_t words[8];
#pragma unroll
    for (int w = 0; w < 8; ++w) {
      uint32_t word = 0;
#pragma unroll
      for (int b = 0; b < 4; ++b) {
        const int key = 32 * slice + fp8_key_at(4 * w + b);
        const float x = key < nk ? to_float(v[(size_t(bh) * nk + key) * d + c]) : 0.f;
        word |= uint32_t(to_e4m3(__fdiv_rn(x, s))) << (8 * b);
      }
      words[w] = word;
    }
    uint4* dst = reinterpret_cast<uint4*>(vt + (size_t(bh) * d + c) * nk_pad + 32 * slice);
    dst[0] = make_uint4(words[0], words[1], words[2], words[3]);
    dst[1] = make_uint4(words[4], words[5], words[6], words[7]);
  }
}

template <class T, int D>
void launch_qk(const void* x, uint8_t* x8, float* scales, int bh, int n) {
  const dim3 grid((n + kRowsPerBlock - 1) / kRowsPerBlock, bh);
  quantize_qk<T, D><<<grid, kWarps * 32>>>(static_cast<const T*>(x), x8, scales, n);
  CUDA_CHECK_LAUNCH("quantize_qk");
}

template <class T>
void prepare_t(const Problem& p, const void* q, const void* k, const void* v, Fp8Device& out) {
  const int bhq = p.batch * p.heads, bhk = p.batch * p.kv_heads;
  auto qk = [&](const void* x, uint8_t* x8, float* s, int bh, int n) {
    switch (p.d) {
      case 64: launch_qk<T, 64>(x, x8, s, bh, n); break;
      case 256: launch_qk<T, 256>(x, x8, s, bh, n); break;
      default: launch_qk<T, 128>(x, x8, s, bh, n); break;
    }
  };
  qk(q, out.q8.get(), out.q_scale.get(), bhq, p.nq);
  qk(k, out.k8.get(), out.k_scale.get(), bhk, p.nk);
  out.v_amax.zero();
  const int keys_per_block = 512;
  v_channel_amax<T><<<dim3((p.nk + keys_per_block - 1) / keys_per_block, bhk), 256>>>(
      static_cast<const T*>(v), out.v_amax.get(), p.nk, p.d, keys_per_block);
  CUDA_CHECK_LAUNCH("v_channel_amax");
  const int n = bhk * p.d;
  v_scales_from_amax<<<(n + 255) / 256, 256>>>(out.v_amax.get(), out.v_scale.get(), n);
  CUDA_CHECK_LAUNCH("v_scales_from_amax");
  quantize_vt<T><<<dim3(out.nk_pad / 32, bhk), 256>>>(static_cast<const T*>(v), out.v_scale.get(), out.vt8.get(),
                                                      p.nk, out.nk_pad, p.d);
  CUDA_CHECK_LAUNCH("quantize_vt");
}

}  // namespace

Fp8Device::Fp8Device(const Problem& p)
    : q8(p.q_elems()),
      k8(p.k_elems()),
      nk_pad((p.nk + 31) / 32 * 32),
      vt8(std::size_t(p.batch) * p.kv_heads * p.d * ((p.nk + 31) / 32 * 32)),
      q_scale(std::size_t(p.batch) * p.heads * ceil_div(p.nq, kRowsPerBlock)),
      k_scale(std::size_t(p.batch) * p.kv_heads * ceil_div(p.nk, kRowsPerBlock)),
      v_scale(std::size_t(p.batch) * p.kv_heads * p.d),
      v_amax(std::size_t(p.batch) * p.kv_heads * p.d) {}

void fp8_prepare(const Problem& p, const void* q, const void* k, const void* v, Fp8Device& out) {
  if (p.dtype == DType::f16)
    prepare_t<__half>(p, q, k, v, out);
  else
    prepare_t<__nv_bfloat16>(p, q, k, v, out);
}

}  // namespace attn::ch05
