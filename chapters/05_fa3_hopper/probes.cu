// Each Hopper mechanism of chapter 05 checked alone on the device: a failure here
// points at one helper (tma.cuh, wgmma.cuh, the fp8 packing), not at a whole kernel.
//
//   probe_tma_swizzle   TMA box -> shared memory, read back through the swizzle formula
//   probe_wgmma_bf16    S = A B^T (SS, K-major) and O = bf16(S) V (RS, V N-major), as in v2-v8
//   probe_wgmma_fp8     S = Q8 K8^T (SS) and O = e4m3(S / 64) V8 (RS, V8^T key-permuted), as in v9
#include <cmath>
#include <vector>

#include "common/cuda/buffer.cuh"
#include "common/cuda/check.cuh"
#include "common/cuda/hopper/mbarrier.cuh"
#include "common/cuda/hopper/tma.cuh"
#include "common/cuda/hopper/wgmma.cuh"
#include "fa3_common.cuh"
#include "fa3_gpu.hpp"
#include "fp8_model.hpp"

namespace attn::ch05 {
namespace {

using namespace attn::hopper;

constexpr int kSmem = 64 * 1024;

// ----------------------------------------------------------------------------- TMA

/// One box of [64 rows][64 bf16] lands swizzled; thread t copies element (t / 64, t % 64)
/// back out, reading it where the swizzle formula says it is.
__global__ void tma_probe_kernel(const __grid_constant__ CUtensorMap map, uint16_t* out) {
  extern __shared__ unsigned char raw[];
  unsigned char* smem = align_1024(raw);
  uint64_t* bar = reinterpret_cast<uint64_t*>(smem + 8192);
  if (threadIdx.x == 0) {
    mbarrier_init(bar, 1);
    mbarrier_init_fence();
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    mbarrier_arrive_expect_tx(bar, 8192);
    tma_load_3d(smem, &map, bar, 0, 0, 0);
  }
  mbarrier_wait(bar, 0);
  for (int e = threadIdx.x; e < 64 * 64; e += blockDim.x) {
    const int r = e / 64, byte = 2 * (e % 64);
    const int at = r * 128 + (((byte / 16) ^ (r % 8)) * 16) + byte % 16;
    out[e] = *reinterpret_cast<const uint16_t*>(smem + at);
  }
}

// ----------------------------------------------------------------------------- wgmma, 16-bit

/// A [64][64], B [128][64] (both K-major), V [128][64]: S = A B^T, O = bf16(S) V.
__global__ void wgmma_bf16_probe_kernel(const __grid_constant__ CUtensorMap ta, const __grid_constant__ CUtensorMap tb,
                                        const __grid_constant__ CUtensorMap tv, float* s_out, float* o_out) {
  extern __shared__ unsigned char raw[];
  unsigned char* smem = align_1024(raw);
  unsigned char* sa = smem;             // 64 x 128 B
  unsigned char* sb = smem + 8192;      // 128 x 128 B
  unsigned char* sv = smem + 8192 + 16384;
  uint64_t* bar = reinterpret_cast<uint64_t*>(smem + 8192 + 2 * 16384);
  if (threadIdx.x == 0) {
    mbarrier_init(bar, 1);
    mbarrier_init_fence();
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    mbarrier_arrive_expect_tx(bar, 8192 + 2 * 16384);
    tma_load_3d(sa, &ta, bar, 0, 0, 0);
    tma_load_3d(sb, &tb, bar, 0, 0, 0);
    tma_load_3d(sv, &tv, bar, 0, 0, 0);
  }
  mbarrier_wait(bar, 0);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  float s[64];
  wgmma_fence();
#pragma unroll
  for (int k = 0; k < 4; ++k)
    WgmmaSS<__nv_bfloat16, 128>::mma(s, desc_k_major(sa + 32 * k, 128), desc_k_major(sb + 32 * k, 128), k > 0);
  wgmma_commit();
  wgmma_wait<0>();
  fence_operand(s);
  uint32_t p[32];
  convert_p<__nv_bfloat16>(s, p);
  float o[32];
#pragma unroll
  for (int i = 0; i < 32; ++i) o[i] = 0.f;
  fence_operand(o);
  wgmma_fence();
#pragma unroll
  for (int kk = 0; kk < 8; ++kk) {
    const uint32_t a[4] = {p[4 * kk], p[4 * kk + 1], p[4 * kk + 2], p[4 * kk + 3]};
    WgmmaRS<__nv_bfloat16, 64>::mma(o, a, desc_mn_major(sv + kk * 16 * 128, 128 * 128), 1);
  }
  wgmma_commit();
  wgmma_wait<0>();
  fence_operand(o);
  const int r0 = 16 * warp + lane / 4;
  for (int i = 0; i < 64; ++i)
    s_out[(r0 + 8 * ((i >> 1) & 1)) * 128 + 8 * (i / 4) + 2 * (lane % 4) + (i & 1)] = s[i];
  for (int i = 0; i < 32; ++i)
    o_out[(r0 + 8 * ((i >> 1) & 1)) * 64 + 8 * (i / 4) + 2 * (lane % 4) + (i & 1)] = o[i];
}

// ----------------------------------------------------------------------------- wgmma, fp8

/// Q8 [64][128], K8 [128][128] (K-major), V8^T [64][128] (keys permuted): S = Q8 K8^T,
/// O = e4m3(S / 64) V8.
__global__ void wgmma_fp8_probe_kernel(const __grid_constant__ CUtensorMap tq, const __grid_constant__ CUtensorMap tk,
                                       const __grid_constant__ CUtensorMap tv, float* s_out, float* o_out) {
  extern __shared__ unsigned char raw[];
  unsigned char* smem = align_1024(raw);
  unsigned char* sq = smem;            // 64 x 128 B
  unsigned char* sk = smem + 8192;     // 128 x 128 B
  unsigned char* sv = smem + 8192 + 16384;  // 64 x 128 B
  uint64_t* bar = reinterpret_cast<uint64_t*>(smem + 8192 + 16384 + 8192);
  if (threadIdx.x == 0) {
    mbarrier_init(bar, 1);
    mbarrier_init_fence();
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    mbarrier_arrive_expect_tx(bar, 8192 + 16384 + 8192);
    tma_load_3d(sq, &tq, bar, 0, 0, 0);
    tma_load_3d(sk, &tk, bar, 0, 0, 0);
    tma_load_3d(sv, &tv, bar, 0, 0, 0);
  }
  mbarrier_wait(bar, 0);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  float s[64];
  wgmma_fence();
#pragma unroll
  for (int k = 0; k < 4; ++k)
    WgmmaSS<__nv_fp8_e4m3, 128>::mma(s, desc_k_major(sq + 32 * k, 128), desc_k_major(sk + 32 * k, 128), k > 0);
  wgmma_commit();
  wgmma_wait<0>();
  fence_operand(s);
  const int r0 = 16 * warp + lane / 4;
  for (int i = 0; i < 64; ++i)
    s_out[(r0 + 8 * ((i >> 1) & 1)) * 128 + 8 * (i / 4) + 2 * (lane % 4) + (i & 1)] = s[i];
#pragma unroll
  for (int i = 0; i < 64; ++i) s[i] *= 1.f / 64;
  uint32_t p[16];
  convert_p_fp8(s, p);
  float o[32];
#pragma unroll
  for (int i = 0; i < 32; ++i) o[i] = 0.f;
  fence_operand(o);
  wgmma_fence();
#pragma unroll
  for (int kk = 0; kk < 4; ++kk) {
    const uint32_t a[4] = {p[4 * kk], p[4 * kk + 1], p[4 * kk + 2], p[4 * kk + 3]};
    WgmmaRS<__nv_fp8_e4m3, 64>::mma(o, a, desc_k_major(sv + 32 * kk, 128), 1);
  }
  wgmma_commit();
  wgmma_wait<0>();
  fence_operand(o);
  for (int i = 0; i < 32; ++i)
    o_out[(r0 + 8 * ((i >> 1) & 1)) * 64 + 8 * (i / 4) + 2 * (lane % 4) + (i & 1)] = o[i];
}

/// Small values that every format holds exactly: {-2, -1.5, ..., 2} / 4.
float small_value(int i, int salt) {
  const unsigned h = unsigned(i) * 2654435761u + unsigned(salt) * 40503u;
  return float(int((h >> 7) % 9) - 4) / 8.f;
}

template <class Kernel>
void prepare_kernel(Kernel k) {
  CUDA_CHECK(cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmem));
}

}  // namespace

