// The C ABI of the lineage kernels (lineage_c.h): chapter 05's final forward and backward on
// device pointers handed in by a caller (python/attn_lineage through ctypes), on the caller's
// stream, every failure a return code and a one-line reason, never an abort.
//
// Chapter 05's launchers enqueue on the legacy default stream (step_launch.cuh: a prepared
// step's launch takes no stream). To run in the caller's stream order, a call whose stream is
// not the default one brackets the launches with two events: the default stream waits for
// the work already in the caller's stream, and the caller's stream waits for the kernels. The
// result is ordered exactly as if the kernels ran in the caller's stream; the price is that
// they also wait for (and hold back) work in the legacy default stream.
//
// Chapter 06's final masked forward (masks/steps/final.cu, final_fp16.cu) takes a stream and
// strides: it runs in the caller's stream directly, on [B][H][N][d] or packed [total][H][d]
// tensors. Its block map is built on the host (masks/mask_spec.cpp, block_map.cpp) and copied
// to the device in that stream, as masks/mask_gpu.cu's mask_forward_gpu() does for the chapter.
// Its sm90a masked backward (masks/hopper_backward.cu) likewise, with chapter 05's preprocess,
// postprocess and scratch layout.
//
// Chapter 06's MLA decode (gqa_mla/mla_final.cu) launches on the legacy default stream, so it is
// bracketed as chapter 05's kernels are.
//
// Chapter 05's files are used by path: chapters/05_fa3_hopper/step_launch.cuh and step_args.cuh
// (the forward's launcher, steps/final.cu, and its arguments), backward_launch.cuh,
// backward_args.cuh and backward_prepost.cuh (the backward's launcher, steps/final_backward.cu,
// its parameters, and its preprocess and postprocess). Chapter 07's likewise: decode.hpp,
// decode_checks.hpp and decode_steps.cuh (the final bf16 paged decode, steps/final_bf16.cu, and
// the final 8-bit one, steps/final_8bit.cu).
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <exception>
#include <initializer_list>
#include <map>
#include <mutex>
#include <set>
#include <string>
#include <utility>

#include "chapters/05_fa3_hopper/backward_args.cuh"
#include "chapters/05_fa3_hopper/backward_launch.cuh"
#include "chapters/05_fa3_hopper/backward_prepost.cuh"
#include "chapters/05_fa3_hopper/backward_tiles.hpp"
#include "chapters/05_fa3_hopper/step_args.cuh"
#include "chapters/05_fa3_hopper/step_launch.cuh"
#include "chapters/06_variants/gqa_mla/mla_final.cuh"  // chapter 06's final MLA decode
#include "chapters/06_variants/masks/block_map.hpp"     // chapter 06's block map (host)
#include "chapters/06_variants/masks/mask_kernels.cuh"  // chapter 06's FwdParams, hopper_final
#include "chapters/06_variants/masks/mask_spec.hpp"     // chapter 06's MaskSpec, layouts
#include "chapters/07_paged_radix/decode.hpp"
#include "chapters/07_paged_radix/decode_checks.hpp"
#include "chapters/07_paged_radix/decode_steps.cuh"
#include "common/cuda/check.cuh"
#include "common/cuda/hopper/tma.cuh"  // the 8-bit decode's tensor maps
#include "common/errors.hpp"
#include "common/index.hpp"
#include "common/online_softmax.hpp"
#include "common/problem.hpp"
#include "lineage_c.h"

namespace {

using namespace attn;
using namespace attn::ch05;

constexpr int kAbiVersion = 5;

void put(char* err, size_t len, const std::string& what) {
  if (err == nullptr || len == 0) return;
  const size_t n = what.size() < len - 1 ? what.size() : len - 1;
  std::memcpy(err, what.data(), n);
  err[n] = '\0';
}

/// Runs `body`, turning every exception into a code and a line.
template <class F>
int guarded(char* err, size_t len, F&& body) {
  try {
    put(err, len, "");
    return body();
  } catch (const UsageError& e) {
    put(err, len, e.what());
    return ATTN_LINEAGE_BAD_ARGUMENT;
  } catch (const std::exception& e) {
    put(err, len, e.what());
    return ATTN_LINEAGE_CUDA_ERROR;
  } catch (...) {
    put(err, len, "unknown error");
    return ATTN_LINEAGE_CUDA_ERROR;
  }
}

/// Throws UsageError unless `device` is a Hopper GPU (compute capability 9.0): the kernels
/// are sm_90a machine code and nothing else. Makes `device` current.
void require_hopper(int device) {
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess || count == 0) {
    cudaGetLastError();
    throw UsageError("no CUDA device");
  }
  if (device < 0 || device >= count) throw UsageError("device " + std::to_string(device) + " does not exist");
  CUDA_CHECK(cudaSetDevice(device));
  // Every call of the library passes here, so a device found to be sm_90 is remembered: the
  // compute capability is read as two attributes, and cudaGetDeviceProperties (which reads
  // every property, far slower) runs only to name a device that has no kernel.
  static std::mutex mutex;
  static std::set<int> hopper;
  {
    std::lock_guard<std::mutex> lock(mutex);
    if (hopper.count(device)) return;
  }
  int major = 0, minor = 0;
  CUDA_CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device));
  CUDA_CHECK(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device));
  if (major != 9 || minor != 0) {
    cudaDeviceProp prop;
    CUDA_CHECK(cudaGetDeviceProperties(&prop, device));
    throw std::logic_error(std::string("no kernel for ") + prop.name + " (compute capability " +
                           std::to_string(major) + "." + std::to_string(minor) +
                           "): the lineage kernels are built for sm_90a (Hopper) alone");
  }
  std::lock_guard<std::mutex> lock(mutex);
  hopper.insert(device);
}

void require(bool ok, const std::string& what) {
  if (!ok) throw UsageError(what);
}

