// Chapter 07's GPU side: the decode batch on the device, the pool filled from
// kv_value(), the contiguous copy, and the dispatch to the v1 and v2 launchers.
#include "decode_gpu.hpp"

#include <algorithm>
#include <type_traits>

#include "common/cuda/buffer.cuh"
#include "common/cuda/check.cuh"
#include "common/cuda/hopper/tma.cuh"
#include "common/cuda/timing.cuh"
#include "common/device.hpp"
#include "common/errors.hpp"
#include "kv_values.hpp"
#include "decode_steps.cuh"

namespace attn::ch07 {

const char* layout_name(KvLayout l) { return l == KvLayout::paged ? "paged" : "contiguous"; }

bool kernel_needs_hopper(DecodeKernel k) {
  return k == DecodeKernel::v7 || k == DecodeKernel::v8 || k == DecodeKernel::v9 || k == DecodeKernel::v10 ||
         k == DecodeKernel::v13 || k == DecodeKernel::v14 || k == DecodeKernel::final_8bit;
}

const char* kernel_name(DecodeKernel k) {
  switch (k) {
    case DecodeKernel::v1: return "v1";
    case DecodeKernel::v2: return "v2";
    case DecodeKernel::v3: return "v3";
    case DecodeKernel::v4: return "v4";
    case DecodeKernel::v5: return "v5";
    case DecodeKernel::v6: return "v6";
    case DecodeKernel::v7: return "v7";
    case DecodeKernel::v8: return "v8";
    case DecodeKernel::v9: return "v9";
    case DecodeKernel::v10: return "v10";
    case DecodeKernel::v12: return "v12";
    case DecodeKernel::v13: return "v13";
    case DecodeKernel::v14: return "v14";
    case DecodeKernel::final_bf16: return "final-bf16";
    case DecodeKernel::final_8bit: return "final-8bit";
  }
  return "?";
}

namespace {

using gpu::bf16;

/// K and V pools from kv_value(): the same numbers the host gathers for the reference.
__global__ void fill_pools_kernel(bf16* k, bf16* v, std::size_t n, uint64_t seed, Dist dist) {
  for (std::size_t i = std::size_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += std::size_t(gridDim.x) * blockDim.x) {
    k[i] = __float2bfloat16_rn(kv_value(seed, kStreamK, i, dist));
    v[i] = __float2bfloat16_rn(kv_value(seed, kStreamV, i, dist));
  }
}

/// An 8-bit (or INT4) pool from kv_value(): one block per (page, KV head) finds the amax
/// of the page's P * D bf16 values, sets the scale amax / Q (common/quant8.hpp), and
/// stores the codes, exactly as pool_scales() and fill_pools() do on the host (INT4: two
/// per byte, packed as kv_pack_codes() packs them).
template <KvDtype F>
__global__ void fill_pools8_kernel(uint8_t* k, uint8_t* v, float* k_scale, float* v_scale, std::size_t per,
                                   uint64_t seed, Dist dist) {
  const std::size_t base = std::size_t(blockIdx.x) * per;
  __shared__ float red[2][32];
  float ak = 0.f, av = 0.f;
  for (std::size_t i = threadIdx.x; i < per; i += blockDim.x) {
    ak = fmaxf(ak, fabsf(__bfloat162float(__float2bfloat16_rn(kv_value(seed, kStreamK, base + i, dist)))));
    av = fmaxf(av, fabsf(__bfloat162float(__float2bfloat16_rn(kv_value(seed, kStreamV, base + i, dist)))));
  }
  for (int o = 16; o > 0; o /= 2) {
    ak = fmaxf(ak, __shfl_xor_sync(0xffffffffu, ak, o));
    av = fmaxf(av, __shfl_xor_sync(0xffffffffu, av, o));
  }
  if (threadIdx.x % 32 == 0) red[0][threadIdx.x / 32] = ak, red[1][threadIdx.x / 32] = av;
  __syncthreads();
  ak = av = 0.f;
  for (int w = 0; w < int(blockDim.x / 32); ++w) ak = fmaxf(ak, red[0][w]), av = fmaxf(av, red[1][w]);
  const float qmax = kv_qmax(F);
  const float sk = q8::block_scale(ak, qmax), sv = q8::block_scale(av, qmax);
  const float ik = q8::inverse_scale(sk), iv = q8::inverse_scale(sv);
  if (threadIdx.x == 0) k_scale[blockIdx.x] = sk, v_scale[blockIdx.x] = sv;
  if constexpr (F == KvDtype::int4) {  // two codes per byte: element 2i in the low nibble of byte i
    for (std::size_t i = 2 * threadIdx.x; i < per; i += 2 * blockDim.x) {
      uint8_t kb = 0, vb = 0;
      for (int e = 0; e < 2; ++e) {
        const float x = __bfloat162float(__float2bfloat16_rn(kv_value(seed, kStreamK, base + i + e, dist))) * ik;
        const float y = __bfloat162float(__float2bfloat16_rn(kv_value(seed, kStreamV, base + i + e, dist))) * iv;
        kb |= uint8_t(q8::int4_nibble(q8::int4_encode(x)) << (4 * e));
        vb |= uint8_t(q8::int4_nibble(q8::int4_encode(y)) << (4 * e));
      }
      k[(base + i) / 2] = kb;
      v[(base + i) / 2] = vb;
    }
  } else {
    for (std::size_t i = threadIdx.x; i < per; i += blockDim.x) {
      const float x = __bfloat162float(__float2bfloat16_rn(kv_value(seed, kStreamK, base + i, dist))) * ik;
      const float y = __bfloat162float(__float2bfloat16_rn(kv_value(seed, kStreamV, base + i, dist))) * iv;
      if constexpr (F == KvDtype::fp8) {
        k[base + i] = q8::e4m3_encode(x);
        v[base + i] = q8::e4m3_encode(y);
      } else {
        k[base + i] = uint8_t(q8::int8_encode(x));
        v[base + i] = uint8_t(q8::int8_encode(y));
      }
    }
  }
}

/// Gathers every sequence's rows through its block table into [B][Hkv][ld][d].
/// Grid (ceil(ld / 8), Hkv, B); each block copies 8 rows, 16 bytes per thread per step.
__global__ void gather_contiguous_kernel(const bf16* k_pool, const bf16* v_pool, bf16* k, bf16* v, const int* table,
                                         const int* lens, int max_pages, int kv_heads, int page_shift, int d, int ld) {
  const int b = blockIdx.z, hk = blockIdx.y, t0 = blockIdx.x * 8;
  const int chunks = d / 8;
  for (int e = threadIdx.x; e < 8 * chunks; e += blockDim.x) {
    const int t = t0 + e / chunks, ch = e % chunks;
    if (t >= lens[b] || t >= ld) continue;
    const int page = table[std::size_t(b) * max_pages + (t >> page_shift)];
    const std::size_t src = ((std::size_t(page) * kv_heads + hk) << page_shift) + (t & ((1 << page_shift) - 1));
    const std::size_t dst = (std::size_t(b) * kv_heads + hk) * ld + t;
    reinterpret_cast<uint4*>(k + dst * d)[ch] = reinterpret_cast<const uint4*>(k_pool + src * d)[ch];
    reinterpret_cast<uint4*>(v + dst * d)[ch] = reinterpret_cast<const uint4*>(v_pool + src * d)[ch];
  }
}

int log2_exact(int x) {
  int s = 0;
  while ((1 << s) < x) ++s;
  return s;
}

template <class F>
void dispatch_head_dim(int d, F&& f) {
  if (d == 64) f(std::integral_constant<int, 64>{});
  else if (d == 128) f(std::integral_constant<int, 128>{});
  else throw UsageError("the decode kernels support head dims 64 and 128, got " + std::to_string(d));
}

}  // namespace

struct GpuDecoder::Impl {
  DecodeBatch batch;
  DeviceTensor q, o;
  DeviceBuffer<float> lse, part_m, part_l, part_o;
  DeviceBuffer<int> lens, table;
  DeviceBuffer<bf16> k_pool, v_pool, k_contig, v_contig;
  DeviceBuffer<uint8_t> k8, v8;           ///< 8-bit pools
  DeviceBuffer<float> k_scale, v_scale;   ///< their scales, [num_pages][kv_heads]
  DeviceBuffer<int> arrivals;             ///< v3's counters, [B][Hkv x chunks], zero between steps
  int ld = 0, sms = 0, part_splits = 0;