ProbeResult probe_tma_swizzle() {
  ProbeResult r;
  r.what = "TMA 128B-swizzled box read back through the swizzle formula";
  std::vector<uint16_t> h(64 * 64);
  for (std::size_t i = 0; i < h.size(); ++i) h[i] = uint16_t(i * 7 + 3);
  DeviceBuffer<uint16_t> in(h.size()), out(h.size());
  in.upload(h);
  out.zero();
  const CUtensorMap map = make_tensor_map_3d(in.get(), CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 2, 64, 64, 1, 64, 64);
  prepare_kernel(tma_probe_kernel);
  tma_probe_kernel<<<1, 128, kSmem>>>(map, out.get());
  CUDA_CHECK_LAUNCH("tma_probe_kernel");
  CUDA_CHECK(cudaDeviceSynchronize());
  const std::vector<uint16_t> got = out.download();
  for (std::size_t i = 0; i < h.size(); ++i) r.max_err = std::max(r.max_err, std::fabs(double(got[i]) - h[i]));
  r.ran = true;
  return r;
}

ProbeResult probe_wgmma_bf16() {
  ProbeResult r;
  r.what = "wgmma m64n128k16 SS (K-major) and m64n64k16 RS (V N-major)";
  std::vector<float> a(64 * 64), b(128 * 64), v(128 * 64);
  for (std::size_t i = 0; i < a.size(); ++i) a[i] = small_value(int(i), 1);
  for (std::size_t i = 0; i < b.size(); ++i) b[i] = small_value(int(i), 2);
  for (std::size_t i = 0; i < v.size(); ++i) v[i] = small_value(int(i), 3);
  const DeviceTensor da = DeviceTensor::from_host(a, DType::bf16), db = DeviceTensor::from_host(b, DType::bf16),
                     dv = DeviceTensor::from_host(v, DType::bf16);
  DeviceBuffer<float> s_out(64 * 128), o_out(64 * 64);
  s_out.poison();
  o_out.poison();
  const auto ty = CU_TENSOR_MAP_DATA_TYPE_BFLOAT16;
  const CUtensorMap ta = make_tensor_map_3d(da.data(), ty, 2, 64, 64, 1, 64, 64);
  const CUtensorMap tb = make_tensor_map_3d(db.data(), ty, 2, 64, 128, 1, 64, 128);
  const CUtensorMap tv = make_tensor_map_3d(dv.data(), ty, 2, 64, 128, 1, 64, 128);
  prepare_kernel(wgmma_bf16_probe_kernel);
  wgmma_bf16_probe_kernel<<<1, 128, kSmem>>>(ta, tb, tv, s_out.get(), o_out.get());
  CUDA_CHECK_LAUNCH("wgmma_bf16_probe_kernel");
  CUDA_CHECK(cudaDeviceSynchronize());
  const std::vector<float> s = s_out.download(), o = o_out.download();
  std::vector<float> pb(64 * 128);
  for (int i = 0; i < 64; ++i)
    for (int j = 0; j < 128; ++j) {
      float ref = 0;
      for (int k = 0; k < 64; ++k) ref += a[i * 64 + k] * b[j * 64 + k];
      r.max_err = std::max(r.max_err, double(std::fabs(s[i * 128 + j] - ref)));
      pb[i * 128 + j] = round_to(DType::bf16, ref);
    }
  for (int i = 0; i < 64; ++i)
    for (int c = 0; c < 64; ++c) {
      double ref = 0;
      for (int j = 0; j < 128; ++j) ref += double(pb[i * 128 + j]) * v[j * 64 + c];
      r.max_err = std::max(r.max_err, std::fabs(o[i * 64 + c] - ref));
    }
  r.ran = true;
  return r;
}