Problem make_problem(int dtype, int batch, int heads, int kv_heads, int nq, int nk, int d, float scale, int causal) {
  require(dtype == ATTN_LINEAGE_BF16 || dtype == ATTN_LINEAGE_F16, "dtype: bf16 or f16");
  require(batch > 0 && heads > 0 && kv_heads > 0 && nq > 0 && nk > 0, "sizes must be positive");
  require(heads % kv_heads == 0, "heads (" + std::to_string(heads) + ") must be a multiple of kv_heads (" +
                                     std::to_string(kv_heads) + ")");
  require(std::isfinite(scale) && scale >= 0, "scale must be finite and >= 0 (0: 1/sqrt(d))");
  Problem p;
  p.batch = batch;
  p.heads = heads;
  p.kv_heads = kv_heads;
  p.nq = nq;
  p.nk = nk;
  p.d = p.dv = d;
  p.scale = scale;
  p.causal = causal != 0;
  p.dtype = dtype == ATTN_LINEAGE_F16 ? DType::f16 : DType::bf16;
  return p;
}

/// A call's device tensors, each with its name: every one must be non-null and 16-byte aligned
/// (the tensor maps' requirement). Checked in the order given: the first bad one is reported.
void check_tensors(std::initializer_list<std::pair<const void*, const char*>> tensors) {
  for (const auto& [ptr, name] : tensors) {
    require(ptr != nullptr, std::string(name) + " is null");
    require(reinterpret_cast<uintptr_t>(ptr) % 16 == 0, std::string(name) + " must be 16-byte aligned");
  }
}

/// The caller's scratch: at least `needed` bytes, 256-byte aligned (its parts start at multiples
/// of 256 bytes).
void check_workspace(const void* workspace, size_t bytes, size_t needed) {
  require(bytes >= needed, "workspace: " + std::to_string(bytes) + " bytes, " + std::to_string(needed) + " needed");
  require(reinterpret_cast<uintptr_t>(workspace) % 256 == 0, "workspace must be 256-byte aligned");
}

/// The caller's stream order around launches on the legacy default stream (see the header).
class StreamBridge {
 public:
  explicit StreamBridge(void* stream) : st_(static_cast<cudaStream_t>(stream)) {
    if (!bridged()) return;
    CUDA_CHECK(cudaEventCreateWithFlags(&before_, cudaEventDisableTiming));
    CUDA_CHECK(cudaEventCreateWithFlags(&after_, cudaEventDisableTiming));
    CUDA_CHECK(cudaEventRecord(before_, st_));
    CUDA_CHECK(cudaStreamWaitEvent(cudaStreamLegacy, before_, 0));
  }
  /// After the launches: the caller's stream waits for them.
  void done() {
    if (!bridged()) return;
    CUDA_CHECK(cudaEventRecord(after_, cudaStreamLegacy));
    CUDA_CHECK(cudaStreamWaitEvent(st_, after_, 0));
  }
  ~StreamBridge() {
    if (before_) cudaEventDestroy(before_);  // released once the recorded work is done
    if (after_) cudaEventDestroy(after_);
  }
  StreamBridge(const StreamBridge&) = delete;
  StreamBridge& operator=(const StreamBridge&) = delete;

 private:
  bool bridged() const { return st_ != nullptr && st_ != cudaStreamLegacy; }
  cudaStream_t st_;
  cudaEvent_t before_ = nullptr, after_ = nullptr;
};

/// d = 64's tile counters (steps/final.cu, Schedule::kDynamic): one zeroed pair per GPU, kept
/// for the life of the process. Every launch leaves them zero, and every launch of this library
/// goes to the legacy default stream, so no two kernels use them at once.
int* tile_counter(int device) {
  static std::mutex mutex;
  static std::map<int, int*> counters;
  std::lock_guard<std::mutex> lock(mutex);
  int*& c = counters[device];
  if (c == nullptr) {
    int* p = nullptr;
    CUDA_CHECK(cudaMalloc(&p, 2 * sizeof(int)));
    CUDA_CHECK(cudaMemset(p, 0, 2 * sizeof(int)));
    c = p;
  }
  return c;
}

size_t round256(size_t n) { return (n + 255) / 256 * 256; }

struct BwdScratch {
  size_t lse2, delta, accum, order, total;
};
/// The final backward's scratch, laid out for its walk and accumulator (backward_args.cuh:
/// b12's at d = 64, b13's at d = 128).
BwdScratch bwd_scratch(int batch, int heads, int nq, int d) {
  const BwdStep layout = layout_step(BwdStep::final_bwd, d);
  const int n_qblocks = query_blocks(layout, nq);
  const size_t heads_total = size_t(batch) * heads;
  const size_t rows = heads_total * size_t(n_qblocks) * block_rows(layout);
  BwdScratch s;
  s.lse2 = 0;
  s.delta = s.lse2 + round256(rows * sizeof(float));
  s.accum = s.delta + round256(rows * sizeof(float));
  s.order = s.accum + round256(rows * d * sizeof(float));
  s.total = s.order + round256(heads_total * n_qblocks * 2 * sizeof(int));
  return s;
}

/// Chapter 05's final backward's parameters for one call: the problem, its layout and mode, and
/// the scratch in the caller's workspace (bwd_scratch()'s layout). The unmasked and the masked
/// backward both take them.
Fa3BwdParams bwd_params(const Problem& p, const void* o, const void* dout, const float* lse, void* dq, void* dk,
                        void* dv, void* workspace, int deterministic) {
  const BwdScratch s = bwd_scratch(p.batch, p.heads, p.nq, p.d);
  char* ws = static_cast<char*>(workspace);
  Fa3BwdParams b;
  b.o = o;
  b.dout = dout;
  b.lse = lse;
  b.lse2 = reinterpret_cast<float*>(ws + s.lse2);
  b.delta = reinterpret_cast<float*>(ws + s.delta);
  b.dq_accum = reinterpret_cast<float*>(ws + s.accum);
  b.dq_order = reinterpret_cast<int*>(ws + s.order);
  b.dq = dq;
  b.dk = dk;
  b.dv = dv;
  set_bwd_problem(b, p);
  set_bwd_layout(b, layout_step(BwdStep::final_bwd, p.d), p.nq);
  b.deterministic = deterministic != 0;
  return b;
}