  void ensure_contiguous() {
    if (kv_quantised(batch.kv_dtype)) throw UsageError("the contiguous baseline is bf16 only");
    if (k_contig.size()) return;
    const DecodeBatch& b = batch;
    ld = b.max_len();
    const std::size_t n = std::size_t(b.batch()) * b.kv_heads * ld * b.d;
    k_contig = DeviceBuffer<bf16>(n);
    v_contig = DeviceBuffer<bf16>(n);
    k_contig.zero();
    v_contig.zero();
    gather_contiguous_kernel<<<dim3((ld + 7) / 8, b.kv_heads, b.batch()), 128>>>(
        k_pool.get(), v_pool.get(), k_contig.get(), v_contig.get(), table.get(), lens.get(), b.max_pages,
        b.kv_heads, log2_exact(b.page_size), b.d, ld);
    CUDA_CHECK_LAUNCH("gather_contiguous_kernel");
  }

  /// v7's tensor maps over the 8-bit pools (made on first use).
  std::unique_ptr<gpu::v7::CodeMaps> maps;
  const gpu::v7::CodeMaps& code_maps() {
    if (!maps) {
      const DecodeBatch& b = batch;
      const uint32_t box = uint32_t(std::min(b.page_size, 64));
      const uint64_t outer = uint64_t(b.num_pages) * b.kv_heads;
      maps = std::make_unique<gpu::v7::CodeMaps>();
      maps->k = hopper::make_tensor_map_3d(k8.get(), CU_TENSOR_MAP_DATA_TYPE_UINT8, 1, uint64_t(b.d),
                                           uint64_t(b.page_size), outer, uint32_t(b.d), box);
      maps->v = hopper::make_tensor_map_3d(v8.get(), CU_TENSOR_MAP_DATA_TYPE_UINT8, 1, uint64_t(b.d),
                                           uint64_t(b.page_size), outer, uint32_t(b.d), box);
    }
    return *maps;
  }

