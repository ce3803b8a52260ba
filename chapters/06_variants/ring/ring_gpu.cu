// The GPU ring: one rank's buffers and steps (shared by the streams and NCCL
// backends), the ring's own small kernels (merge in LSE form, accumulate, finalize),
// and the streams backend: P virtual ranks on one GPU, each with a compute stream
// and a copy stream, every rotation a device-to-device copy ordered by events.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>
#include <chrono>
#include <memory>
#include <stdexcept>

#include "common/cuda/check.cuh"
#include "common/cuda/device_problem.cuh"
#include "common/cuda/timing.cuh"
#include "common/device.hpp"
#include "common/errors.hpp"
#include "ring/ring_gpu_rank.cuh"
#include "ring/ring_merge.hpp"
#include "ring/ring_nccl.hpp"
#include "ring/ring_step.cuh"

namespace attn::ch06::ring {

// ------------------------------------------------------------------ the ring's kernels

namespace {

constexpr int kThreads = 256;

template <class T> __device__ __forceinline__ float to_f(T x) { return float(x); }
template <> __device__ __forceinline__ float to_f<__nv_bfloat16>(__nv_bfloat16 x) { return __bfloat162float(x); }
template <> __device__ __forceinline__ float to_f<__half>(__half x) { return __half2float(x); }
template <class T> __device__ __forceinline__ T from_f(float x);
template <> __device__ __forceinline__ __nv_bfloat16 from_f<__nv_bfloat16>(float x) { return __float2bfloat16_rn(x); }
template <> __device__ __forceinline__ __half from_f<__half>(float x) { return __float2half_rn(x); }

unsigned grid_for(std::size_t n) { return unsigned(std::min<std::size_t>((n + kThreads - 1) / kThreads, 65535u * 8)); }

__global__ void init_acc_kernel(float* acc_o, float* acc_lse, std::size_t rows, int dv) {
  const std::size_t n = rows * std::size_t(dv);
  for (std::size_t k = std::size_t(blockIdx.x) * blockDim.x + threadIdx.x; k < n; k += std::size_t(gridDim.x) * blockDim.x) {
    acc_o[k] = 0.f;
    if (k < rows) acc_lse[k] = neg_inf<float>();
  }
  for (std::size_t k = n + std::size_t(blockIdx.x) * blockDim.x + threadIdx.x; k < rows; k += std::size_t(gridDim.x) * blockDim.x)
    acc_lse[k] = neg_inf<float>();
}

/// One warp per query row: every lane merges its own run of dv / 32 columns with
/// merge_lse (chapter 02's ⊕ in LSE form); all lanes compute the same new LSE.
template <class T, int PerLane>
__global__ void merge_partial_kernel(float* acc_o, float* acc_lse, const T* part_o, const float* part_lse,
                                     std::size_t rows, int dv) {
  const std::size_t row = std::size_t(blockIdx.x) * (blockDim.x / 32) + threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  if (row >= rows) return;
  const int c0 = lane * PerLane;
  float part[PerLane];
  const int cols = c0 < dv ? min(PerLane, dv - c0) : 0;
  for (int c = 0; c < cols; ++c) part[c] = to_f(part_o[row * dv + c0 + c]);
  const float lse_acc = acc_lse[row], lse_part = part_lse[row];
  const float lse = merge_lse(acc_o + row * dv + c0, lse_acc, part, lse_part, cols);
  __syncwarp();
  if (lane == 0) acc_lse[row] = lse;
}

template <class T>
__global__ void finalize_kernel(const float* acc, T* out, std::size_t n) {
  for (std::size_t k = std::size_t(blockIdx.x) * blockDim.x + threadIdx.x; k < n; k += std::size_t(gridDim.x) * blockDim.x)
    out[k] = from_f<T>(acc[k]);
}

template <class T>
__global__ void add_rows_kernel(float* acc, const T* part, int slices, std::size_t slice_elems, std::size_t acc_stride,
                                std::size_t part_stride) {
  const std::size_t n = std::size_t(slices) * slice_elems;
  for (std::size_t k = std::size_t(blockIdx.x) * blockDim.x + threadIdx.x; k < n; k += std::size_t(gridDim.x) * blockDim.x) {
    const std::size_t z = k / slice_elems, e = k % slice_elems;
    acc[z * acc_stride + e] += to_f(part[z * part_stride + e]);
  }
}

}  // namespace

void launch_init_acc(float* acc_o, float* acc_lse, std::size_t rows, int dv, cudaStream_t s) {
  init_acc_kernel<<<grid_for(std::max(rows * dv, rows)), kThreads, 0, s>>>(acc_o, acc_lse, rows, dv);
  CUDA_CHECK_LAUNCH("ring init_acc");
}

void launch_merge_partial(float* acc_o, float* acc_lse, const void* part_o, const float* part_lse, std::size_t rows,
                          int dv, DType t, cudaStream_t s) {
  const unsigned blocks = unsigned((rows + 7) / 8);
  auto go = [&](auto tag) {
    using T = decltype(tag);
    const T* po = static_cast<const T*>(part_o);
    if (dv <= 64) merge_partial_kernel<T, 2><<<blocks, 256, 0, s>>>(acc_o, acc_lse, po, part_lse, rows, dv);
    else if (dv <= 128) merge_partial_kernel<T, 4><<<blocks, 256, 0, s>>>(acc_o, acc_lse, po, part_lse, rows, dv);
    else merge_partial_kernel<T, 8><<<blocks, 256, 0, s>>>(acc_o, acc_lse, po, part_lse, rows, dv);
  };
  if (t == DType::bf16) go(__nv_bfloat16{});
  else go(__half{});
  CUDA_CHECK_LAUNCH("ring merge_partial");
}

void launch_finalize(const float* acc_o, void* o, std::size_t elems, DType t, cudaStream_t s) {
  if (t == DType::bf16) finalize_kernel<<<grid_for(elems), kThreads, 0, s>>>(acc_o, static_cast<__nv_bfloat16*>(o), elems);
  else finalize_kernel<<<grid_for(elems), kThreads, 0, s>>>(acc_o, static_cast<__half*>(o), elems);
  CUDA_CHECK_LAUNCH("ring finalize");
}

void launch_add_rows(float* acc, const void* part, bool part_f32, DType t, int slices, int rows, int width,
                     int acc_rows, int part_rows, cudaStream_t s) {
  const std::size_t slice = std::size_t(rows) * width, as = std::size_t(acc_rows) * width,
                    ps = std::size_t(part_rows) * width;
  const unsigned g = grid_for(slice * slices);
  if (slice == 0 || slices == 0) return;
  if (part_f32) add_rows_kernel<<<g, kThreads, 0, s>>>(acc, static_cast<const float*>(part), slices, slice, as, ps);
  else if (t == DType::bf16)
    add_rows_kernel<<<g, kThreads, 0, s>>>(acc, static_cast<const __nv_bfloat16*>(part), slices, slice, as, ps);
  else add_rows_kernel<<<g, kThreads, 0, s>>>(acc, static_cast<const __half*>(part), slices, slice, as, ps);
  CUDA_CHECK_LAUNCH("ring add_rows");
}

// ------------------------------------------------------------------ one rank

namespace {

/// One kernel launch of a pair: a (query chunk, key chunk) pair is one launch, or
/// one per (batch, KV head) when a diagonal pair uses fewer keys than the chunk
/// holds (striped shards of unequal length) and the kernel's head stride would not fit.
struct PairLaunch {
  std::size_t q_rows = 0;   // offset, in rows, into the query chunk (and its O, LSE, dO)
  std::size_t kv_rows = 0;  // offset, in rows, into the key chunk
  int batch = 1, heads = 1, kv_heads = 1;
};

struct PairShape {
  int nq = 0, nk_rows = 0, nk_used = 0;
  bool causal = false, sliced = false;
  std::vector<PairLaunch> launches;
};

PairShape pair_shape(const Problem& p, const Chunk& qc, const Chunk& kc, const PairMask& m) {
  PairShape s;
  s.nq = qc.count;
  s.nk_rows = kc.count;
  if (m.kind == PairKind::full) {
    s.nk_used = kc.count;
  } else {
    // The kernel's causal mask is bottom-right aligned: row i sees j <= i + nk - nq.
    // With nk = nq + offset keys it sees exactly j <= i + offset.
    s.causal = true;
    s.nk_used = qc.count + m.offset;
    if (s.nk_used <= 0 || s.nk_used > kc.count)
      throw std::logic_error("ring: a diagonal pair the kernel's bottom-right mask cannot express");
  }
  s.sliced = s.nk_used != s.nk_rows && p.batch * p.kv_heads > 1;
  if (!s.sliced) {
    s.launches.push_back({0, 0, p.batch, p.heads, p.kv_heads});
  } else {
    const int g = p.group();
    for (int b = 0; b < p.batch; ++b)
      for (int hk = 0; hk < p.kv_heads; ++hk)
        s.launches.push_back({(std::size_t(b) * p.heads + std::size_t(hk) * g) * qc.count,
                              (std::size_t(b) * p.kv_heads + hk) * kc.count, 1, g, 1});
  }
  return s;
}

/// The chapter 04 step problem of launch `l` of a pair of shape `sh`, on Q, K, V at `q`, `k`, `v`
/// (the launch's own rows): the forward and the backward launch the same one.
StepProblem step_problem(const Problem& p, const PairShape& sh, const PairLaunch& l, const void* q, const void* k,
                         const void* v) {
  StepProblem sp;
  sp.q = q;
  sp.k = k;
  sp.v = v;
  sp.batch = l.batch;
  sp.heads = l.heads;
  sp.kv_heads = l.kv_heads;
  sp.nq = sh.nq;
  sp.nk = sh.nk_used;
  sp.d = p.d;
  sp.scale = float(p.softmax_scale());
  sp.causal = sh.causal;
  sp.dtype = p.dtype;
  return sp;
}

DeviceTensor upload(const std::vector<float>& h, DType t) { return DeviceTensor::from_host(h, t); }

}  // namespace

GpuRank::GpuRank(const Problem& p, const AttnInputs& in, Layout layout, int ranks, int rank, bool backward)
    : p_(p), layout_(layout), P_(ranks), r_(rank), esize_(dtype_bytes(p.dtype)), backward_(backward) {
  geo_.resize(P_);
  for (int k = 0; k < P_; ++k) {
    geo_[k] = ShardGeometry::of(layout, p.nq, P_, k);
    kv_cap_ = std::max(kv_cap_, kv_elems(p, geo_[k]));
    for (const Chunk& c : geo_[k].chunks) max_chunk_ = std::max(max_chunk_, c.count);
  }
  CUDA_CHECK(cudaStreamCreateWithFlags(&compute_, cudaStreamNonBlocking));
  CUDA_CHECK(cudaStreamCreateWithFlags(&copy_, cudaStreamNonBlocking));
  const ShardGeometry& g = geo_[r_];
  const int n = p.nq;
  std::vector<float> h(g.elems(p.batch, p.heads, p.d));
  gather_shard(in.q.data(), p.batch, p.heads, n, p.d, g, h.data());
  DeviceTensor q = upload(h, p.dtype);
  q_ = DeviceBuffer<unsigned char>(q.bytes());
  CUDA_CHECK(cudaMemcpy(q_.get(), q.data(), q.bytes(), cudaMemcpyDeviceToDevice));
  std::vector<float> kv(kv_elems(p, g));
  gather_shard(in.k.data(), p.batch, p.kv_heads, n, p.d, g, kv.data());
  gather_shard(in.v.data(), p.batch, p.kv_heads, n, p.dv, g, kv.data() + g.elems(p.batch, p.kv_heads, p.d));
  DeviceTensor kvd = upload(kv, p.dtype);
  kv_own_ = DeviceBuffer<unsigned char>(kvd.bytes());
  CUDA_CHECK(cudaMemcpy(kv_own_.get(), kvd.data(), kvd.bytes(), cudaMemcpyDeviceToDevice));
  for (auto& b : kv_) b = DeviceBuffer<unsigned char>(kv_cap_ * esize_);
  const std::size_t rows = std::size_t(p.batch) * p.heads * g.tokens;
  const std::size_t part_rows = std::size_t(p.batch) * p.heads * max_chunk_;
  acc_o_ = DeviceBuffer<float>(rows * p.dv);
  acc_lse_ = DeviceBuffer<float>(rows);
  part_o_ = DeviceBuffer<unsigned char>(part_rows * p.dv * esize_);
  part_lse_ = DeviceBuffer<float>(part_rows);
  o_ = DeviceBuffer<unsigned char>(rows * p.dv * esize_);
  if (backward_) {
    std::vector<float> d(g.elems(p.batch, p.heads, p.dv));
    gather_shard(in.dout.data(), p.batch, p.heads, n, p.dv, g, d.data());
    DeviceTensor dd = upload(d, p.dtype);
    dout_ = DeviceBuffer<unsigned char>(dd.bytes());
    CUDA_CHECK(cudaMemcpy(dout_.get(), dd.data(), dd.bytes(), cudaMemcpyDeviceToDevice));
    const std::size_t part_kv_rows = std::size_t(p.batch) * p.kv_heads * max_chunk_;
    part_dq_ = DeviceBuffer<unsigned char>(part_rows * p.d * esize_);
    part_dk_ = DeviceBuffer<unsigned char>(part_kv_rows * p.d * esize_);
    part_dv_ = DeviceBuffer<unsigned char>(part_kv_rows * p.dv * esize_);
    scratch_dq_ = DeviceBuffer<float>(part_rows * p.d);
    scratch_delta_ = DeviceBuffer<float>(part_rows);
    dq_acc_ = DeviceBuffer<float>(rows * p.d);
    for (auto& b : dkv_) b = DeviceBuffer<float>(kv_cap_);
    step_part_ = DeviceBuffer<float>(kv_cap_);
    dq_out_ = DeviceBuffer<unsigned char>(rows * p.d * esize_);
    dkv_out_ = DeviceBuffer<unsigned char>(kv_elems(p, g) * esize_);
  }
}

GpuRank::~GpuRank() {
  clear_marks();
  if (compute_) cudaStreamDestroy(compute_);
  if (copy_) cudaStreamDestroy(copy_);
}

void GpuRank::clear_marks() {
  for (LaneMark& m : marks_) {
    if (m.t0) cudaEventDestroy(m.t0);
    if (m.t1) cudaEventDestroy(m.t1);
  }
  marks_.clear();
}

void GpuRank::mark_begin(const char* what, int step) {
  if (!marking_) return;
  LaneMark m;
  m.lane = "compute";
  m.what = what;
  m.step = step;
  CUDA_CHECK(cudaEventCreate(&m.t0));
  CUDA_CHECK(cudaEventCreate(&m.t1));
  CUDA_CHECK(cudaEventRecord(m.t0, compute_));
  marks_.push_back(m);
}

void GpuRank::mark_end() {
  if (marking_) CUDA_CHECK(cudaEventRecord(marks_.back().t1, compute_));
}

std::size_t GpuRank::kv_bytes(int src) const { return kv_elems(p_, geo_[src]) * esize_; }
std::size_t GpuRank::dkv_bytes(int src) const { return kv_elems(p_, geo_[src]) * sizeof(float); }

void GpuRank::poison_outputs() {
  o_.poison();
  if (backward_) {
    dq_out_.poison();
    dkv_out_.poison();
  }
}

void GpuRank::fwd_init() {
  cur_ = 0;
  CUDA_CHECK(cudaMemcpyAsync(kv_[0].get(), kv_own_.get(), kv_own_.bytes(), cudaMemcpyDeviceToDevice, compute_));
  const ShardGeometry& g = geo_[r_];
  launch_init_acc(acc_o_.get(), acc_lse_.get(), std::size_t(p_.batch) * p_.heads * g.tokens, p_.dv, compute_);
}

void GpuRank::fwd_begin(int s, GpuTransport& t) {
  if (s + 1 >= P_) return;
  t.start(kChannelKV, r_, s, kv_[cur_].get(), kv_bytes(kv_source(r_, s, P_)), kv_[1 - cur_].get(),
          kv_bytes(kv_source(r_, s + 1, P_)), compute_);
}

void GpuRank::fwd_compute(int s) {
  mark_begin("fwd", s);
  const StepPlan plan = step_plan(layout_, p_.nq, P_, r_, s, p_.causal);
  const ShardGeometry& gq = geo_[r_];
  const ShardGeometry& gk = geo_[plan.kv_rank];
  const unsigned char* kv = kv_[cur_].get();
  const std::size_t k_part = gk.elems(p_.batch, p_.kv_heads, p_.d);
  for (const StepPair& pr : plan.pairs) {
    const Chunk& qc = gq.chunks[pr.q_chunk];
    const Chunk& kc = gk.chunks[pr.k_chunk];
    const PairShape sh = pair_shape(p_, qc, kc, pr.mask);
    const unsigned char* q = q_.get() + gq.chunk_offset(pr.q_chunk, p_.batch, p_.heads, p_.d) * esize_;
    const unsigned char* k = kv + gk.chunk_offset(pr.k_chunk, p_.batch, p_.kv_heads, p_.d) * esize_;
    const unsigned char* v = kv + (k_part + gk.chunk_offset(pr.k_chunk, p_.batch, p_.kv_heads, p_.dv)) * esize_;
    for (const PairLaunch& l : sh.launches) {
      const StepProblem sp = step_problem(p_, sh, l, q + l.q_rows * p_.d * esize_, k + l.kv_rows * p_.d * esize_,
                                          v + l.kv_rows * p_.dv * esize_);
      StepForwardOut out;
      out.o = part_o_.get() + l.q_rows * p_.dv * esize_;
      out.lse = part_lse_.get() + l.q_rows;
      if (!step_forward(sp, out, compute_)) throw UsageError("ring: chapter 04's forward has no kernel for this problem");
      CUDA_CHECK_LAUNCH("ring step forward (chapter 04)");
    }
    const std::size_t rows = std::size_t(p_.batch) * p_.heads * qc.count;
    const std::size_t o0 = gq.chunk_offset(pr.q_chunk, p_.batch, p_.heads, p_.dv);
    const std::size_t l0 = gq.chunk_offset(pr.q_chunk, p_.batch, p_.heads, 1);
    if (s != skip_step_)
      launch_merge_partial(acc_o_.get() + o0, acc_lse_.get() + l0, part_o_.get(), part_lse_.get(), rows, p_.dv,
                           p_.dtype, compute_);
  }
  mark_end();
}

void GpuRank::fwd_end(int s, GpuTransport& t) {
  if (s + 1 >= P_) return;
  t.finish(kChannelKV, r_, s, compute_);
  cur_ ^= 1;
}

void GpuRank::fwd_finalize() {
  launch_finalize(acc_o_.get(), o_.get(), acc_o_.size(), p_.dtype, compute_);
}

void GpuRank::bwd_init() {
  cur_ = 0;
  dcur_ = 0;
  CUDA_CHECK(cudaMemcpyAsync(kv_[0].get(), kv_own_.get(), kv_own_.bytes(), cudaMemcpyDeviceToDevice, compute_));
  CUDA_CHECK(cudaMemsetAsync(dq_acc_.get(), 0, dq_acc_.bytes(), compute_));
}

void GpuRank::bwd_begin(int s, GpuTransport& t) { fwd_begin(s, t); }

void GpuRank::bwd_compute(int s) {
  mark_begin("bwd", s);
  const StepPlan plan = step_plan(layout_, p_.nq, P_, r_, s, p_.causal);
  const ShardGeometry& gq = geo_[r_];
  const ShardGeometry& gk = geo_[plan.kv_rank];
  const unsigned char* kv = kv_[cur_].get();
  const std::size_t k_part = gk.elems(p_.batch, p_.kv_heads, p_.d);
  CUDA_CHECK(cudaMemsetAsync(step_part_.get(), 0, kv_elems(p_, gk) * sizeof(float), compute_));
  for (const StepPair& pr : plan.pairs) {
    const Chunk& qc = gq.chunks[pr.q_chunk];
    const Chunk& kc = gk.chunks[pr.k_chunk];
    const PairShape sh = pair_shape(p_, qc, kc, pr.mask);
    const std::size_t q0 = gq.chunk_offset(pr.q_chunk, p_.batch, p_.heads, p_.d);
    const std::size_t o0 = gq.chunk_offset(pr.q_chunk, p_.batch, p_.heads, p_.dv);
    const std::size_t l0 = gq.chunk_offset(pr.q_chunk, p_.batch, p_.heads, 1);
    const std::size_t k0 = gk.chunk_offset(pr.k_chunk, p_.batch, p_.kv_heads, p_.d);
    const std::size_t v0 = k_part + gk.chunk_offset(pr.k_chunk, p_.batch, p_.kv_heads, p_.dv);
    for (const PairLaunch& l : sh.launches) {
      const StepProblem sp = step_problem(p_, sh, l, q_.get() + (q0 + l.q_rows * p_.d) * esize_,
                                          kv + (k0 + l.kv_rows * p_.d) * esize_, kv + (v0 + l.kv_rows * p_.dv) * esize_);
      StepBackwardArgs a;
      a.o = o_.get() + (o0 + l.q_rows * p_.dv) * esize_;
      a.dout = dout_.get() + (o0 + l.q_rows * p_.dv) * esize_;
      a.lse = acc_lse_.get() + l0 + l.q_rows;
      a.dq = part_dq_.get() + l.q_rows * p_.d * esize_;
      a.dk = part_dk_.get() + l.kv_rows * p_.d * esize_;
      a.dv = part_dv_.get() + l.kv_rows * p_.dv * esize_;
      a.dq_accum = scratch_dq_.get() + l.q_rows * p_.d;
      a.delta = scratch_delta_.get() + l.q_rows;
      if (!step_backward(sp, a, compute_)) throw UsageError("ring: chapter 04's backward has no kernel for this problem");
      CUDA_CHECK_LAUNCH("ring step backward (chapter 04)");
    }
    // dQ stays here; dK, dV go into this step's part of the travelling accumulator.
    launch_add_rows(dq_acc_.get() + q0, part_dq_.get(), false, p_.dtype, 1, p_.batch * p_.heads * qc.count, p_.d, 0, 0,
                    compute_);
    const int part_rows = sh.sliced ? sh.nk_rows : sh.nk_used;
    launch_add_rows(step_part_.get() + k0, part_dk_.get(), false, p_.dtype, p_.batch * p_.kv_heads, sh.nk_used, p_.d,
                    sh.nk_rows, part_rows, compute_);
    launch_add_rows(step_part_.get() + v0, part_dv_.get(), false, p_.dtype, p_.batch * p_.kv_heads, sh.nk_used, p_.dv,
                    sh.nk_rows, part_rows, compute_);
  }
  mark_end();
}

void GpuRank::bwd_merge(int s, GpuTransport& t) {
  const int src = kv_source(r_, s, P_);
  const std::size_t n = kv_elems(p_, geo_[src]);
  if (s > 0) {
    t.finish(kChannelDKV, r_, s - 1, compute_);  // the accumulator of shard src, from rank r - 1
    dcur_ ^= 1;
  } else {
    CUDA_CHECK(cudaMemsetAsync(dkv_[dcur_].get(), 0, n * sizeof(float), compute_));
  }
  launch_add_rows(dkv_[dcur_].get(), step_part_.get(), true, p_.dtype, 1, 1, int(n), 0, 0, compute_);
  // On to rank r + 1, which holds shard src at step s + 1; after the last step that is its home.
  t.start(kChannelDKV, r_, s, dkv_[dcur_].get(), dkv_bytes(src), dkv_[1 - dcur_].get(),
          dkv_bytes(kv_source(r_, s + 1, P_)), compute_);
}

void GpuRank::bwd_end(int s, GpuTransport& t) { fwd_end(s, t); }

void GpuRank::bwd_home(GpuTransport& t) {
  t.finish(kChannelDKV, r_, P_ - 1, compute_);
  dcur_ ^= 1;
  launch_finalize(dq_acc_.get(), dq_out_.get(), dq_acc_.size(), p_.dtype, compute_);
  launch_finalize(dkv_[dcur_].get(), dkv_out_.get(), kv_elems(p_, geo_[r_]), p_.dtype, compute_);
}

namespace {

std::vector<float> download_dtype(const void* dev, std::size_t elems, DType t) {
  DeviceTensor tmp(t, elems);
  CUDA_CHECK(cudaMemcpy(tmp.data(), dev, elems * dtype_bytes(t), cudaMemcpyDeviceToDevice));
  return tmp.to_host();
}

}  // namespace

void GpuRank::download_forward(std::vector<float>& o, std::vector<float>& lse) const {
  CUDA_CHECK(cudaStreamSynchronize(compute_));
  const ShardGeometry& g = geo_[r_];
  const std::vector<float> oh = download_dtype(o_.get(), acc_o_.size(), p_.dtype);
  const std::vector<float> lh = acc_lse_.download();
  scatter_shard(oh.data(), p_.batch, p_.heads, p_.nq, p_.dv, g, o.data());
  scatter_shard(lh.data(), p_.batch, p_.heads, p_.nq, 1, g, lse.data());
}

void GpuRank::download_backward(std::vector<float>& dq, std::vector<float>& dk, std::vector<float>& dv) const {
  CUDA_CHECK(cudaStreamSynchronize(compute_));
  const ShardGeometry& g = geo_[r_];
  const std::vector<float> qh = download_dtype(dq_out_.get(), dq_acc_.size(), p_.dtype);
  const std::vector<float> kvh = download_dtype(dkv_out_.get(), kv_elems(p_, g), p_.dtype);
  scatter_shard(qh.data(), p_.batch, p_.heads, p_.nq, p_.d, g, dq.data());
  scatter_shard(kvh.data(), p_.batch, p_.kv_heads, p_.nq, p_.d, g, dk.data());
  scatter_shard(kvh.data() + g.elems(p_.batch, p_.kv_heads, p_.d), p_.batch, p_.kv_heads, p_.nq, p_.dv, g, dv.data());
}

// ------------------------------------------------------------------ the streams transport

StreamsTransport::StreamsTransport(std::vector<GpuRank*> ranks, bool timing)
    : ranks_(std::move(ranks)), timing_(timing), P_(int(ranks_.size())) {
  ep_.assign(kChannels, std::vector<Endpoint>(P_));
  done_.assign(kChannels, std::vector<std::array<cudaEvent_t, 2>>(P_));
  issued_.assign(kChannels, std::vector<int>(P_, -1));
  marks_.resize(P_);
  for (int c = 0; c < kChannels; ++c)
    for (int r = 0; r < P_; ++r) {
      CUDA_CHECK(cudaEventCreateWithFlags(&ep_[c][r].compute_mark, cudaEventDisableTiming));
      for (cudaEvent_t& e : done_[c][r]) CUDA_CHECK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
    }
}

StreamsTransport::~StreamsTransport() {
  for (int c = 0; c < kChannels; ++c)
    for (int r = 0; r < P_; ++r) {
      cudaEventDestroy(ep_[c][r].compute_mark);
      for (cudaEvent_t e : done_[c][r]) cudaEventDestroy(e);
    }
  clear_marks();
}

void StreamsTransport::clear_marks() {
  for (auto& v : marks_)
    for (LaneMark& m : v) {
      cudaEventDestroy(m.t0);
      cudaEventDestroy(m.t1);
    }
  for (auto& v : marks_) v.clear();
}

void StreamsTransport::reset() {
  for (auto& v : issued_) std::fill(v.begin(), v.end(), -1);
  for (auto& v : ep_)
    for (Endpoint& e : v) e.registered = false;
}

void StreamsTransport::start(Channel ch, int rank, int step, const void* send, std::size_t send_bytes, void* recv,
                             std::size_t recv_bytes, cudaStream_t compute) {
  Endpoint& e = ep_[ch][rank];
  e.registered = true;
  e.send = send;
  e.send_bytes = send_bytes;
  e.recv = recv;
  e.recv_bytes = recv_bytes;
  e.step = step;
  CUDA_CHECK(cudaEventRecord(e.compute_mark, compute));
  // A copy into a rank needs both ends: issue each one as soon as its sender and receiver
  // have started this round (in lockstep every rank starts before any finishes).
  const int prev = (rank + P_ - 1) % P_, next = (rank + 1) % P_;
  auto ready = [&](int to, int from) {
    return ep_[ch][to].registered && ep_[ch][from].registered && ep_[ch][to].step == step &&
           ep_[ch][from].step == step && issued_[ch][to] != step;
  };
  if (ready(rank, prev)) issue(ch, rank);
  if (next != rank && ready(next, rank)) issue(ch, next);
}

void StreamsTransport::issue(Channel ch, int to) {
  const int from = (to + P_ - 1) % P_, after = (to + 1) % P_;
  const Endpoint& dst = ep_[ch][to];
  const Endpoint& src = ep_[ch][from];
  const int round = dst.step;
  if (src.send_bytes != dst.recv_bytes) throw std::logic_error("ring: message and receive sizes differ");
  cudaStream_t s = ranks_[to]->copy_stream();
  CUDA_CHECK(cudaStreamWaitEvent(s, dst.compute_mark, 0));  // the receiver's compute is done with recv
  CUDA_CHECK(cudaStreamWaitEvent(s, src.compute_mark, 0));  // the sender's compute has written send
  if (round > 0) {
    // send landed in `from` in the previous round; recv was the send of `to` then, read
    // by the copy into `after`
    CUDA_CHECK(cudaStreamWaitEvent(s, done_[ch][from][(round - 1) % 2], 0));
    CUDA_CHECK(cudaStreamWaitEvent(s, done_[ch][after][(round - 1) % 2], 0));
  }
  LaneMark m;
  if (timing_) {
    m.lane = "copy";
    m.what = ch == kChannelDKV ? "dkv" : std::string(phase) == "bwd" ? "kv-bwd" : "kv";
    m.step = round;
    CUDA_CHECK(cudaEventCreate(&m.t0));
    CUDA_CHECK(cudaEventCreate(&m.t1));
    CUDA_CHECK(cudaEventRecord(m.t0, s));
  }
  CUDA_CHECK(cudaMemcpyAsync(dst.recv, src.send, src.send_bytes, cudaMemcpyDeviceToDevice, s));
  if (timing_) {
    CUDA_CHECK(cudaEventRecord(m.t1, s));
    marks_[to].push_back(m);
  }
  CUDA_CHECK(cudaEventRecord(done_[ch][to][round % 2], s));
  issued_[ch][to] = round;
}

void StreamsTransport::finish(Channel ch, int rank, int step, cudaStream_t compute) {
  if (issued_[ch][rank] != step) throw std::logic_error("ring: finish() before the copy was issued");
  CUDA_CHECK(cudaStreamWaitEvent(compute, done_[ch][rank][step % 2], 0));
}

// ------------------------------------------------------------------ the driver

std::string ring_gpu_unsupported(const Problem& p, bool backward) {
  if (p.d != p.dv) return "d != dv (chapter 04's kernels)";
  if (!step_supports(p.d, p.dtype, backward))
    return std::string(dtype_name(p.dtype)) + " d=" + std::to_string(p.d) +
           (backward ? " (chapter 04's backward: bf16/fp16, d 64 or 128)" : " (chapter 04's forward: bf16/fp16, d 64/128/256)");
  return "";
}

void collect_timeline(std::vector<GpuRank*>& ranks, std::vector<std::vector<LaneMark>>* copy_marks, cudaEvent_t t0,
                      GpuRingResult& res) {
  auto ms = [&](cudaEvent_t e) {
    float x = 0;
    CUDA_CHECK(cudaEventElapsedTime(&x, t0, e));
    return double(x);
  };
  const int P = int(ranks.size());
  res.rank_compute_ms.assign(P, 0.0);
  for (int r = 0; r < P; ++r) {
    for (const LaneMark& m : ranks[r]->marks()) {
      TimelineEvent e{r, m.lane, m.step, m.what, ms(m.t0), ms(m.t1)};
      res.timeline.push_back(e);
      if (m.what == "fwd") {
        res.rank_compute_ms[r] += e.t1 - e.t0;
        res.compute_ms += e.t1 - e.t0;
      }
    }
    if (copy_marks)
      for (const LaneMark& m : (*copy_marks)[r]) {
        TimelineEvent e{r, m.lane, m.step, m.what, ms(m.t0), ms(m.t1)};
        res.timeline.push_back(e);
      }
  }
  const CopyHiding h = copy_hiding(res.timeline);
  res.copy_ms = h.fwd_copy_ms;
  res.hidden_copy_ms = h.fwd_copy_ms - h.fwd_exposed_ms;
  res.bwd_copy_ms = h.bwd_copy_ms;
  res.bwd_hidden_copy_ms = h.bwd_copy_ms - h.bwd_exposed_ms;
  for (const TimelineEvent& e : res.timeline)
    if (e.what == "bwd") res.bwd_compute_ms += e.t1 - e.t0;
}

namespace {

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : v[v.size() / 2];
}

GpuRingResult ring_streams(const Problem& p, const AttnInputs& in, const GpuRingOptions& opt) {
  std::string why;
  const auto dev = query_device(&why);
  if (!dev) throw UsageError("the streams backend needs a GPU: " + why);
  const int P = opt.ranks;
  std::vector<std::unique_ptr<GpuRank>> owned;
  std::vector<GpuRank*> ranks;
  for (int r = 0; r < P; ++r) {
    owned.push_back(std::make_unique<GpuRank>(p, in, opt.layout, P, r, opt.backward));
    if (r == opt.skip.rank) owned.back()->skip_merge_at(opt.skip.step);
    ranks.push_back(owned.back().get());
  }
  StreamsTransport tr(ranks, false);
  // --serial-ranks: rank r's compute waits for rank r - 1's (and rank 0's for rank P-1's
  // previous step), so that only one rank computes at a time.
  std::vector<cudaEvent_t> chain(P);
  for (cudaEvent_t& e : chain) CUDA_CHECK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
  bool chained = false;
  auto compute = [&](int r, auto&& fn) {
    if (opt.serial_ranks && (r > 0 || chained))
      CUDA_CHECK(cudaStreamWaitEvent(ranks[r]->compute_stream(), chain[(r + P - 1) % P], 0));
    fn();
    if (opt.serial_ranks) {
      CUDA_CHECK(cudaEventRecord(chain[r], ranks[r]->compute_stream()));
      if (r == P - 1) chained = true;
    }
  };
  auto forward = [&](StreamsTransport& t) {
    t.reset();
    chained = false;
    for (GpuRank* g : ranks) g->fwd_init();
    for (int s = 0; s < P; ++s) {
      for (GpuRank* g : ranks) g->fwd_begin(s, t);
      for (int r = 0; r < P; ++r) compute(r, [&] { ranks[r]->fwd_compute(s); });
      for (GpuRank* g : ranks) g->fwd_end(s, t);
    }
    for (GpuRank* g : ranks) g->fwd_finalize();
  };
  auto backward = [&](StreamsTransport& t) {
    t.reset();
    chained = false;
    for (GpuRank* g : ranks) g->bwd_init();
    for (int s = 0; s < P; ++s) {
      for (GpuRank* g : ranks) g->bwd_begin(s, t);
      for (int r = 0; r < P; ++r) compute(r, [&] { ranks[r]->bwd_compute(s); });
      for (GpuRank* g : ranks) g->bwd_merge(s, t);
      for (GpuRank* g : ranks) g->bwd_end(s, t);
    }
    for (GpuRank* g : ranks) g->bwd_home(t);
  };

  GpuRingResult res;
  res.device = dev->name + (P > 1 ? " (" + std::to_string(P) + " virtual ranks)" : "");
  res.o.assign(p.o_elems(), 0.f);
  res.lse.assign(p.lse_elems(), 0.f);
  for (GpuRank* g : ranks) g->poison_outputs();
  CUDA_CHECK(cudaDeviceSynchronize());
  forward(tr);
  CUDA_CHECK(cudaDeviceSynchronize());
  for (GpuRank* g : ranks) g->download_forward(res.o, res.lse);
  if (opt.backward) {
    res.dq.assign(p.q_elems(), 0.f);
    res.dk.assign(p.k_elems(), 0.f);
    res.dv.assign(p.v_elems(), 0.f);
    backward(tr);
    CUDA_CHECK(cudaDeviceSynchronize());
    for (GpuRank* g : ranks) g->download_backward(res.dq, res.dk, res.dv);
  }
  if (!opt.time) {
    for (cudaEvent_t e : chain) CUDA_CHECK(cudaEventDestroy(e));
    return res;
  }

  // One marked run for the timeline: every compute phase and every copy between events.
  {
    StreamsTransport marked(ranks, true);
    for (GpuRank* g : ranks) g->set_marking(true);
    cudaEvent_t t0;
    CUDA_CHECK(cudaEventCreate(&t0));
    CUDA_CHECK(cudaDeviceSynchronize());
    CUDA_CHECK(cudaEventRecord(t0, ranks[0]->compute_stream()));
    forward(marked);
    if (opt.backward) {
      CUDA_CHECK(cudaDeviceSynchronize());
      marked.phase = "bwd";
      backward(marked);
    }
    CUDA_CHECK(cudaDeviceSynchronize());
    collect_timeline(ranks, &marked.marks(), t0, res);
    CUDA_CHECK(cudaEventDestroy(t0));
    for (GpuRank* g : ranks) {
      g->set_marking(false);
      g->clear_marks();
    }
  }
  // Wall time of the whole ring, median of 20 (host clock around a synchronised run:
  // P compute streams and P copy streams have no single stream to put events on).
  auto wall = [&](auto&& fn) {
    std::vector<double> t;
    for (int k = 0; k < 23; ++k) {
      CUDA_CHECK(cudaDeviceSynchronize());
      const auto a = std::chrono::steady_clock::now();
      fn();
      CUDA_CHECK(cudaDeviceSynchronize());
      const auto b = std::chrono::steady_clock::now();
      if (k >= 3) t.push_back(std::chrono::duration<double, std::milli>(b - a).count());
    }
    return median(t);
  };
  res.fwd_ms = wall([&] { forward(tr); });
  if (opt.backward) res.bwd_ms = wall([&] { backward(tr); });
  for (cudaEvent_t e : chain) CUDA_CHECK(cudaEventDestroy(e));
  return res;
}

}  // namespace