/// Chapter 07's decode: its shape rules (decode_checks.hpp, shared with decode.cpp's validate())
/// and its split plan (decode.cpp's choose_splits() and keys_per_split(), restated here because
/// the library does not link chapter 07's CPU code) for the longest sequence the block table can
/// hold, since the lengths stay on the device. A split past a sequence's end reads nothing and
/// merges as an empty state.
struct DecodePlan {
  int chunks, splits, split_keys;
  size_t part_m, part_l, part_o, arrivals, arrival_count, total;
};
/// The shape rules of a paged decode call, checked before the device: eight_bit, chapter 07's
/// final 8-bit kernel's (d = 128, pages of at least DecodeGeometry::kTmaMinPage tokens).
void check_decode_shape(int batch, int heads, int kv_heads, int d, int max_pages, int page_size, bool eight_bit) {
  using G = attn::ch07::DecodeGeometry;
  require(batch > 0 && heads > 0 && kv_heads > 0 && max_pages > 0, "sizes must be positive");
  require(ch07::heads_grouped(heads, kv_heads),
          "heads (" + std::to_string(heads) + ") must be a multiple of kv_heads (" + std::to_string(kv_heads) + ")");
  if (eight_bit)
    require(d == 128, "head dim " + std::to_string(d) + ": the 8-bit paged decode has a kernel for 128");
  else
    require(d == 64 || d == 128, "head dim " + std::to_string(d) + ": the paged decode has kernels for 64, 128");
  require(ch07::page_size_power_of_two(page_size),
          "page_size " + std::to_string(page_size) + " must be a power of two");
  if (eight_bit)
    require(page_size >= G::kTmaMinPage, "page_size " + std::to_string(page_size) +
                                             ": the 8-bit paged decode copies pages of at least " +
                                             std::to_string(G::kTmaMinPage) + " tokens");
  require(long(max_pages) * page_size < (1L << 30), "max_pages * page_size must be below 2^30 tokens");
}

/// check_decode_shape() for the 8-bit decode, and its format (before the device).
void check_decode_8bit(int kv_format, int batch, int heads, int kv_heads, int d, int max_pages, int page_size) {
  require(kv_format == ATTN_LINEAGE_KV_FP8_E4M3 || kv_format == ATTN_LINEAGE_KV_INT8,
          "kv_format: ATTN_LINEAGE_KV_FP8_E4M3 or ATTN_LINEAGE_KV_INT8");
  check_decode_shape(batch, heads, kv_heads, d, max_pages, page_size, true);
}

DecodePlan decode_plan(int device, int batch, int heads, int kv_heads, int d, int max_pages, int page_size,
                       bool eight_bit = false) {
  using G = attn::ch07::DecodeGeometry;
  check_decode_shape(batch, heads, kv_heads, d, max_pages, page_size, eight_bit);
  int sms = 0;
  CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device));
  const int capacity = max_pages * page_size;
  DecodePlan pl;
  pl.chunks = ceil_div(heads / kv_heads, G::kRows);
  const int base_blocks = batch * kv_heads * pl.chunks;
  auto keys_per_split = [](int len, int s) { return ceil_div(ceil_div(len, std::max(1, s)), G::kBc) * G::kBc; };
  // choose_splits(): the splits asked for to fill `per_sm` blocks an SM, none shorter than
  // kMinSplitKeys (cutting whole tiles may then need fewer)
  auto splits_for = [&](int per_sm) {
    return std::min(std::max(1, sms * per_sm / std::max(1, base_blocks)), std::max(1, capacity / G::kMinSplitKeys));
  };
  if (!eight_bit) {
    const int per_sm = int(std::max<size_t>(1, (228 * 1024) / (attn::ch07::decode_smem_bytes(d) + 1024)));
    pl.split_keys = keys_per_split(capacity, splits_for(per_sm));
    pl.splits = ceil_div(capacity, pl.split_keys);
  } else {
    // decode.cpp's final_8bit_plan(): four blocks an SM where the splits that fill them are long
    // enough (final_8bit_blocks_per_sm()), else three; and, as main.cpp runs it, at least two
    // splits, each of keys_per_split() keys (a split past a sequence's end is empty).
    auto cut = [&](int s) { return ceil_div(capacity, keys_per_split(capacity, s)); };  // choose_splits()' count
    const int four = cut(splits_for(4));
    const int s = attn::ch07::final_8bit_blocks_per_sm(keys_per_split(capacity, std::max(2, four))) == 4
                      ? four
                      : cut(splits_for(3));
    pl.splits = std::max(2, s);
    pl.split_keys = keys_per_split(capacity, pl.splits);
  }
  const size_t rows = size_t(batch) * heads * pl.splits;
  pl.part_m = 0;
  pl.part_l = round256(rows * sizeof(float));
  pl.part_o = pl.part_l + round256(rows * sizeof(float));
  pl.arrivals = pl.part_o + round256(rows * d * sizeof(float));
  // the 8-bit kernel takes 8 heads a block, the bf16 one 16: room for twice the counters
  pl.arrival_count = size_t(batch) * kv_heads * pl.chunks * (eight_bit ? 2 : 1);
  pl.total = pl.arrivals + round256(pl.arrival_count * sizeof(int));
  return pl;
}