  void ensure_partials(int splits) {
    if (splits <= part_splits) return;
    const std::size_t rows = std::size_t(batch.batch()) * batch.heads * splits;
    part_m = DeviceBuffer<float>(rows);
    part_l = DeviceBuffer<float>(rows);
    part_o = DeviceBuffer<float>(rows * batch.d);
    part_splits = splits;
  }

  void launch(DecodeKernel kernel, int splits, KvLayout layout) {
    const DecodeBatch& b = batch;
    gpu::DecodeParams p{};
    p.q = q.as<bf16>();
    p.o = o.as<bf16>();
    p.lse = lse.get();
    p.lens = lens.get();
    p.heads = b.heads;
    p.group = b.group();
    p.chunks = head_chunks(b.group());
    p.scale = float(b.softmax_scale());
    if (kernel == DecodeKernel::v1) splits = 1;
    p.splits = splits;
    p.split_keys = keys_per_split(b.max_len(), splits);  // v5's fixed split size
    if (kernel != DecodeKernel::v1) {
      p.part_m = part_m.get();
      p.part_l = part_l.get();
      p.part_o = part_o.get();
      p.arrivals = arrivals.get();
    }
    dispatch_head_dim(b.d, [&](auto dc) {
      constexpr int D = decltype(dc)::value;
      auto go = [&](const auto& kv) {
        if constexpr (!std::is_same_v<std::decay_t<decltype(kv)>, gpu::ContiguousKv>) {
          if constexpr (!kv_quantised(std::decay_t<decltype(kv)>::kDtype)) {
            if (kernel == DecodeKernel::v12) return gpu::v12::launch<D>(p, kv, b.batch(), b.kv_heads);
            if (kernel == DecodeKernel::v14) return gpu::v14::launch<D>(p, kv, b.batch(), b.kv_heads);
            if (kernel == DecodeKernel::final_bf16) return gpu::final_bf16::launch<D>(p, kv, b.batch(), b.kv_heads);
          }
          // INT4 pages run v1-v3 only (prepare() refuses the others): nothing else is instantiated for them.
          constexpr KvDtype kF = std::decay_t<decltype(kv)>::kDtype;
          if constexpr (kF != KvDtype::int4) {
            if (kernel == DecodeKernel::v4) return gpu::v4::launch<D>(p, kv, b.batch(), b.kv_heads);
            if (kernel == DecodeKernel::v5) return gpu::v5::launch<D>(p, kv, b.batch(), b.kv_heads);
          }
          if constexpr (kv_quantised(kF) && kF != KvDtype::int4) {
            if (kernel == DecodeKernel::v6) return gpu::v6::launch<D>(p, kv, b.batch(), b.kv_heads);
            if (kernel == DecodeKernel::v7) return gpu::v7::launch<D>(p, kv, code_maps(), b.batch(), b.kv_heads);
            if (kernel == DecodeKernel::v9) return gpu::v9::launch<D>(p, kv, code_maps(), b.batch(), b.kv_heads);
            if (kernel == DecodeKernel::final_8bit)
              return gpu::final_8bit::launch<D>(p, kv, code_maps(), b.batch(), b.kv_heads);
#if TUTORIAL_LAB
            if (kernel == DecodeKernel::v8) return gpu::v8::launch<D>(p, kv, code_maps(), b.batch(), b.kv_heads);
            if (kernel == DecodeKernel::v10) return gpu::v10::launch<D>(p, kv, code_maps(), b.batch(), b.kv_heads);
            if (kernel == DecodeKernel::v13) return gpu::v13::launch<D>(p, kv, code_maps(), b.batch(), b.kv_heads);
#endif
          }
        }
        if (kernel == DecodeKernel::v3) gpu::v3::launch<D>(p, kv, b.batch(), b.kv_heads);
        else if (kernel == DecodeKernel::v2) gpu::v2::launch<D>(p, kv, b.batch(), b.kv_heads);
        else gpu::v1::launch<D>(p, kv, b.batch(), b.kv_heads);
      };
      const int shift = log2_exact(b.page_size);
      if (layout == KvLayout::contiguous) {
        go(gpu::ContiguousKv{k_contig.get(), v_contig.get(), b.kv_heads, ld});
      } else if (b.kv_dtype == KvDtype::bf16) {
        go(gpu::PagedKv{k_pool.get(), v_pool.get(), table.get(), b.max_pages, b.kv_heads, shift});
      } else if constexpr (D == 128) {  // 8-bit pages are built for d = 128
        if (b.kv_dtype == KvDtype::fp8)
          go(gpu::PagedKv8<KvDtype::fp8>{k8.get(), v8.get(), k_scale.get(), v_scale.get(), table.get(), b.max_pages,
                                         b.kv_heads, shift});
        else if (b.kv_dtype == KvDtype::int4)
          go(gpu::PagedKv8<KvDtype::int4>{k8.get(), v8.get(), k_scale.get(), v_scale.get(), table.get(),
                                          b.max_pages, b.kv_heads, shift});
        else
          go(gpu::PagedKv8<KvDtype::int8>{k8.get(), v8.get(), k_scale.get(), v_scale.get(), table.get(),
                                          b.max_pages, b.kv_heads, shift});
      }
    });
  }

