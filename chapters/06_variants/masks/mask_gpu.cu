// Host side of the masked kernels: upload the inputs, the block map and the policy's
// data, poison the outputs, launch, download, time.
#include "masks/mask_gpu.hpp"

#include "chapters/05_fa3_hopper/backward_args.cuh"  // chapter 05's backward parameters and dQ layout
#include "common/cuda/buffer.cuh"
#include "common/cuda/check.cuh"
#include "common/cuda/device_problem.cuh"
#include "common/cuda/timing.cuh"
#include "common/errors.hpp"
#include "common/online_softmax.hpp"
#include "masks/block_map.hpp"
#include "masks/mask_kernels.cuh"

namespace attn::ch06 {

const char* gpu_path_name(GpuPath p) {
  switch (p) {
    case GpuPath::sm80: return "sm80 forward";
    case GpuPath::sm90a: return "sm90a forward";
    case GpuPath::backward: return "backward";
  }
  return "?";
}

std::string mask_gpu_unsupported(const Problem& p, GpuPath path, const DeviceInfo& dev, int hopper_step) {
  const bool final_fwd = path == GpuPath::sm90a && hopper_step == kHopperFinal;
  if (final_fwd && !(p.d == p.dv && (p.d == 64 || p.d == 128 || p.d == 256)))
    return "not built for d = " + std::to_string(p.d) + " (the final sm90a forward: d = 64, 128 and 256)";
  if (!final_fwd && (p.d != 128 || p.dv != 128))
    return "not built for d = " + std::to_string(p.d) + " (this kernel: d = 128; the final sm90a forward: 64, 128, 256)";
  // The final sm90a forward has bf16 and fp16 (steps/final.cu, final_fp16.cu); every other kernel bf16.
  if (final_fwd && p.dtype != DType::bf16 && p.dtype != DType::f16)
    return std::string("not built for ") + dtype_name(p.dtype) + " (the final sm90a forward: bf16 and fp16)";
  if (!final_fwd && p.dtype != DType::bf16)
    return std::string("not built for ") + dtype_name(p.dtype) + " (this kernel: bf16; the final sm90a forward: bf16, fp16)";
  if (dev.cc_major < 8) return "needs sm_80 or newer";
  if (path == GpuPath::sm90a) {
    if (!hopper_mask::available()) return "sm90a kernels not built";
    if (dev.cc_major != 9) return "needs an sm_90 GPU (Hopper)";
  }
  return "";
}

const char* bwd_kernel_name(BwdKernel k) { return k == BwdKernel::sm90a ? "sm90a backward" : "sm80 backward"; }

std::string mask_backward_unsupported(const Problem& p, const MaskSpec& s, BwdKernel k, const DeviceInfo& dev) {
  if (k == BwdKernel::sm80) return mask_gpu_unsupported(p, GpuPath::backward, dev);
  if (!(p.d == p.dv && (p.d == 64 || p.d == 128)))
    return "not built for d = " + std::to_string(p.d) + " (the sm90a backward: d = 64 and 128)";
  if (p.dtype != DType::bf16 && p.dtype != DType::f16)
    return std::string("not built for ") + dtype_name(p.dtype) + " (the sm90a backward: bf16 and fp16)";
  if (s.kind == MaskKind::document)
    return "the document mask's packed rows: the sm80 backward (the sm90a backward reads the standard layout)";
  if (!hopper_bwd::available()) return "sm90a kernels not built";
  if (dev.cc_major != 9) return "needs an sm_90 GPU (Hopper)";
  return "";
}

const char* hopper_step_file(int step) {
  switch (step) {
    case 0: return "hopper_mask.cu";
    case 1: return "steps/v1_two_q_buffers.cu";
    case 2: return "steps/v2_tile_overlap.cu";
    case 3: return "steps/v3_document_tiles.cu";
    case 4: return "steps/v4_row_spans.cu";
    case kHopperLab: return "steps/lab/v5_epilogue_in_place.cu";
    case kHopperFinal: return "steps/final.cu";
  }
  return "?";
}


namespace {

DevStrides dev(const Strides& s) { return {s.batch, s.head, s.row}; }

/// The block map in device memory (forward or backward lists).
struct DeviceMap {
  DeviceBuffer<int> n_part, part, n_full, full, order, q_row0, q_row1;
  DevMap view(const BlockMap& m, bool backward) const {
    const bool docs = !backward && !m.q_row0.empty();  // a document map: its tiles' rows
    return {n_part.get(), part.get(), n_full.get(), full.get(), order.get(), backward ? m.tk : m.tq,
            backward ? m.tq : m.tk, m.map_batch, m.map_heads, docs ? q_row0.get() : nullptr,
            docs ? q_row1.get() : nullptr, backward ? 0 : m.tiles_with_work()};
  }
};

template <class T>
DeviceBuffer<T> upload(const std::vector<T>& v) {
  DeviceBuffer<T> b(std::max<std::size_t>(1, v.size()));
  if (!v.empty()) b.upload(v);
  return b;
}

DeviceMap upload_map(const BlockMap& m, bool backward) {
  DeviceMap d;
  d.n_part = upload(backward ? m.q_n_part : m.n_part);
  d.part = upload(backward ? m.q_part : m.part);
  d.n_full = upload(backward ? m.q_n_full : m.n_full);
  d.full = upload(backward ? m.q_full : m.full);
  d.order = upload(m.order);
  d.q_row0 = upload(m.q_row0);
  d.q_row1 = upload(m.q_row1);
  return d;
}

/// The policy's data on the device: the document of every token, the sink logits.
struct DevicePolicyData {
  DeviceBuffer<int> doc;
  DeviceBuffer<float> sinks;
  PolicyData view() const { return {doc.get(), sinks.get()}; }
};

DevicePolicyData upload_policy_data(const MaskSpec& s) {
  DevicePolicyData d;
  d.doc = upload(s.kind == MaskKind::document ? doc_of_tokens(s.doc_lens) : std::vector<int>{});
  d.sinks = upload(s.sink_logits);
  return d;
}

}  // namespace

GpuMaskForward mask_forward_gpu(const Problem& p, const MaskSpec& s, const TokenLayout& layout, const AttnInputs& in,
                                GpuPath path, bool time, const GpuForwardOptions& opt) {
  const bool hopper = path == GpuPath::sm90a;
  // sm90a from v3 on (the final kernel too): documents are tiled from each document's start (the document map).
  const bool doc_tiles = hopper && opt.hopper_step >= 3 && s.kind == MaskKind::document && p.batch == 1 && p.nq == p.nk;
  // The tiles of the kernel that runs: the final sm90a forward's keys a tile depend on d.
  const int bc = !hopper ? ampere_mask::Bc : opt.hopper_step == kHopperFinal ? hopper_final::tile_keys(p.d) : hopper_mask::Bc;
  static_assert(hopper_v3::Br == hopper_mask::Br && hopper_final::Br == hopper_mask::Br, "one query tile on sm90a");
  BlockMap map = doc_tiles ? build_document_block_map(s, p, hopper_mask::Br, bc)
                 : hopper  ? build_block_map(s, p, hopper_mask::Br, bc)
                           : build_block_map(s, p, ampere_mask::Br, bc);
  if (opt.all_partial) {  // every full tile moves to the partial list (forward lists only)
    for (std::size_t f = 0; f < map.n_full.size(); ++f) {
      for (int k = 0; k < map.n_full[f]; ++k) map.part[f * map.tk + map.n_part[f] + k] = map.full[f * map.tk + k];
      map.n_part[f] += map.n_full[f];
      map.n_full[f] = 0;
    }
  }
  const int faulted_lists = inject_map_fault(map, opt.fault);
  DeviceProblem dp(p, in);
  dp.poison_outputs();
  const DeviceMap dmap = upload_map(map, false);
  const DevicePolicyData pd = upload_policy_data(s);
  FwdParams f{};
  f.q = dp.q.data(), f.k = dp.k.data(), f.v = dp.v.data(), f.o = dp.o.data(), f.lse = dp.lse.get();
  f.batch = p.batch, f.heads = p.heads, f.kv_heads = p.kv_heads, f.nq = p.nq, f.nk = p.nk, f.d = p.d;
  f.scale = float(p.softmax_scale());
  f.scale_log2 = float(p.softmax_scale() * kLog2e);
  f.sq = dev(layout.q), f.sk = dev(layout.k), f.sv = dev(layout.v), f.so = dev(layout.o);
  f.map = dmap.view(map, false);
  f.ctas = opt.ctas;
  // sm90a: the tensor maps are encoded once, outside the timed launches.
  if (hopper && !hopper_step_built(opt.hopper_step))
    throw std::runtime_error("no sm90a step " + std::to_string(opt.hopper_step) + " in this build");
  const std::function<void()> hopper_run = !hopper              ? nullptr
                                           : opt.hopper_step == 0 ? hopper_mask::prepare(f, s, p, pd.view(), 0)
                                           : opt.hopper_step == 1 ? hopper_v1::prepare(f, s, p, pd.view(), 0)
                                           : opt.hopper_step == 2 ? hopper_v2::prepare(f, s, p, pd.view(), 0)
                                           : opt.hopper_step == 3 ? hopper_v3::prepare(f, s, p, pd.view(), 0)
                                           : opt.hopper_step == 4 ? hopper_v4::prepare(f, s, p, pd.view(), 0)
#if TUTORIAL_LAB
                                           : opt.hopper_step == kHopperLab ? hopper_v5::prepare(f, s, p, pd.view(), 0)
#endif
                                                                  : hopper_final::prepare(f, s, p, pd.view(), 0);
  if (hopper && !hopper_run) throw std::runtime_error("no masked kernel for this problem");
  auto run = [&] {
    if (hopper) return hopper_run();
    if (!ampere_mask::launch(f, s, p, pd.view(), 0)) throw std::runtime_error("no masked kernel for this problem");
  };
  run();
  CUDA_CHECK(cudaGetLastError());
  CUDA_CHECK(cudaDeviceSynchronize());
  GpuMaskForward r;
  r.o = dp.o.to_host();
  r.lse = dp.lse.download();
  r.tiles = map.kept_tiles();
  r.tile_keys = bc;
  r.faulted_lists = faulted_lists;
  if (time) r.time_ms = time_gpu(run).median_ms;
  return r;
}

namespace {

/// One backward run, both kernels: launch, check, download the gradients (and dLoss/dsink), time.
template <class Run>
GpuMaskBackward run_backward(const Run& run, const DeviceTensor& dq, const DeviceTensor& dk, const DeviceTensor& dv,
                             DeviceBuffer<float>* dsink, bool time) {
  run();
  CUDA_CHECK(cudaGetLastError());
  CUDA_CHECK(cudaDeviceSynchronize());
  GpuMaskBackward r;
  r.dq = dq.to_host();
  r.dk = dk.to_host();
  r.dv = dv.to_host();
  if (dsink) r.dsink = dsink->download();
  if (time) r.time_ms = time_gpu(run).median_ms;
  return r;
}

GpuMaskBackward hopper_backward_gpu(const Problem& p, const MaskSpec& s, const TokenLayout& layout, const AttnInputs& in,
                                    const std::vector<float>& o_host, const std::vector<float>& lse_host, bool time,
                                    bool deterministic) {
  if (layout.packed) throw UsageError("the sm90a masked backward reads the standard layout, not packed rows");
  const BlockMap map = build_block_map(s, p, hopper_bwd::step_rows(p.d), hopper_bwd::kBc);
  const BackwardWalks hw = backward_walks(map);
  const DeviceBuffer<int> wl = upload(hw.list), wc = upload(hw.count), wr = upload(hw.rank);
  const DeviceTensor q = DeviceTensor::from_host(in.q, p.dtype), k = DeviceTensor::from_host(in.k, p.dtype),
                     v = DeviceTensor::from_host(in.v, p.dtype), dout = DeviceTensor::from_host(in.dout, p.dtype),
                     o = DeviceTensor::from_host(o_host, p.dtype);
  DeviceBuffer<float> lse(p.lse_elems());
  lse.upload(lse_host);
  DeviceTensor dq(p.dtype, p.q_elems()), dk(p.dtype, p.k_elems()), dv(p.dtype, p.v_elems());
  HopperBwdArgs a;
  a.problem = p;
  ch05::Fa3BwdParams& b = a.params;
  ch05::set_bwd_problem(b, p);
  ch05::set_bwd_layout(b, ch05::layout_step(ch05::BwdStep::final_bwd, p.d), p.nq);  // chapter 05's final backward's
  b.deterministic = deterministic;
  const std::size_t rows_pad = std::size_t(p.batch) * p.heads * b.n_qblocks * b.block_rows;
  DeviceBuffer<float> lse2(rows_pad), delta(rows_pad), dq_acc(rows_pad * p.d);
  DeviceBuffer<int> order(std::size_t(p.batch) * p.heads * b.n_qblocks * 2);
  // Every output and every scratch buffer poisoned: whatever a run leaves unwritten is NaN.
  dq.poison();
  dk.poison();
  dv.poison();
  lse2.poison();
  delta.poison();
  dq_acc.poison();
  order.poison();
  const DevicePolicyData pd = upload_policy_data(s);
  const bool sink = s.kind == MaskKind::learned_sink;
  DeviceBuffer<float> dsink(std::max(1, sink ? p.heads : 1));
  if (sink) dsink.poison();
  b.o = o.data(), b.dout = dout.data(), b.lse = lse.get(), b.lse2 = lse2.get(), b.delta = delta.get();
  b.dq_accum = dq_acc.get(), b.dq_order = order.get(), b.dq = dq.data(), b.dk = dk.data(), b.dv = dv.data();
  a.walks = {wl.get(), wc.get(), wr.get(), hw.tq, hw.tk, map.map_batch};
  a.q = q.data(), a.k = k.data(), a.v = v.data(), a.dout = dout.data();
  a.dsink = sink ? dsink.get() : nullptr;
  const std::function<void()> run = hopper_bwd::prepare(a, s, pd.view(), 0);
  if (!run) throw std::runtime_error("no sm90a masked backward for this problem");
  return run_backward(run, dq, dk, dv, sink ? &dsink : nullptr, time);
}

}  // namespace

GpuMaskBackward mask_backward_gpu(const Problem& p, const MaskSpec& s, const TokenLayout& layout, const AttnInputs& in,
                                  const std::vector<float>& o_host, const std::vector<float>& lse_host, bool time,
                                  bool deterministic, BwdKernel kernel) {
  if (kernel == BwdKernel::sm90a) return hopper_backward_gpu(p, s, layout, in, o_host, lse_host, time, deterministic);
  const BlockMap map = build_block_map(s, p, backward_mask::Br, backward_mask::Bc);
  // The deterministic dQ kernel walks key blocks of 64 per query block of 64: the forward lists of its own map.
  const BlockMap dq_map = deterministic ? build_block_map(s, p, backward_mask::Br, backward_mask::DqBc) : BlockMap{};
  const DeviceTensor q = DeviceTensor::from_host(in.q, p.dtype), k = DeviceTensor::from_host(in.k, p.dtype),
                     v = DeviceTensor::from_host(in.v, p.dtype), dout = DeviceTensor::from_host(in.dout, p.dtype),
                     o = DeviceTensor::from_host(o_host, p.dtype);
  DeviceBuffer<float> lse(p.lse_elems()), delta(p.lse_elems()), dq_acc(p.q_elems());
  lse.upload(lse_host);
  DeviceTensor dq(p.dtype, p.q_elems()), dk(p.dtype, p.k_elems()), dv(p.dtype, p.v_elems());
  dq.poison();
  dk.poison();
  dv.poison();
  dq_acc.poison();  // the preprocess kernel must zero it
  const DeviceMap dmap = upload_map(map, true);
  const DeviceMap dqmap = deterministic ? upload_map(dq_map, false) : DeviceMap{};
  const DevicePolicyData pd = upload_policy_data(s);
  const bool sink = s.kind == MaskKind::learned_sink;
  DeviceBuffer<float> dsink(std::max(1, sink ? p.heads : 1));
  if (sink) dsink.poison();
  BwdParams b{};
  b.q = q.data(), b.k = k.data(), b.v = v.data(), b.o = o.data(), b.dout = dout.data(), b.lse = lse.get();
  b.dq = dq.data(), b.dk = dk.data(), b.dv = dv.data(), b.dq_accum = dq_acc.get(), b.delta = delta.get();
  b.batch = p.batch, b.heads = p.heads, b.kv_heads = p.kv_heads, b.nq = p.nq, b.nk = p.nk, b.d = p.d;
  b.scale = float(p.softmax_scale());
  b.scale_log2 = float(p.softmax_scale() * kLog2e);
  b.sq = dev(layout.q), b.sk = dev(layout.k), b.sv = dev(layout.v), b.so = dev(layout.o);
  b.map = dmap.view(map, true);
  if (deterministic) b.dq_map = dqmap.view(dq_map, false);
  b.deterministic = deterministic;
  b.dsink = sink ? dsink.get() : nullptr;
  auto run = [&] {
    if (!backward_mask::launch(b, s, p, pd.view(), 0)) throw std::runtime_error("no masked backward for this problem");
  };
  return run_backward(run, dq, dk, dv, sink ? &dsink : nullptr, time);
}

}  // namespace attn::ch06