/// The decode kernels' parameters for a plan: q, o, lse and the lengths as the caller's, the
/// partials and counters in its workspace; scale 0 is 1/sqrt(d).
attn::ch07::gpu::DecodeParams decode_params(const DecodePlan& pl, const void* q, void* o, float* lse,
                                            const int* seqlens, void* workspace, int heads, int kv_heads, int d,
                                            float scale) {
  namespace gpu = attn::ch07::gpu;
  char* ws = static_cast<char*>(workspace);
  gpu::DecodeParams p{};
  p.q = static_cast<const gpu::bf16*>(q);
  p.o = static_cast<gpu::bf16*>(o);
  p.lse = lse;
  p.lens = seqlens;
  p.heads = heads;
  p.group = heads / kv_heads;
  p.chunks = pl.chunks;
  p.scale = scale > 0 ? scale : float(1.0 / std::sqrt(double(d)));
  p.splits = pl.splits;
  p.split_keys = pl.split_keys;
  p.part_m = reinterpret_cast<float*>(ws + pl.part_m);
  p.part_l = reinterpret_cast<float*>(ws + pl.part_l);
  p.part_o = reinterpret_cast<float*>(ws + pl.part_o);
  p.arrivals = reinterpret_cast<int*>(ws + pl.arrivals);
  return p;
}

/// log2 of a power-of-two page size (the kernels' page_shift).
int log2_page(int page_size) {
  int shift = 0;
  while ((1 << shift) < page_size) ++shift;
  return shift;
}

/// Chapter 06's MLA decode: gqa_mla_gpu.cu's absorb_run() on the final path (mla_final.cu's plan),
/// and its partials' place in the workspace.
struct MlaPlan {
  attn::ch06::mla::FinalPlan plan;
  size_t o_part, ml_part, total;
};
MlaPlan mla_plan(int device, int batch, int heads, int nq, int nk) {
  namespace mla = attn::ch06::mla;
  require(batch > 0 && heads > 0 && nq > 0 && nk > 0, "sizes must be positive");
  require(nq <= nk, "nq (" + std::to_string(nq) + ") must be <= nk (" + std::to_string(nk) +
                        "): the MLA decode is causal and has no row without keys");
  require(long(heads) * nq < (1L << 24) && nk < (1 << 30), "heads * nq or nk too large");
  int sms = 0;
  CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device));
  MlaPlan m;
  const int rows = heads * nq;
  m.plan = mla::final_plan(batch, rows, nk, 0, sms);
  const size_t parts = size_t(batch) * m.plan.splits * rows;
  m.o_part = 0;
  m.ml_part = round256(parts * mla::kDVl * sizeof(float));
  m.total = m.ml_part + round256(parts * 2 * sizeof(float));
  return m;
}

/// Chapter 06: a masked forward's run-time description (the checks of lineage_c.h, before any
/// device call), and the mask the kernel takes.
struct MaskedCall {
  Problem problem;
  attn::ch06::MaskSpec spec;
  bool packed = false;
};

MaskedCall masked_call(int dtype, int batch, int heads, int kv_heads, int nq, int nk, int d, float scale, int causal,
                       int window_left, int window_right, float softcap, const float* sinks, const int* cu_seqlens,
                       int docs) {
  using attn::ch06::MaskKind;
  MaskedCall c;
  c.problem = make_problem(dtype, batch, heads, kv_heads, nq, nk, d, scale, 0);  // the mask does all masking
  require(d == 64 || d == 128 || d == 256,
          "head dim " + std::to_string(d) + ": the masked forward has kernels for 64, 128, 256");
  require(long(nq) + nk < (1L << 29), "nq + nk must be below 2^29");
  require(window_left >= -1, "window_left must be >= -1 (-1: no left bound), got " + std::to_string(window_left));
  require(window_right >= -1, "window_right must be >= -1 (-1: no right bound), got " + std::to_string(window_right));
  require(std::isfinite(softcap) && softcap >= 0, "softcap must be finite and >= 0 (0: none)");
  const int right = causal ? 0 : window_right;
  attn::ch06::MaskSpec& s = c.spec;
  s.causal = causal != 0;
  if (cu_seqlens != nullptr) {  // packed documents
    require(docs >= 1, "docs must be >= 1 with cu_seqlens");
    require(batch == 1 && nq == nk, "packed documents: batch must be 1 and nq = nk (the total tokens)");
    require(window_left == -1 && window_right == -1, "packed documents take no window");
    require(softcap == 0 && sinks == nullptr, "packed documents take no softcap and no sinks");
    require(cu_seqlens[0] == 0, "cu_seqlens[0] must be 0");
    for (int i = 0; i < docs; ++i) {
      require(cu_seqlens[i + 1] > cu_seqlens[i], "cu_seqlens must increase strictly (document " + std::to_string(i) +
                                                     " is empty)");
      s.doc_lens.push_back(cu_seqlens[i + 1] - cu_seqlens[i]);
    }
    require(cu_seqlens[docs] == nq, "cu_seqlens[docs] = " + std::to_string(cu_seqlens[docs]) +
                                        " must equal the total tokens nq = " + std::to_string(nq));
    s.kind = MaskKind::document;
    c.packed = true;
    return c;
  }
  require(docs == 0, "docs must be 0 without cu_seqlens");
  if (softcap > 0 || sinks != nullptr) {
    require(!(softcap > 0 && sinks != nullptr), "softcap and sinks together: no kernel (one or the other)");
    // Softcap and LearnedSink hold a dense or causal mask, or a causal sliding window.
    require(right == 0 || (right == -1 && window_left == -1),
            std::string(softcap > 0 ? "softcap" : "sinks") +
                " take a dense or causal mask or a causal sliding window (window_right 0 or causal), got window (" +
                std::to_string(window_left) + ", " + std::to_string(window_right) + ")");
    s.kind = softcap > 0 ? MaskKind::softcap : MaskKind::learned_sink;
    s.softcap = softcap;
    s.causal = right == 0;
    s.sliding = right == 0 ? window_left : -1;
    return c;
  }
  if (window_left == -1 && right == 0) {
    s.kind = MaskKind::causal;
    return c;
  }
  // Any other window, dense included (both bounds past every key): the Window policy. A bound
  // past every key is clipped to one (q - left and q + right stay far from int overflow).
  const int far = nq + nk;
  s.kind = MaskKind::window;
  s.left = window_left < 0 || window_left > far ? far : window_left;
  s.right = right < 0 || right > far ? far : right;
  return c;
}

