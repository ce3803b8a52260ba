// Chapter 07's GPU side: the decode batch on the device, the pool filled from
// kv_value(), the contiguous copy, and the dispatch to the v1 and v2 launchers.
#include "decode_gpu.hpp"

#include <algorithm>
#include <type_traits>

#include "common/cuda/buffer.cuh"
#include "common/cuda/check.cuh"
#include "common/cuda/timing.cuh"
#include "common/errors.hpp"
#include "kv_values.hpp"
#include "decode_steps.cuh"

namespace attn::ch07 {

const char* layout_name(KvLayout l) { return l == KvLayout::paged ? "paged" : "contiguous"; }

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
  int ld = 0, sms = 0, part_splits = 0;

  void ensure_contiguous() {
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

  void ensure_partials(int splits) {
    if (splits <= part_splits) return;
    const std::size_t rows = std::size_t(batch.batch()) * batch.heads * splits;
    part_m = DeviceBuffer<float>(rows);
    part_l = DeviceBuffer<float>(rows);
    part_o = DeviceBuffer<float>(rows * batch.d);
    part_splits = splits;
  }

  void launch(int splits, KvLayout layout) {
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
    p.splits = splits;
    if (splits > 1) {
      p.part_m = part_m.get();
      p.part_l = part_l.get();
      p.part_o = part_o.get();
    }
    dispatch_head_dim(b.d, [&](auto dc) {
      constexpr int D = decltype(dc)::value;
      auto go = [&](const auto& kv) {
        if (splits > 1) gpu::v2::launch<D>(p, kv, b.batch(), b.kv_heads);
        else gpu::v1::launch<D>(p, kv, b.batch(), b.kv_heads);
      };
      if (layout == KvLayout::paged)
        go(gpu::PagedKv{k_pool.get(), v_pool.get(), table.get(), b.max_pages, b.kv_heads, log2_exact(b.page_size)});
      else
        go(gpu::ContiguousKv{k_contig.get(), v_contig.get(), b.kv_heads, ld});
    });
  }

  void prepare(int splits, KvLayout layout) {
    if (splits < 1) throw UsageError("the split count must be >= 1");
    if (layout == KvLayout::contiguous) ensure_contiguous();
    if (splits > 1) ensure_partials(splits);
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
  if (kv.pools) {
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

GpuDecodeOutput GpuDecoder::run(int splits, KvLayout layout) {
  Impl& m = *impl_;
  m.prepare(splits, layout);
  m.o.poison();
  m.lse.poison();
  if (splits > 1) {  // scratch too: a split that forgot to write its state must show
    m.part_m.poison();
    m.part_l.poison();
    m.part_o.poison();
  }
  m.launch(splits, layout);
  CUDA_CHECK(cudaDeviceSynchronize());
  GpuDecodeOutput out;
  out.o = m.o.to_host();
  out.lse = m.lse.download();
  return out;
}

double GpuDecoder::time_ms(int splits, KvLayout layout) {
  Impl& m = *impl_;
  m.prepare(splits, layout);
  return time_gpu([&] { m.launch(splits, layout); }).median_ms;
}

double GpuDecoder::device_bytes(const DecodeBatch& b, int max_splits, bool contiguous) {
  const double kv = 2.0 * 2.0 * double(b.pool_elems());
  const double contig = contiguous ? 2.0 * 2.0 * double(b.batch()) * b.kv_heads * b.max_len() * b.d : 0.0;
  const double io = 2.0 * 2.0 * double(b.batch()) * b.heads * b.d + 4.0 * b.batch() * b.heads;
  const double part = max_splits > 1 ? 4.0 * double(b.batch()) * b.heads * max_splits * (b.d + 2) : 0.0;
  return kv + contig + io + part + 4.0 * double(b.block_table.size() + b.lens.size());
}

}  // namespace attn::ch07
