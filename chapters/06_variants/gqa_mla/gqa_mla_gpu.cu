// Host side of this part's kernels: uploads, the packed GQA forward (packed_fwd.cu), the
// absorbed MLA decode (the final mla_final.cu on sm_90a, mla_decode.cu elsewhere and for the
// lab's forms) with its two small GEMM kernels, and the decompressed MLA form (cuBLAS K/V
// GEMMs, then the packed forward with d = 192).
#include <cublas_v2.h>

#include <algorithm>
#include <cmath>
#include <functional>

#include "common/cuda/buffer.cuh"
#include "common/cuda/check.cuh"
#include "common/cuda/timing.cuh"
#include "common/device.hpp"
#include "common/errors.hpp"
#include "common/index.hpp"
#include "common/online_softmax.hpp"
#include "gqa_mla/gqa_mla_gpu.hpp"
#include "gqa_mla/ampere_packed.cuh"
#include "gqa_mla/mla_decode.cuh"
#include "gqa_mla/mla_final.cuh"
#if CH06_HAVE_HOPPER
#include "chapters/05_fa3_hopper/step_args.cuh"  // chapter 05's file, by path: make_step_args()
#include "gqa_mla/packed_fwd.cuh"
#endif

namespace attn::ch06 {

bool hopper_ready(std::string* why) {
  std::string reason;
  const auto dev = query_device(&reason);
  if (!dev) {
    if (why) *why = reason;
    return false;
  }
  if (!CH06_HAVE_HOPPER || !hopper_device(*dev, "the packed forward", why)) {
    if (why) *why += ": its rows are skipped";
    return false;
  }
  return true;
}

bool packed_fwd_supports(const Problem& p, std::string* why) {
  auto no = [&](const std::string& w) {
    if (why) *why = "packed forward: " + w;
    return false;
  };
  if (p.dtype != DType::bf16) return no("bf16 only");
  if (!((p.d == 128 && p.dv == 128) || (p.d == 192 && p.dv == 128))) return no("(d, dv) = (128, 128) or (192, 128) only");
  return true;
}

bool packed_sm80_supports(const Problem& p, std::string* why) {
  auto no = [&](const std::string& w) {
    if (why) *why = "packed sm_80 forward: " + w;
    return false;
  };
  if (p.dtype != DType::bf16 && p.dtype != DType::f16) return no("bf16 or fp16 only");
  if (p.d != p.dv || (p.d != 64 && p.d != 128 && p.d != 256)) return no("d = dv in {64, 128, 256} only");
  return true;
}

namespace {

int sm_count() {
  int dev = 0, sms = 0;
  CUDA_CHECK(cudaGetDevice(&dev));
  CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
  return sms;
}

#if CH06_HAVE_HOPPER
ch05::PreparedStep prepare_packed(const Problem& p, const void* q, const void* k, const void* v, void* o, float* lse,
                                  bool pack) {
  return packed::prepare(ch05::make_step_args(p, q, k, v, o, lse), pack);
}
#endif

void cublas_check(cublasStatus_t s, const char* what) {
  if (s != CUBLAS_STATUS_SUCCESS) throw CudaError(std::string(what) + ": cuBLAS status " + std::to_string(int(s)));
}

/// [q_nope ; q_rope] -> Q [B][H][Nq][192], and the cache's k_rope (columns 512..575 of
/// [B][Nk][576]) into columns 128..191 of every head's K [B][H][Nk][192].
__global__ void concat_kernel(const __nv_bfloat16* q_nope, const __nv_bfloat16* q_rope, const __nv_bfloat16* cache,
                              __nv_bfloat16* q, __nv_bfloat16* k, int batch, int heads, int nq, int nk) {
  const std::size_t q_rows = std::size_t(batch) * heads * nq, k_rows = std::size_t(batch) * heads * nk;
  for (std::size_t i = std::size_t(blockIdx.x) * blockDim.x + threadIdx.x; i < (q_rows + k_rows) * 192;
       i += std::size_t(gridDim.x) * blockDim.x) {
    const std::size_t row = i / 192;
    const int c = int(i % 192);
    if (row < q_rows) {
      q[i] = c < 128 ? q_nope[row * 128 + c] : q_rope[row * 64 + c - 128];
    } else if (c >= 128) {
      const std::size_t kr = row - q_rows;                           // (b, h, t)
      const std::size_t b = kr / (std::size_t(heads) * nk), t = kr % nk;  // k_rope is shared by the heads
      k[kr * 192 + c] = cache[(b * nk + t) * 576 + 512 + c - 128];
    }
  }
}

/// Values in [-1, 1) from a hash of the index: inputs for timing runs, made on the device.
__global__ void fill_hash_kernel(__nv_bfloat16* x, std::size_t n, unsigned seed) {
  for (std::size_t i = std::size_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += std::size_t(gridDim.x) * blockDim.x) {
    unsigned h = unsigned(i) * 2654435761u ^ seed;
    h ^= h >> 15;
    h *= 2246822519u;
    h ^= h >> 13;
    x[i] = __float2bfloat16_rn(float(h & 0xffff) / 32768.0f - 1.0f);
  }
}

void fill_hash(DeviceTensor& t, unsigned seed) {
  constexpr int kBlocks = 1024, kThreadsPerBlock = 256;
  fill_hash_kernel<<<kBlocks, kThreadsPerBlock>>>(t.as<__nv_bfloat16>(), t.size(), seed);
  CUDA_CHECK_LAUNCH("fill_hash_kernel");
}

}  // namespace

GpuResult packed_forward_bench(const Problem& p, bool pack) {
  std::string why;
  if (!packed_fwd_supports(p, &why) || !hopper_ready(&why)) throw UsageError(why);
#if CH06_HAVE_HOPPER
  DeviceTensor q(p.dtype, p.q_elems()), k(p.dtype, p.k_elems()), v(p.dtype, p.v_elems()), o(p.dtype, p.o_elems());
  DeviceBuffer<float> lse(p.lse_elems());
  fill_hash(q, 1);
  fill_hash(k, 2);
  fill_hash(v, 3);
  const ch05::PreparedStep step = prepare_packed(p, q.data(), k.data(), v.data(), o.data(), lse.get(), pack);
  GpuResult r;
  r.grid = step.grid;
  r.smem_bytes = step.smem_bytes;
  r.time_ms = time_gpu(step.launch).median_ms;
  return r;
#else
  (void)pack;
  throw UsageError("built without the sm_90a kernels");
#endif
}

GpuResult packed_forward_gpu(const Problem& p, const AttnInputs& in, bool pack, bool time) {
  std::string why;
  if (!packed_fwd_supports(p, &why)) throw UsageError(why);
  if (!hopper_ready(&why)) throw UsageError(why);
#if CH06_HAVE_HOPPER
  const DeviceTensor q = DeviceTensor::from_host(in.q, p.dtype), k = DeviceTensor::from_host(in.k, p.dtype),
                     v = DeviceTensor::from_host(in.v, p.dtype);
  DeviceTensor o(p.dtype, p.o_elems());
  DeviceBuffer<float> lse(p.lse_elems());
  const ch05::PreparedStep step = prepare_packed(p, q.data(), k.data(), v.data(), o.data(), lse.get(), pack);
  GpuResult r;
  r.grid = step.grid;
  r.smem_bytes = step.smem_bytes;
  o.poison();
  lse.poison();
  step.launch();
  CUDA_CHECK(cudaDeviceSynchronize());
  r.o = o.to_host();
  r.lse = lse.download();
  if (time) r.time_ms = time_gpu(step.launch).median_ms;
  return r;
#else
  (void)in, (void)pack, (void)time;
  throw UsageError("built without the sm_90a kernels");
#endif
}

// ----------------------------------------------------------------------------- packed, sm_80

namespace {

/// The launch of the sm_80 packed forward on uploaded tensors.
std::function<void()> sm80_launch(const Problem& p, const void* q, const void* k, const void* v, void* o, float* lse,
                                  bool pack) {
  ch04::FwdParams f{};
  f.q = q, f.k = k, f.v = v, f.o = o, f.lse = lse;
  f.batch = p.batch, f.heads = p.heads, f.kv_heads = p.kv_heads, f.nq = p.nq, f.nk = p.nk, f.d = p.d;
  f.scale = float(p.softmax_scale());
  f.scale_log2 = float(p.softmax_scale() * kLog2e);
  f.causal = p.causal;
  const DType t = p.dtype;
  return [f, t, pack] {
    if (!ampere_packed::launch(f, t, nullptr, pack)) throw UsageError("packed sm_80 forward: no kernel for this problem");
    CUDA_CHECK_LAUNCH("ampere_packed fwd_kernel");
  };
}

}  // namespace

GpuResult packed_forward_sm80_gpu(const Problem& p, const AttnInputs& in, bool pack, bool time) {
  std::string why;
  if (!packed_sm80_supports(p, &why)) throw UsageError(why);
  const DeviceTensor q = DeviceTensor::from_host(in.q, p.dtype), k = DeviceTensor::from_host(in.k, p.dtype),
                     v = DeviceTensor::from_host(in.v, p.dtype);
  DeviceTensor o(p.dtype, p.o_elems());
  DeviceBuffer<float> lse(p.lse_elems());
  const auto launch = sm80_launch(p, q.data(), k.data(), v.data(), o.data(), lse.get(), pack);
  o.poison();
  lse.poison();
  launch();
  CUDA_CHECK(cudaDeviceSynchronize());
  GpuResult r;
  r.o = o.to_host();
  r.lse = lse.download();
  r.grid = ceil_div(p.nq * (pack ? p.group() : 1), 128) * p.batch * (pack ? p.kv_heads : p.heads);
  if (time) r.time_ms = time_gpu(launch).median_ms;
  return r;
}

GpuResult packed_forward_sm80_bench(const Problem& p, bool pack) {
  std::string why;
  if (!packed_sm80_supports(p, &why)) throw UsageError(why);
  DeviceTensor q(p.dtype, p.q_elems()), k(p.dtype, p.k_elems()), v(p.dtype, p.v_elems()), o(p.dtype, p.o_elems());
  DeviceBuffer<float> lse(p.lse_elems());
  fill_hash(q, 1);
  fill_hash(k, 2);
  fill_hash(v, 3);
  GpuResult r;
  r.grid = ceil_div(p.nq * (pack ? p.group() : 1), 128) * p.batch * (pack ? p.kv_heads : p.heads);
  r.time_ms = time_gpu(sm80_launch(p, q.data(), k.data(), v.data(), o.data(), lse.get(), pack)).median_ms;
  return r;
}

// ----------------------------------------------------------------------------- MLA

namespace {

/// The uploaded MLA inputs: the cache as stored ([c ; k_rope] per token), queries, weights.
struct MlaDevice {
  DeviceTensor kv, q_nope, q_rope, w_uk, w_uv;
  MlaDevice(const MlaShape& s, const MlaInputs& in) {
    std::vector<float> cache(std::size_t(s.batch) * s.nk * kDLatentKey);
    for (std::size_t t = 0; t < std::size_t(s.batch) * s.nk; ++t) {
      std::copy_n(&in.c[t * kDC], kDC, &cache[t * kDLatentKey]);
      std::copy_n(&in.k_rope[t * kDRope], kDRope, &cache[t * kDLatentKey + kDC]);
    }
    kv = DeviceTensor::from_host(cache, DType::bf16);
    q_nope = DeviceTensor::from_host(in.q_nope, DType::bf16);
    q_rope = DeviceTensor::from_host(in.q_rope, DType::bf16);
    w_uk = DeviceTensor::from_host(in.w_uk, DType::bf16);
    w_uv = DeviceTensor::from_host(in.w_uv, DType::bf16);
  }
  /// Device-generated inputs of the right shapes (timing runs).
  explicit MlaDevice(const MlaShape& s)
      : kv(DType::bf16, std::size_t(s.batch) * s.nk * kDLatentKey),
        q_nope(DType::bf16, std::size_t(s.batch) * s.heads * s.nq * kDNope),
        q_rope(DType::bf16, std::size_t(s.batch) * s.heads * s.nq * kDRope),
        w_uk(DType::bf16, std::size_t(s.heads) * kDC * kDNope),
        w_uv(DType::bf16, std::size_t(s.heads) * kDC * kDV) {
    fill_hash(kv, 1);
    fill_hash(q_nope, 2);
    fill_hash(q_rope, 3);
    fill_hash(w_uk, 4);
    fill_hash(w_uv, 5);
  }
};

}  // namespace

double mla_device_bytes(const MlaShape& s, bool decompress) {
  const double B = s.batch, H = s.heads, nq = s.nq, nk = s.nk;
  double bytes = 2 * (B * nk * kDLatentKey + B * H * nq * (kDNope + kDRope + kDLatentKey + kDC + kDV) +
                      2 * H * kDC * kDNope);
  bytes += 4 * B * H * nq * (kDC + 2) * kMlaMaxSplits;  // split partials, at most kMlaMaxSplits ranges
  if (decompress) bytes += 2 * B * H * (nk * (kDQK + kDV) + nq * kDQK) + 4 * B * H * nq;
  return bytes;
}

namespace {

/// The absorbed decode on uploaded tensors `d`: checked once (outputs poisoned), then
/// timed when `time`.
MlaGpuResult absorb_run(const MlaShape& s, const MlaDevice& d, int splits, bool time, int variant, int tile64,
                        int combine, int combine_parts, bool pdl);

/// Whether the decode asked for is the final one (no lab form) and the GPU runs mla_final.cu
/// (sm_90a, hopper_ready()); elsewhere, and for the lab's forms, mla_decode.cu's kernels.
bool final_decode(int variant, int tile64, int combine, int combine_parts, bool pdl) {
  return CH06_HAVE_HOPPER && variant == 0 && tile64 == kTile64Wgmma && combine == kCombineAuto &&
         combine_parts == 0 && pdl && hopper_ready(nullptr);
}

/// The key ranges of mla_decode.cu's kernels (the lab's forms, and GPUs that are not sm_90a).
MlaRanges lab_ranges(const MlaShape& s, int splits, int small_variant) {
  const int rows = s.heads * s.nq;
  const int per_tile = rows <= mla::kRowsSmall ? mla::kRowsSmall : mla::kRowsLarge;
  const int kpb = mla::keys_per_block(per_tile, small_variant);
  const int tiles = ceil_div(rows, per_tile), nblocks = ceil_div(s.nk, kpb);
  // Split-K: whole waves of (tile, range, sequence) blocks (mla_pick_splits(), mla_model.hpp).
  if (splits <= 0)
    splits = mla_pick_splits(tiles, s.batch, nblocks, sm_count() * mla::blocks_per_sm(per_tile, small_variant),
                             per_tile == mla::kRowsLarge ? 2 : 1);
  const int bps = ceil_div(nblocks, std::min(splits, nblocks));
  MlaRanges r;
  r.ranges = ceil_div(nblocks, bps);  // no empty ranges
  r.keys_per_range = bps * kpb;
  return r;
}

}  // namespace

MlaRanges mla_absorb_ranges(const MlaShape& s, int splits, int small_variant) {
#if CH06_HAVE_HOPPER
  if (final_decode(small_variant, kTile64Wgmma, kCombineAuto, 0, true)) {
    const mla::FinalPlan f = mla::final_plan(s.batch, s.heads * s.nq, s.nk, splits, sm_count());
    return {f.splits, f.blocks_per_split * f.keys_per_block};
  }
#endif
  return lab_ranges(s, splits, small_variant);
}

MlaGpuResult mla_absorb_gpu(const MlaShape& s, const MlaInputs& in, int splits, bool time, int small_variant,
                            int tile64, int combine, int combine_parts, bool pdl) {
  validate(s);
  return absorb_run(s, MlaDevice(s, in), splits, time, small_variant, tile64, combine, combine_parts, pdl);
}

const char* small_variant_label(int small_variant) { return mla::small_variant_name(small_variant); }

MlaGpuResult mla_absorb_bench(const MlaShape& s, int splits, int small_variant, int tile64, int combine,
                              int combine_parts, bool pdl) {
  validate(s);
  return absorb_run(s, MlaDevice(s), splits, true, small_variant, tile64, combine, combine_parts, pdl);
}

namespace {

MlaGpuResult absorb_run(const MlaShape& s, const MlaDevice& d, int splits, bool time, int variant, int tile64,
                        int combine, int combine_parts, bool pdl) {
  if (combine_parts != 0 && combine_parts != 4 && combine_parts != 8 && combine_parts != 16)
    throw UsageError("the combine's column parts: 4, 8 or 16 (0: from the grid)");
  const int rows = s.heads * s.nq;
  // The final decode (mla_final.cu): its table's row for `rows` gives the tile, ranges and merge.
  const bool final_path = final_decode(variant, tile64, combine, combine_parts, pdl);
  mla::FinalPlan plan;
#if CH06_HAVE_HOPPER
  if (final_path) plan = mla::final_plan(s.batch, rows, s.nk, splits, sm_count());
#endif
  const int per_tile = final_path ? plan.tile_rows : rows <= mla::kRowsSmall ? mla::kRowsSmall : mla::kRowsLarge;
  // Otherwise the 64-row tile: wgmma + TMA (mla_decode_sm90.cu) where the GPU is sm_90 and the
  // binary carries the Hopper kernels, unless mma.sync is asked for; mma.sync elsewhere.
  const bool wgmma = !final_path && per_tile == mla::kRowsLarge && tile64 != kTile64Mma && hopper_ready(nullptr);
  const int release = tile64 == kTile64WgmmaSync    ? mla::kReleaseSync
                      : tile64 == kTile64WgmmaBlock ? mla::kReleaseBlock
                      : tile64 == kTile64WgmmaLockstep ? mla::kReleaseLockstep
                      : tile64 == kTile64WgmmaHalves ? mla::kHalves
                      : tile64 == kTile64WgmmaArrive ? mla::kReleaseArrive
                                                    : mla::kReleasePhased;
  const int tiles = ceil_div(rows, per_tile);
  const MlaRanges rg = final_path ? MlaRanges{plan.splits, plan.blocks_per_split * plan.keys_per_block}
                                  : lab_ranges(s, splits, variant);
  splits = rg.ranges;
  const int bps = final_path ? plan.blocks_per_split : rg.keys_per_range / mla::keys_per_block(per_tile, variant);
  DeviceTensor q(DType::bf16, std::size_t(s.batch) * rows * kDLatentKey), o_c(DType::bf16, std::size_t(s.batch) * rows * kDC),
      o(DType::bf16, std::size_t(s.batch) * rows * kDV);
  DeviceBuffer<float> o_part(std::size_t(s.batch) * splits * rows * kDC), ml_part(std::size_t(s.batch) * splits * rows * 2);
  mla::DecodeParams p;
  p.q = q.as<__nv_bfloat16>();
  p.kv = d.kv.as<__nv_bfloat16>();
  p.o_part = o_part.get();
  p.ml_part = ml_part.get();
  p.batch = s.batch, p.rows = rows, p.nq = s.nq, p.nk = s.nk, p.splits = splits, p.blocks_per_split = bps;
  p.scale_log2 = float(s.scale() * kLog2e);
  p.combine_parts = final_path ? plan.combine_parts : combine_parts;
  p.pdl = final_path ? plan.pdl : pdl;
  p.combine_general = combine == kCombineGeneral;
  // The fused combine: the mma.sync kernels, at most kFuseMaxSplits ranges (mla_decode.cuh).
  const bool fused = !wgmma && combine == kCombineFused && splits <= mla::kFuseMaxSplits;
  // The cluster merge: exactly 2 ranges, sm_90 (mla_decode.cuh), on every decode kernel.
  const bool cluster = final_path ? plan.cluster
                                  : (combine == kCombineCluster || combine == kCombineAuto) && splits == 2 &&
                                        hopper_ready(nullptr);
  p.cluster_merge = cluster;
  if (cluster) p.o_c = o_c.as<__nv_bfloat16>();
  DeviceBuffer<int> counters(fused ? std::size_t(s.batch) * tiles : 1);
  if (fused) {
    CUDA_CHECK(cudaMemset(counters.get(), 0, std::size_t(s.batch) * tiles * sizeof(int)));
    p.counters = counters.get();
    p.o_c = o_c.as<__nv_bfloat16>();
  }
  auto absorb_q = [&] {
    mla::launch_absorb_q(d.q_nope.as<__nv_bfloat16>(), d.q_rope.as<__nv_bfloat16>(), d.w_uk.as<__nv_bfloat16>(),
                         q.as<__nv_bfloat16>(), s.batch, s.heads, s.nq);
  };
  auto attend = [&] {
#if CH06_HAVE_HOPPER
    if (final_path) {
      mla::launch_final(p, o_c.as<__nv_bfloat16>());
      return;
    }
    if (wgmma)
      mla::launch_decode_sm90(p, release);
    else
#endif
      mla::launch_decode(p, per_tile, variant);
    if (!fused && !cluster) mla::launch_combine(p, o_c.as<__nv_bfloat16>());
  };
  auto project = [&] {
    mla::launch_project(o_c.as<__nv_bfloat16>(), d.w_uv.as<__nv_bfloat16>(), o.as<__nv_bfloat16>(), s.batch, s.heads,
                        s.nq);
  };
  q.poison();
  o_c.poison();
  o.poison();
  o_part.poison();
  ml_part.poison();
  absorb_q();
  attend();
  project();
  CUDA_CHECK(cudaDeviceSynchronize());
  MlaGpuResult r;
  r.o = o.to_host();
  r.splits = splits;
  r.head_tile = per_tile;
  r.what = std::string(final_path ? "q_c GEMM, mla_final.cu decode (" : "q_c GEMM, decode (") + std::to_string(tiles) +
           " x " + std::to_string(splits) + " x " + std::to_string(s.batch) + " blocks of " + std::to_string(per_tile) +
           " rows" +
           (final_path                    ? std::string(", ") + plan.kernel
            : per_tile == mla::kRowsSmall ? std::string(", ") + mla::small_variant_name(variant)
                                        : std::string(!wgmma                          ? ", mma.sync"
                                                      : release == mla::kReleaseSync ? ", wgmma, P released by bar.sync"
                                                      : release == mla::kReleaseBlock
                                                          ? ", wgmma, P released by bar.sync on barrier 0"
                                                      : release == mla::kReleaseLockstep
                                                          ? ", wgmma, lockstep at __syncthreads()"
                                                      : release == mla::kHalves
                                                          ? ", wgmma, the key block in halves"
                                                      : release == mla::kReleaseArrive
                                                          ? ", wgmma, P released by bar.arrive"
                                                                                     : ", wgmma")) +
           (cluster ? "), the 2 ranges merged in a cluster"
            : fused ? "), fused combine"
                  : "), combine in " + std::to_string(mla::combine_parts(p, sm_count())) + " parts" +
                        (mla::combine_one_trip(p, mla::combine_parts(p, sm_count())) ? ", one trip" : "")) +
           (fused || cluster || !p.pdl || !hopper_ready(nullptr) ? "" : " (dependent launch)") + ", W_UV GEMM";
  if (time) {
    r.attn_ms = time_gpu(attend).median_ms;
    r.total_ms = time_gpu([&] {
                   absorb_q();
                   attend();
                   project();
                 }).median_ms;
  }
  return r;
}

}  // namespace

MlaGpuResult mla_decompress_gpu(const MlaShape& s, const MlaInputs& in, bool time) {
  validate(s);
  std::string why;
  if (!hopper_ready(&why)) throw UsageError(why);
#if CH06_HAVE_HOPPER
  const MlaDevice d(s, in);
  const Problem pd = s.decompressed();
  DeviceTensor q(DType::bf16, pd.q_elems()), k(DType::bf16, pd.k_elems()), v(DType::bf16, pd.v_elems()),
      o(DType::bf16, pd.o_elems());
  DeviceBuffer<float> lse(pd.lse_elems());
  // The latent c alone, [B][Nk][512]: the A operand of the K/V GEMMs (the cache keeps it
  // interleaved with k_rope, so the GEMMs read it with a row pitch of 576).
  cublasHandle_t h;
  cublas_check(cublasCreate(&h), "cublasCreate");
  const float one = 1.f, zero = 0.f;
  auto gemms = [&] {
    for (int b = 0; b < s.batch; ++b) {
      // Column-major view: K_nope^T (128 x Nk) = W_UK[h]^T (128 x 512) C_b^T (512 x Nk), batched over heads.
      const __nv_bfloat16* c = d.kv.as<__nv_bfloat16>() + std::size_t(b) * s.nk * kDLatentKey;
      cublas_check(cublasGemmStridedBatchedEx(h, CUBLAS_OP_N, CUBLAS_OP_N, kDNope, s.nk, kDC, &one, d.w_uk.data(),
                                              CUDA_R_16BF, kDNope, long(kDC) * kDNope, c, CUDA_R_16BF, kDLatentKey, 0,
                                              &zero, k.as<__nv_bfloat16>() + std::size_t(b) * s.heads * s.nk * kDQK,
                                              CUDA_R_16BF, kDQK, long(s.nk) * kDQK, s.heads, CUBLAS_COMPUTE_32F,
                                              CUBLAS_GEMM_DEFAULT),
                   "K GEMM");
      cublas_check(cublasGemmStridedBatchedEx(h, CUBLAS_OP_N, CUBLAS_OP_N, kDV, s.nk, kDC, &one, d.w_uv.data(),
                                              CUDA_R_16BF, kDV, long(kDC) * kDV, c, CUDA_R_16BF, kDLatentKey, 0, &zero,
                                              v.as<__nv_bfloat16>() + std::size_t(b) * s.heads * s.nk * kDV,
                                              CUDA_R_16BF, kDV, long(s.nk) * kDV, s.heads, CUBLAS_COMPUTE_32F,
                                              CUBLAS_GEMM_DEFAULT),
                   "V GEMM");
    }
    concat_kernel<<<1024, 256>>>(d.q_nope.as<__nv_bfloat16>(), d.q_rope.as<__nv_bfloat16>(),
                                 d.kv.as<__nv_bfloat16>(), q.as<__nv_bfloat16>(), k.as<__nv_bfloat16>(), s.batch,
                                 s.heads, s.nq, s.nk);
    CUDA_CHECK_LAUNCH("concat_kernel");
  };
  const ch05::PreparedStep step = prepare_packed(pd, q.data(), k.data(), v.data(), o.data(), lse.get(), false);
  q.poison();
  k.poison();
  v.poison();
  o.poison();
  gemms();
  step.launch();
  CUDA_CHECK(cudaDeviceSynchronize());
  MlaGpuResult r;
  r.o = o.to_host();
  r.what = "cuBLAS K/V GEMMs (" + std::to_string(s.batch) + " x 2 batched over heads), concat, packed_fwd d=192 dv=128";
  if (time) {
    r.attn_ms = time_gpu(step.launch).median_ms;
    r.total_ms = time_gpu([&] {
                   gemms();
                   step.launch();
                 }).median_ms;
  }
  cublasDestroy(h);
  return r;
#else
  (void)in, (void)time;
  throw UsageError("built without the sm_90a kernels");
#endif
}

}  // namespace attn::ch06