/// Integer arrays (a block map's lists, a backward's walks) in one device allocation, made and
/// freed in the stream's order.
class DeviceInts {
 public:
  DeviceInts(std::initializer_list<const std::vector<int>*> parts, cudaStream_t st) : st_(st) {
    size_t total = 0;
    for (const std::vector<int>* v : parts) {
      offset_.push_back(total);
      total += round256(std::max<size_t>(1, v->size()) * sizeof(int));
    }
    std::vector<int> host(total / sizeof(int), 0);
    size_t i = 0;
    for (const std::vector<int>* v : parts) std::copy(v->begin(), v->end(), host.begin() + offset_[i++] / sizeof(int));
    CUDA_CHECK(cudaMallocAsync(reinterpret_cast<void**>(&base_), total, st_));
    // From pageable memory: staged before the call returns, so `host` may go.
    CUDA_CHECK(cudaMemcpyAsync(base_, host.data(), total, cudaMemcpyHostToDevice, st_));
  }
  ~DeviceInts() {
    if (base_) cudaFreeAsync(base_, st_);  // after the kernel, in the stream's order
  }
  DeviceInts(const DeviceInts&) = delete;
  DeviceInts& operator=(const DeviceInts&) = delete;
  int* at(int i) { return reinterpret_cast<int*>(base_ + offset_[i]); }

 private:
  cudaStream_t st_;
  char* base_ = nullptr;
  std::vector<size_t> offset_;
};

}  // namespace