GpuRingResult ring_gpu(const Problem& p, const AttnInputs& in, const GpuRingOptions& opt) {
  validate_ring(p, opt.ranks);
  const std::string why = ring_gpu_unsupported(p, opt.backward);
  if (!why.empty()) throw UsageError("the GPU ring does not run this problem: " + why);
  if (opt.backend == Backend::nccl) return ring_nccl(p, in, opt);
  if (opt.backend != Backend::streams) throw UsageError("ring_gpu: the threads backend runs on the CPU");
  return ring_streams(p, in, opt);
}

SingleGpuTiming single_gpu_timing(const Problem& p, const AttnInputs& in, bool backward) {
  DeviceProblem dev(p, in);
  StepProblem sp;
  sp.q = dev.q.data();
  sp.k = dev.k.data();
  sp.v = dev.v.data();
  sp.batch = p.batch;
  sp.heads = p.heads;
  sp.kv_heads = p.kv_heads;
  sp.nq = p.nq;
  sp.nk = p.nk;
  sp.d = p.d;
  sp.scale = float(p.softmax_scale());
  sp.causal = p.causal;
  sp.dtype = p.dtype;
  StepForwardOut out{dev.o.data(), dev.lse.get()};
  SingleGpuTiming t;
  dev.poison_outputs();
  step_forward(sp, out, 0);
  CUDA_CHECK_LAUNCH("single-device forward");
  t.o = dev.o.to_host();
  t.lse = dev.lse.download();
  t.fwd_ms = time_gpu([&] {
               step_forward(sp, out, 0);
               CUDA_CHECK_LAUNCH("single-device forward");
             }).median_ms;
  if (backward) {
    const DeviceTensor dout = DeviceTensor::from_host(in.dout, p.dtype);
    DeviceTensor dq(p.dtype, p.q_elems()), dk(p.dtype, p.k_elems()), dv(p.dtype, p.v_elems());
    DeviceBuffer<float> acc(p.q_elems()), delta(p.lse_elems());
    StepBackwardArgs a;
    a.o = dev.o.data();
    a.dout = dout.data();
    a.lse = dev.lse.get();
    a.dq = dq.data();
    a.dk = dk.data();
    a.dv = dv.data();
    a.dq_accum = acc.get();
    a.delta = delta.get();
    dq.poison();
    dk.poison();
    dv.poison();
    step_backward(sp, a, 0);
    CUDA_CHECK_LAUNCH("single-device backward");
    t.dq = dq.to_host();
    t.dk = dk.to_host();
    t.dv = dv.to_host();
    t.bwd_ms = time_gpu([&] {
                 step_backward(sp, a, 0);
                 CUDA_CHECK_LAUNCH("single-device backward");
               }).median_ms;
  }
  return t;
}

double d2d_copy_ms(double bytes) {
  DeviceBuffer<unsigned char> a(static_cast<std::size_t>(bytes)), b(static_cast<std::size_t>(bytes));
  a.zero();
  return time_gpu([&] {
           CUDA_CHECK(cudaMemcpyAsync(b.get(), a.get(), a.bytes(), cudaMemcpyDeviceToDevice, 0));
         }).median_ms;
}

}  // namespace attn::ch06::ring