  void prepare(DecodeKernel kernel, int splits, KvLayout layout) {
    if (splits < 1) throw UsageError("the split count must be >= 1");
    if (kernel_in_lab(kernel) && !TUTORIAL_LAB)
      throw UsageError(std::string(kernel_name(kernel)) +
                       " is a lab step, and this build has no lab (configure with -DTUTORIAL_LAB=ON)");
    if (batch.kv_dtype == KvDtype::int4 && kernel != DecodeKernel::v1 && kernel != DecodeKernel::v2 &&
        kernel != DecodeKernel::v3)
      throw UsageError(std::string(kernel_name(kernel)) +
                       " is not built for INT4 pages (INT4 runs v1, v2 and v3: the 8-bit steps from v4 on convert "
                       "one-byte codes)");
    if (kernel_needs_hopper(kernel)) {
      std::string why;
      const auto dev = query_device(&why);
      if (!dev || !hopper_device(*dev, kernel_name(kernel), &why)) throw UsageError(why);
    }
    const bool bf16_only = kernel == DecodeKernel::v12 || kernel == DecodeKernel::v14 || kernel == DecodeKernel::final_bf16;
    if (bf16_only && kv_quantised(batch.kv_dtype))
      throw UsageError(std::string(kernel_name(kernel)) + " is built for bf16 pages (the 8-bit steps are v6-v10 and v13)");
    if ((kernel == DecodeKernel::v4 || kernel == DecodeKernel::v5 || bf16_only) && layout == KvLayout::contiguous)
      throw UsageError(std::string(kernel_name(kernel)) + " reads paged K/V only");
    const bool tma = kernel == DecodeKernel::v7 || kernel == DecodeKernel::v8 || kernel == DecodeKernel::v9 ||
                     kernel == DecodeKernel::v10 || kernel == DecodeKernel::v13 || kernel == DecodeKernel::final_8bit;
    if (tma && batch.page_size < gpu::v7::kMinPageSize)
      throw UsageError(std::string(kernel_name(kernel)) + " copies whole pages of at least " + std::to_string(gpu::v7::kMinPageSize) +
                       " tokens (a swizzled TMA box starts on a 1024-byte boundary), got " +
                       std::to_string(batch.page_size));
    if ((kernel == DecodeKernel::v6 || tma) && !kv_quantised(batch.kv_dtype))
      throw UsageError(std::string(kernel_name(kernel)) + " is built for the 8-bit caches only (its bf16 path would be v5's)");
    if (layout == KvLayout::contiguous) ensure_contiguous();
    if (kernel != DecodeKernel::v1) ensure_partials(splits);
    if (kernel != DecodeKernel::v1 && kernel != DecodeKernel::v2 && !arrivals.size()) {
      // v9, v10 and v13 take 8 heads per block, the others 16: room for twice head_chunks()' blocks.
      arrivals = DeviceBuffer<int>(std::size_t(batch.batch()) * batch.kv_heads * 2 * head_chunks(batch.group()));
      arrivals.zero();
    }
  }
};

GpuDecoder::GpuDecoder(const DecodeBatch& b, const std::vector<float>& q, const KvContents& kv)
    : impl_(std::make_unique<Impl>()) {
  validate(b);
  if (!decode_head_dim_supported(b.d))
    throw UsageError("the decode kernels support head dims 64 and 128, got " + std::to_string(b.d));
  if (b.batch() > 65535) throw UsageError("the decode kernels take at most 65535 sequences");
  Impl& m = *impl_;
  m.batch = b;
  int dev = 0;
  CUDA_CHECK(cudaGetDevice(&dev));
  CUDA_CHECK(cudaDeviceGetAttribute(&m.sms, cudaDevAttrMultiProcessorCount, dev));
  m.q = DeviceTensor::from_host(q, DType::bf16);
  m.o = DeviceTensor(DType::bf16, std::size_t(b.batch()) * b.heads * b.d);
  m.lse = DeviceBuffer<float>(std::size_t(b.batch()) * b.heads);
  m.lens = DeviceBuffer<int>(b.lens.size());
  m.lens.upload(b.lens);
  m.table = DeviceBuffer<int>(b.block_table.size());
  m.table.upload(std::vector<int>(b.block_table.begin(), b.block_table.end()));
  const std::size_t n = b.pool_elems();
  if (kv_quantised(b.kv_dtype)) {
    if (b.d != 128) throw UsageError("an 8-bit KV cache is built for head dim 128, got " + std::to_string(b.d));
    const std::size_t bytes = n / b.d * std::size_t(kv_row_bytes(b.kv_dtype, b.d));  // INT4: half a byte per code
    m.k8 = DeviceBuffer<uint8_t>(bytes);
    m.v8 = DeviceBuffer<uint8_t>(bytes);
    m.k_scale = DeviceBuffer<float>(b.scale_elems());
    m.v_scale = DeviceBuffer<float>(b.scale_elems());
    if (kv.pools) {
      if (kv.pools->dtype != b.kv_dtype) throw std::logic_error("GpuDecoder: the pools' format is not the batch's");
      m.k8.upload(kv_pack_codes(b.kv_dtype, kv.pools->k.data(), n));
      m.v8.upload(kv_pack_codes(b.kv_dtype, kv.pools->v.data(), n));
      m.k_scale.upload(kv.pools->k_scale);
      m.v_scale.upload(kv.pools->v_scale);
    } else {
      const std::size_t per = std::size_t(b.page_size) * b.d;
      auto fill = b.kv_dtype == KvDtype::fp8    ? fill_pools8_kernel<KvDtype::fp8>
                  : b.kv_dtype == KvDtype::int4 ? fill_pools8_kernel<KvDtype::int4>
                                                : fill_pools8_kernel<KvDtype::int8>;
      fill<<<unsigned(b.scale_elems()), 128>>>(m.k8.get(), m.v8.get(), m.k_scale.get(), m.v_scale.get(), per, kv.seed,
                                               kv.dist);
      CUDA_CHECK_LAUNCH("fill_pools8_kernel");
    }
  } else if (kv.pools) {
    const DeviceTensor k = DeviceTensor::from_host(kv.pools->k, DType::bf16);
    const DeviceTensor v = DeviceTensor::from_host(kv.pools->v, DType::bf16);
    m.k_pool = DeviceBuffer<bf16>(n);
    m.v_pool = DeviceBuffer<bf16>(n);
    CUDA_CHECK(cudaMemcpy(m.k_pool.get(), k.data(), n * 2, cudaMemcpyDeviceToDevice));
    CUDA_CHECK(cudaMemcpy(m.v_pool.get(), v.data(), n * 2, cudaMemcpyDeviceToDevice));
  } else {
    m.k_pool = DeviceBuffer<bf16>(n);
    m.v_pool = DeviceBuffer<bf16>(n);
    fill_pools_kernel<<<std::max(1, m.sms * 8), 256>>>(m.k_pool.get(), m.v_pool.get(), n, kv.seed, kv.dist);
    CUDA_CHECK_LAUNCH("fill_pools_kernel");
  }
  CUDA_CHECK(cudaDeviceSynchronize());
}

GpuDecoder::~GpuDecoder() = default;

int GpuDecoder::sms() const { return impl_->sms; }

namespace {
DecodeKernel default_kernel(int splits) { return splits > 1 ? DecodeKernel::v2 : DecodeKernel::v1; }
}  // namespace

GpuDecodeOutput GpuDecoder::run(int splits, KvLayout layout) { return run(default_kernel(splits), splits, layout); }

double GpuDecoder::time_ms(int splits, KvLayout layout) { return time_ms(default_kernel(splits), splits, layout); }

KvScales GpuDecoder::scales() const {
  KvScales s;
  if (impl_->k_scale.size()) {
    s.k = impl_->k_scale.download();
    s.v = impl_->v_scale.download();
  }
  return s;
}

GpuDecodeOutput GpuDecoder::run(DecodeKernel kernel, int splits, KvLayout layout) {
  Impl& m = *impl_;
  m.prepare(kernel, splits, layout);
  m.o.poison();
  m.lse.poison();
  if (kernel != DecodeKernel::v1) {  // scratch too: a split that forgot to write its state must show
    m.part_m.poison();
    m.part_l.poison();
    m.part_o.poison();
  }
  m.launch(kernel, splits, layout);
  CUDA_CHECK(cudaDeviceSynchronize());
  GpuDecodeOutput out;
  out.o = m.o.to_host();
  out.lse = m.lse.download();
  return out;
}

double GpuDecoder::time_ms(DecodeKernel kernel, int splits, KvLayout layout) {
  Impl& m = *impl_;
  m.prepare(kernel, splits, layout);
  return time_gpu([&] { m.launch(kernel, splits, layout); }).median_ms;
}

GpuDecodeOutput GpuDecoder::run_chain(DecodeKernel kernel, int splits, KvLayout layout, int steps) {
  if (steps < 1) throw UsageError("a chain needs at least one step");
  Impl& m = *impl_;
  m.prepare(kernel, splits, layout);
  m.o.poison();
  m.lse.poison();
  for (int i = 0; i < steps; ++i) m.launch(kernel, splits, layout);
  CUDA_CHECK(cudaDeviceSynchronize());
  GpuDecodeOutput out;
  out.o = m.o.to_host();
  out.lse = m.lse.download();
  return out;
}

double GpuDecoder::time_chain_ms(DecodeKernel kernel, int splits, KvLayout layout, int steps) {
  if (steps < 1) throw UsageError("a chain needs at least one step");
  Impl& m = *impl_;
  m.prepare(kernel, splits, layout);
  return time_gpu([&] {
           for (int i = 0; i < steps; ++i) m.launch(kernel, splits, layout);
         }).median_ms /
         steps;
}

double GpuDecoder::device_bytes(const DecodeBatch& b, int max_splits, bool contiguous) {
  const double kv = 2.0 * kv_elem_bytes(b.kv_dtype) * double(b.pool_elems()) + 8.0 * double(b.scale_elems());
  const double contig = contiguous ? 2.0 * 2.0 * double(b.batch()) * b.kv_heads * b.max_len() * b.d : 0.0;
  const double io = 2.0 * 2.0 * double(b.batch()) * b.heads * b.d + 4.0 * b.batch() * b.heads;
  const double part = max_splits > 1 ? 4.0 * double(b.batch()) * b.heads * max_splits * (b.d + 2) : 0.0;
  return kv + contig + io + part + 4.0 * double(b.block_table.size() + b.lens.size());
}

}  // namespace attn::ch07