extern "C" {

int attn_lineage_abi_version(void) { return kAbiVersion; }

int attn_lineage_device_ready(int device, char* err, size_t err_len) {
  try {
    put(err, err_len, "");
    require_hopper(device);
    return ATTN_LINEAGE_OK;
  } catch (const UsageError& e) {
    put(err, err_len, e.what());
    return ATTN_LINEAGE_CUDA_ERROR;
  } catch (const std::logic_error& e) {
    put(err, err_len, e.what());
    return ATTN_LINEAGE_NO_KERNEL;
  } catch (const std::exception& e) {
    put(err, err_len, e.what());
    return ATTN_LINEAGE_CUDA_ERROR;
  }
}

int attn_lineage_fa3_forward(int device, void* stream, int dtype, const void* q, const void* k, const void* v,
                             void* o, float* lse, int batch, int heads, int kv_heads, int nq, int nk, int d,
                             float scale, int causal, char* err, size_t err_len) {
  const int ready = attn_lineage_device_ready(device, err, err_len);
  if (ready != ATTN_LINEAGE_OK) return ready;
  return guarded(err, err_len, [&] {
    const Problem p = make_problem(dtype, batch, heads, kv_heads, nq, nk, d, scale, causal);
    require(d == 64 || d == 128 || d == 256, "head dim " + std::to_string(d) + ": the forward has kernels for 64, 128, 256");
    check_tensors({{q, "q"}, {k, "k"}, {v, "v"}, {o, "o"}});
    require(lse != nullptr, "lse is null");
    StepArgs a = make_step_args(p, q, k, v, o, lse);  // `device` is current (require_hopper())
    a.params.tile_counter = tile_counter(device);
    StreamBridge bridge(stream);
    final_fwd::prepare(a).launch();
    bridge.done();
    return ATTN_LINEAGE_OK;
  });
}

int attn_lineage_fa3_backward_workspace(int batch, int heads, int nq, int d, size_t* bytes, char* err,
                                        size_t err_len) {
  return guarded(err, err_len, [&] {
    require(batch > 0 && heads > 0 && nq > 0, "sizes must be positive");
    require(d == 64 || d == 128, "head dim " + std::to_string(d) + ": the backward has kernels for 64, 128");
    require(bytes != nullptr, "bytes is null");
    *bytes = bwd_scratch(batch, heads, nq, d).total;
    return ATTN_LINEAGE_OK;
  });
}

int attn_lineage_fa3_backward(int device, void* stream, int dtype, const void* q, const void* k, const void* v,
                              const void* o, const void* dout, const float* lse, void* dq, void* dk, void* dv,
                              void* workspace, size_t workspace_bytes, int batch, int heads, int kv_heads, int nq,
                              int nk, int d, float scale, int causal, int deterministic, char* err, size_t err_len) {
  const int ready = attn_lineage_device_ready(device, err, err_len);
  if (ready != ATTN_LINEAGE_OK) return ready;
  return guarded(err, err_len, [&] {
    const Problem p = make_problem(dtype, batch, heads, kv_heads, nq, nk, d, scale, causal);
    require(d == 64 || d == 128, "head dim " + std::to_string(d) + ": the backward has kernels for 64, 128");
    check_tensors({{q, "q"}, {k, "k"}, {v, "v"}, {o, "o"}, {dout, "dout"}, {dq, "dq"}, {dk, "dk"}, {dv, "dv"},
                   {workspace, "workspace"}});
    require(lse != nullptr, "lse is null");
    check_workspace(workspace, workspace_bytes, bwd_scratch(batch, heads, nq, d).total);
    BwdStepArgs a;
    a.problem = p;
    a.q = q;
    a.k = k;
    a.v = v;
    a.dout = dout;
    a.params = bwd_params(p, o, dout, lse, dq, dk, dv, workspace, deterministic);
    const Fa3BwdParams& b = a.params;
    const PreparedStep main_kernel = final_bwd::prepare(a);
    const long long rows = (long long)p.batch * p.heads * b.n_qblocks * b.block_rows;
    const unsigned prep_blocks = unsigned((rows + kPrepThreads / (d / 8) - 1) / (kPrepThreads / (d / 8)));
    const unsigned post_blocks = unsigned(rows / b.block_rows);
    StreamBridge bridge(stream);
    // backward_gpu.cu's run_all(): preprocess, the main kernel, postprocess.
    auto run = [&](auto tag) {
      using T = decltype(tag);
      if (d == 64)
        preprocess<T, 64><<<prep_blocks, kPrepThreads>>>(b);
      else
        preprocess<T, 128><<<prep_blocks, kPrepThreads>>>(b);
      CUDA_CHECK_LAUNCH("backward preprocess");
      main_kernel.launch();
      if (d == 64)
        postprocess<T, 64><<<post_blocks, kPostThreads>>>(b);
      else
        postprocess<T, 128><<<post_blocks, kPostThreads>>>(b);
      CUDA_CHECK_LAUNCH("backward postprocess");
    };
    if (p.dtype == DType::f16)
      run(__half{});
    else
      run(__nv_bfloat16{});
    bridge.done();
    return ATTN_LINEAGE_OK;
  });
}

int attn_lineage_paged_decode_workspace(int device, int batch, int heads, int kv_heads, int d, int max_pages,
                                        int page_size, size_t* bytes, char* err, size_t err_len) {
  const int ready = attn_lineage_device_ready(device, err, err_len);
  if (ready != ATTN_LINEAGE_OK) return ready;
  return guarded(err, err_len, [&] {
    require(bytes != nullptr, "bytes is null");
    *bytes = decode_plan(device, batch, heads, kv_heads, d, max_pages, page_size).total;
    return ATTN_LINEAGE_OK;
  });
}

int attn_lineage_paged_decode(int device, void* stream, const void* q, const void* k_pool, const void* v_pool,
                              const int* block_table, const int* seqlens, void* o, float* lse, void* workspace,
                              size_t workspace_bytes, int batch, int heads, int kv_heads, int d, int max_pages,
                              int page_size, float scale, char* err, size_t err_len) {
  const int ready = attn_lineage_device_ready(device, err, err_len);
  if (ready != ATTN_LINEAGE_OK) return ready;
  return guarded(err, err_len, [&] {
    namespace gpu = attn::ch07::gpu;
    const DecodePlan pl = decode_plan(device, batch, heads, kv_heads, d, max_pages, page_size);
    require(std::isfinite(scale) && scale >= 0, "scale must be finite and >= 0 (0: 1/sqrt(d))");
    check_tensors({{q, "q"}, {k_pool, "k_pool"}, {v_pool, "v_pool"}, {o, "o"}, {workspace, "workspace"}});
    require(block_table != nullptr && seqlens != nullptr && lse != nullptr, "block_table, seqlens and lse must not be null");
    check_workspace(workspace, workspace_bytes, pl.total);
    const gpu::DecodeParams p = decode_params(pl, q, o, lse, seqlens, workspace, heads, kv_heads, d, scale);
    const int shift = log2_page(page_size);
    const gpu::PagedKv kv{static_cast<const gpu::bf16*>(k_pool), static_cast<const gpu::bf16*>(v_pool), block_table,
                          max_pages, kv_heads, shift};
    StreamBridge bridge(stream);
    // The merge's arrival counters start at zero (each launch leaves them zero again).
    CUDA_CHECK(cudaMemsetAsync(p.arrivals, 0, pl.arrival_count * sizeof(int), cudaStreamLegacy));
    if (d == 64)
      gpu::final_bf16::launch<64>(p, kv, batch, kv_heads);
    else
      gpu::final_bf16::launch<128>(p, kv, batch, kv_heads);
    bridge.done();
    return ATTN_LINEAGE_OK;
  });
}

int attn_lineage_paged_decode_8bit_workspace(int device, int kv_format, int batch, int heads, int kv_heads, int d,
                                             int max_pages, int page_size, size_t* bytes, char* err,
                                             size_t err_len) {
  const int checked = guarded(err, err_len, [&] {
    check_decode_8bit(kv_format, batch, heads, kv_heads, d, max_pages, page_size);
    require(bytes != nullptr, "bytes is null");
    return ATTN_LINEAGE_OK;
  });
  if (checked != ATTN_LINEAGE_OK) return checked;
  const int ready = attn_lineage_device_ready(device, err, err_len);
  if (ready != ATTN_LINEAGE_OK) return ready;
  return guarded(err, err_len, [&] {
    *bytes = decode_plan(device, batch, heads, kv_heads, d, max_pages, page_size, true).total;
    return ATTN_LINEAGE_OK;
  });
}

int attn_lineage_paged_decode_8bit(int device, void* stream, int kv_format, const void* q, const void* k_codes,
                                   const void* v_codes, const float* k_scale, const float* v_scale,
                                   const int* block_table, const int* seqlens, void* o, float* lse, void* workspace,
                                   size_t workspace_bytes, int batch, int heads, int kv_heads, int d, int num_pages,
                                   int max_pages, int page_size, float scale, char* err, size_t err_len) {
  // Every argument before the device: a bad one is refused even where no GPU is.
  const int checked = guarded(err, err_len, [&] {
    check_decode_8bit(kv_format, batch, heads, kv_heads, d, max_pages, page_size);
    require(num_pages > 0, "num_pages must be positive");
    require(std::isfinite(scale) && scale >= 0, "scale must be finite and >= 0 (0: 1/sqrt(d))");
    check_tensors({{q, "q"}, {k_codes, "k_codes"}, {v_codes, "v_codes"}, {o, "o"}, {workspace, "workspace"}});
    require(k_scale != nullptr && v_scale != nullptr, "k_scale and v_scale must not be null");
    require(block_table != nullptr && seqlens != nullptr && lse != nullptr, "block_table, seqlens and lse must not be null");
    return ATTN_LINEAGE_OK;
  });
  if (checked != ATTN_LINEAGE_OK) return checked;
  const int ready = attn_lineage_device_ready(device, err, err_len);
  if (ready != ATTN_LINEAGE_OK) return ready;
  return guarded(err, err_len, [&] {
    namespace gpu = attn::ch07::gpu;
    using attn::ch07::KvDtype;
    const DecodePlan pl = decode_plan(device, batch, heads, kv_heads, d, max_pages, page_size, true);
    check_workspace(workspace, workspace_bytes, pl.total);
    const gpu::DecodeParams p = decode_params(pl, q, o, lse, seqlens, workspace, heads, kv_heads, d, scale);
    const int shift = log2_page(page_size);
    // decode_gpu.cu's code_maps(): each pool as [page x KV head][slot][d bytes], boxes of
    // min(page_size, 64) slots
    const uint32_t box = uint32_t(std::min(page_size, 64));
    const uint64_t outer = uint64_t(num_pages) * kv_heads;
    gpu::final_8bit::CodeMaps maps;
    maps.k = hopper::make_tensor_map_3d(k_codes, CU_TENSOR_MAP_DATA_TYPE_UINT8, 1, uint64_t(d), uint64_t(page_size),
                                        outer, uint32_t(d), box);
    maps.v = hopper::make_tensor_map_3d(v_codes, CU_TENSOR_MAP_DATA_TYPE_UINT8, 1, uint64_t(d), uint64_t(page_size),
                                        outer, uint32_t(d), box);
    const auto* k8 = static_cast<const uint8_t*>(k_codes);
    const auto* v8 = static_cast<const uint8_t*>(v_codes);
    StreamBridge bridge(stream);
    CUDA_CHECK(cudaMemsetAsync(p.arrivals, 0, pl.arrival_count * sizeof(int), cudaStreamLegacy));
    if (kv_format == ATTN_LINEAGE_KV_FP8_E4M3)
      gpu::final_8bit::launch<128>(p, gpu::PagedKv8<KvDtype::fp8>{k8, v8, k_scale, v_scale, block_table, max_pages,
                                                                  kv_heads, shift},
                                   maps, batch, kv_heads);
    else
      gpu::final_8bit::launch<128>(p, gpu::PagedKv8<KvDtype::int8>{k8, v8, k_scale, v_scale, block_table, max_pages,
                                                                   kv_heads, shift},
                                   maps, batch, kv_heads);
    bridge.done();
    return ATTN_LINEAGE_OK;
  });
}

int attn_lineage_masked_forward(int device, void* stream, int dtype, const void* q, const void* k, const void* v,
                                void* o, float* lse, int batch, int heads, int kv_heads, int nq, int nk, int d,
                                float scale, int causal, int window_left, int window_right, float softcap,
                                const float* sinks, const int* cu_seqlens, int docs, char* err, size_t err_len) {
  namespace ch06 = attn::ch06;
  MaskedCall c;
  // Every argument before the device: a bad one is refused even where no GPU is.
  const int checked = guarded(err, err_len, [&] {
    c = masked_call(dtype, batch, heads, kv_heads, nq, nk, d, scale, causal, window_left, window_right, softcap,
                    sinks, cu_seqlens, docs);
    check_tensors({{q, "q"}, {k, "k"}, {v, "v"}, {o, "o"}});
    require(lse != nullptr, "lse is null");
    return ATTN_LINEAGE_OK;
  });
  if (checked != ATTN_LINEAGE_OK) return checked;
  const int ready = attn_lineage_device_ready(device, err, err_len);
  if (ready != ATTN_LINEAGE_OK) return ready;
  return guarded(err, err_len, [&] {
    const Problem& p = c.problem;
    const ch06::MaskSpec& s = c.spec;
    const cudaStream_t st = static_cast<cudaStream_t>(stream);
    // masks/mask_gpu.cu's mask_forward_gpu(): documents of one packed batch are tiled from each
    // document's start (the document map); every other mask gets the grid map of its tiles.
    const int bc = ch06::hopper_final::tile_keys(d);
    const ch06::BlockMap map = c.packed ? ch06::build_document_block_map(s, p, ch06::hopper_final::Br, bc)
                                        : ch06::build_block_map(s, p, ch06::hopper_final::Br, bc);
    const std::vector<int> doc = c.packed ? ch06::doc_of_tokens(s.doc_lens) : std::vector<int>{};
    DeviceInts dm({&map.n_part, &map.part, &map.n_full, &map.full, &map.order, &map.q_row0, &map.q_row1, &doc}, st);
    const ch06::TokenLayout layout = c.packed ? ch06::TokenLayout::varlen(p) : ch06::TokenLayout::standard(p);
    auto strides = [](const ch06::Strides& x) { return ch06::DevStrides{x.batch, x.head, x.row}; };
    ch06::FwdParams f{};
    f.q = q, f.k = k, f.v = v, f.o = o, f.lse = lse;
    f.batch = p.batch, f.heads = p.heads, f.kv_heads = p.kv_heads, f.nq = p.nq, f.nk = p.nk, f.d = p.d;
    f.scale = float(p.softmax_scale());
    f.scale_log2 = float(p.softmax_scale() * kLog2e);
    f.sq = strides(layout.q), f.sk = strides(layout.k), f.sv = strides(layout.v), f.so = strides(layout.o);
    const bool docs_map = !map.q_row0.empty();
    f.map = {dm.at(0), dm.at(1), dm.at(2), dm.at(3), dm.at(4), map.tq, map.tk, map.map_batch, map.map_heads,
             docs_map ? dm.at(5) : nullptr, docs_map ? dm.at(6) : nullptr, map.tiles_with_work()};
    const ch06::PolicyData pd{c.packed ? dm.at(7) : nullptr, sinks};
    const std::function<void()> run = ch06::hopper_final::prepare(f, s, p, pd, st);
    require(bool(run), "no masked kernel for this problem");
    run();
    return ATTN_LINEAGE_OK;
  });
}

int attn_lineage_masked_backward(int device, void* stream, int dtype, const void* q, const void* k, const void* v,
                                 const void* o, const void* dout, const float* lse, void* dq, void* dk, void* dv,
                                 float* dsink, void* workspace, size_t workspace_bytes, int batch, int heads,
                                 int kv_heads, int nq, int nk, int d, float scale, int causal, int window_left,
                                 int window_right, float softcap, const float* sinks, int deterministic, char* err,
                                 size_t err_len) {
  namespace ch06 = attn::ch06;
  MaskedCall c;
  // Every argument before the device, as the forward's.
  const int checked = guarded(err, err_len, [&] {
    c = masked_call(dtype, batch, heads, kv_heads, nq, nk, d, scale, causal, window_left, window_right, softcap,
                    sinks, nullptr, 0);
    require(d == 64 || d == 128, "head dim " + std::to_string(d) + ": the masked backward has kernels for 64, 128");
    check_tensors({{q, "q"}, {k, "k"}, {v, "v"}, {o, "o"}, {dout, "dout"}, {dq, "dq"}, {dk, "dk"}, {dv, "dv"},
                   {workspace, "workspace"}});
    require(lse != nullptr, "lse is null");
    require(dsink == nullptr || sinks != nullptr, "dsink without sinks: there is no sink to differentiate");
    check_workspace(workspace, workspace_bytes, bwd_scratch(batch, heads, nq, d).total);
    return ATTN_LINEAGE_OK;
  });
  if (checked != ATTN_LINEAGE_OK) return checked;
  const int ready = attn_lineage_device_ready(device, err, err_len);
  if (ready != ATTN_LINEAGE_OK) return ready;
  return guarded(err, err_len, [&] {
    const Problem& p = c.problem;
    const ch06::MaskSpec& s = c.spec;
    const cudaStream_t st = static_cast<cudaStream_t>(stream);
    // masks/mask_gpu.cu's hopper_backward_gpu(): the map of the kernel's steps, and its walks.
    const ch06::BlockMap map = ch06::build_block_map(s, p, ch06::hopper_bwd::step_rows(d), ch06::hopper_bwd::kBc);
    const ch06::BackwardWalks w = ch06::backward_walks(map);
    DeviceInts dw({&w.list, &w.count, &w.rank}, st);
    ch06::HopperBwdArgs a;
    a.problem = p;
    a.params = bwd_params(p, o, dout, lse, dq, dk, dv, workspace, deterministic);
    a.walks = {dw.at(0), dw.at(1), dw.at(2), w.tq, w.tk, map.map_batch};
    a.q = q, a.k = k, a.v = v, a.dout = dout;
    a.dsink = dsink;
    const ch06::PolicyData pd{nullptr, sinks};
    const std::function<void()> run = ch06::hopper_bwd::prepare(a, s, pd, st);
    require(bool(run), "no masked backward for this problem");
    run();
    return ATTN_LINEAGE_OK;
  });
}

int attn_lineage_mla_decode_workspace(int device, int batch, int heads, int nq, int nk, size_t* bytes, char* err,
                                      size_t err_len) {
  const int ready = attn_lineage_device_ready(device, err, err_len);
  if (ready != ATTN_LINEAGE_OK) return ready;
  return guarded(err, err_len, [&] {
    require(bytes != nullptr, "bytes is null");
    *bytes = mla_plan(device, batch, heads, nq, nk).total;
    return ATTN_LINEAGE_OK;
  });
}

int attn_lineage_mla_decode(int device, void* stream, const void* q, const void* kv, void* o, void* workspace,
                            size_t workspace_bytes, int batch, int heads, int nq, int nk, float scale, char* err,
                            size_t err_len) {
  const int checked = guarded(err, err_len, [&] {
    require(batch > 0 && heads > 0 && nq > 0 && nk > 0, "sizes must be positive");
    require(nq <= nk, "nq (" + std::to_string(nq) + ") must be <= nk (" + std::to_string(nk) +
                          "): the MLA decode is causal and has no row without keys");
    require(std::isfinite(scale) && scale >= 0, "scale must be finite and >= 0 (0: 1/sqrt(192))");
    check_tensors({{q, "q"}, {kv, "kv"}, {o, "o"}, {workspace, "workspace"}});
    require(reinterpret_cast<uintptr_t>(workspace) % 256 == 0, "workspace must be 256-byte aligned");
    return ATTN_LINEAGE_OK;
  });
  if (checked != ATTN_LINEAGE_OK) return checked;
  const int ready = attn_lineage_device_ready(device, err, err_len);
  if (ready != ATTN_LINEAGE_OK) return ready;
  return guarded(err, err_len, [&] {
    namespace mla = attn::ch06::mla;
    const MlaPlan m = mla_plan(device, batch, heads, nq, nk);
    require(workspace_bytes >= m.total, "workspace: " + std::to_string(workspace_bytes) + " bytes, " +
                                            std::to_string(m.total) + " needed");
    char* ws = static_cast<char*>(workspace);
    mla::DecodeParams p;
    p.q = static_cast<const __nv_bfloat16*>(q);
    p.kv = static_cast<const __nv_bfloat16*>(kv);
    p.o_part = reinterpret_cast<float*>(ws + m.o_part);
    p.ml_part = reinterpret_cast<float*>(ws + m.ml_part);
    p.batch = batch, p.rows = heads * nq, p.nq = nq, p.nk = nk;
    p.splits = m.plan.splits, p.blocks_per_split = m.plan.blocks_per_split;
    const double tau = scale > 0 ? double(scale) : 1.0 / std::sqrt(192.0);
    p.scale_log2 = float(tau * kLog2e);
    p.combine_parts = m.plan.combine_parts;
    p.pdl = m.plan.pdl;
    p.cluster_merge = m.plan.cluster;
    __nv_bfloat16* o_c = static_cast<__nv_bfloat16*>(o);
    if (p.cluster_merge) p.o_c = o_c;
    StreamBridge bridge(stream);
    mla::launch_final(p, o_c);
    bridge.done();
    return ATTN_LINEAGE_OK;
  });
}

}  // extern "C"