ProbeResult probe_wgmma_fp8() {
  ProbeResult r;
  r.what = "wgmma m64n128k32 e4m3 SS and m64n64k32 e4m3 RS with the key-permuted V^T";
  std::vector<uint8_t> q(64 * 128), k(128 * 128), vt(64 * 128);
  std::vector<float> qf(q.size()), kf(k.size()), vf(128 * 64);
  for (std::size_t i = 0; i < q.size(); ++i) qf[i] = e4m3_value(q[i] = e4m3_bits(2 * small_value(int(i), 4)));
  for (std::size_t i = 0; i < k.size(); ++i) kf[i] = e4m3_value(k[i] = e4m3_bits(2 * small_value(int(i), 5)));
  for (int key = 0; key < 128; ++key)
    for (int c = 0; c < 64; ++c) {
      const uint8_t bits = e4m3_bits(2 * small_value(key * 64 + c, 6));
      vf[key * 64 + c] = e4m3_value(bits);
      vt[c * 128 + 32 * (key / 32) + fp8_position_of(key % 32)] = bits;
    }
  DeviceBuffer<uint8_t> dq(q.size()), dk(k.size()), dvt(vt.size());
  dq.upload(q);
  dk.upload(k);
  dvt.upload(vt);
  DeviceBuffer<float> s_out(64 * 128), o_out(64 * 64);
  s_out.poison();
  o_out.poison();
  const auto ty = CU_TENSOR_MAP_DATA_TYPE_UINT8;
  const CUtensorMap tq = make_tensor_map_3d(dq.get(), ty, 1, 128, 64, 1, 128, 64);
  const CUtensorMap tk = make_tensor_map_3d(dk.get(), ty, 1, 128, 128, 1, 128, 128);
  const CUtensorMap tv = make_tensor_map_3d(dvt.get(), ty, 1, 128, 64, 1, 128, 64);
  prepare_kernel(wgmma_fp8_probe_kernel);
  wgmma_fp8_probe_kernel<<<1, 128, kSmem>>>(tq, tk, tv, s_out.get(), o_out.get());
  CUDA_CHECK_LAUNCH("wgmma_fp8_probe_kernel");
  CUDA_CHECK(cudaDeviceSynchronize());
  const std::vector<float> s = s_out.download(), o = o_out.download();
  std::vector<float> p8(64 * 128);
  for (int i = 0; i < 64; ++i)
    for (int j = 0; j < 128; ++j) {
      float ref = 0;
      for (int c = 0; c < 128; ++c) ref += qf[i * 128 + c] * kf[j * 128 + c];
      r.max_err = std::max(r.max_err, double(std::fabs(s[i * 128 + j] - ref)));
      p8[i * 128 + j] = round_e4m3(ref / 64);
    }
  for (int i = 0; i < 64; ++i)
    for (int c = 0; c < 64; ++c) {
      double ref = 0;
      for (int j = 0; j < 128; ++j) ref += double(p8[i * 128 + j]) * vf[j * 64 + c];
      r.max_err = std::max(r.max_err, std::fabs(o[i * 64 + c] - ref));
    }
  r.ran = true;
  return r;
}

}  // namespace attn::ch05
