// Chapter 05's backward, host side: the preprocess and postprocess kernels, and one
// run of a backward step (upload, forward for O and LSE, poison, run, download, time).
#include <algorithm>
#include <cstdlib>
#include <memory>
#include <string>

#include "backward_args.cuh"
#include "backward_gpu.hpp"
#include "backward_launch.cuh"
#include "backward_prepost.cuh"  // the preprocess and postprocess kernels
#include "backward_tiles.hpp"
#include "common/cuda/buffer.cuh"
#include "common/cuda/check.cuh"
#include "common/cuda/timing.cuh"
#include "common/errors.hpp"
#include "fa3_common.cuh"
#include "fa3_gpu.hpp"

namespace attn::ch05 {
namespace {

/// The most any step needs, what the scratch buffers are allocated for: padded rows a head
/// (b12's pairs or b13's blocks of 80), and query blocks a head (b12's).
int rows_allocated(int nq) {
  return std::max(query_blocks(BwdStep::b12_pairs_of_query_blocks, nq) * kBwdBr,
                  query_blocks(BwdStep::b13_eighty_queries, nq) * 80);
}
int query_blocks_allocated(int nq) { return query_blocks(BwdStep::b12_pairs_of_query_blocks, nq); }

PreparedStep prepare_step(BwdStep s, const BwdStepArgs& a) {
  if (!bwd_step_built(s)) throw UsageError(std::string(bwd_step_name(s)) + " is a lab step: configure with -DTUTORIAL_LAB=ON");
  switch (s) {
    case BwdStep::b1_wgmma: return b1::prepare(a);
    case BwdStep::b2_warp_specialized: return b2::prepare(a);
    case BwdStep::b5_dq_writer: return b5::prepare(a);
    case BwdStep::b6_deterministic_walk: return b6::prepare(a);
    case BwdStep::b10_consumer_offset: return b10::prepare(a);
    case BwdStep::b11_longest_walks_first: return b11::prepare(a);
    case BwdStep::final_bwd: return final_bwd::prepare(a);
#if TUTORIAL_LAB
    case BwdStep::b3_dq_fragment_order: return b3::prepare(a);
    case BwdStep::b4_no_spills: return b4::prepare(a);
    case BwdStep::b7_dq_split_by_keys: return b7::prepare(a);
    case BwdStep::b8_named_barrier_release: return b8::prepare(a);
    case BwdStep::b9_two_ds_buffers: return b9::prepare(a);
    case BwdStep::b12_pairs_of_query_blocks: return b12::prepare(a);
    case BwdStep::b13_eighty_queries: return b13::prepare(a);
    case BwdStep::b14_ds_by_queries: return b14::prepare(a);
    case BwdStep::b15_scores_ahead: return b15::prepare(a);
    case BwdStep::b16_shared_state_space: return b16::prepare(a);
    case BwdStep::b17_fa4_order: return b17::prepare(a);
#else
    default: break;
#endif
  }
  throw UsageError("unknown backward step");
}

template <class T>
void run_all(const Fa3BwdParams& p, const PreparedStep& main_kernel, bool by_element, bool prep_by_warp) {
  const long long rows = (long long)p.batch * p.heads * p.n_qblocks * p.block_rows;
  const int per_block = prep_by_warp ? kPrepThreads / 32 : kPrepThreads / (p.d / 8);
  const unsigned prep_blocks = unsigned((rows + per_block - 1) / per_block);
  if (prep_by_warp)
    preprocess_by_warp<T><<<prep_blocks, kPrepThreads>>>(p);
  else if (p.d == 64)
    preprocess<T, 64><<<prep_blocks, kPrepThreads>>>(p);
  else
    preprocess<T, 128><<<prep_blocks, kPrepThreads>>>(p);
  CUDA_CHECK_LAUNCH("backward preprocess");
  main_kernel.launch();
  if (by_element)
    postprocess_by_element<T><<<kPostOldBlocks, kPostThreads>>>(p);
  else if (p.d == 64)
    postprocess<T, 64><<<unsigned(rows / p.block_rows), kPostThreads>>>(p);
  else
    postprocess<T, 128><<<unsigned(rows / p.block_rows), kPostThreads>>>(p);
  CUDA_CHECK_LAUNCH("backward postprocess");
}

}  // namespace

const char* bwd_step_name(BwdStep s) {
  switch (s) {
    case BwdStep::b1_wgmma: return "b1 wgmma backward";
    case BwdStep::b2_warp_specialized: return "b2 warp-specialised backward";
    case BwdStep::b3_dq_fragment_order: return "b3 backward, dQ in fragment order";
    case BwdStep::b4_no_spills: return "b4 backward, no spills";
    case BwdStep::b5_dq_writer: return "b5 backward, dQ writer warp";
    case BwdStep::b6_deterministic_walk: return "b6 backward, deterministic walk from the end";
    case BwdStep::b7_dq_split_by_keys: return "b7 backward, dQ split by keys";
    case BwdStep::b8_named_barrier_release: return "b8 backward, stages released on named barriers";
    case BwdStep::b9_two_ds_buffers: return "b9 backward, two dS^T buffers";
    case BwdStep::b10_consumer_offset: return "b10 backward, the consumers a dQ apart";
    case BwdStep::b11_longest_walks_first: return "b11 backward, longest walks first";
    case BwdStep::b12_pairs_of_query_blocks: return "b12 backward, 128 queries a step";
    case BwdStep::b13_eighty_queries: return "b13 backward, 80 queries a step";
    case BwdStep::b14_ds_by_queries: return "b14 backward, dS stored by queries";
    case BwdStep::b15_scores_ahead: return "b15 backward, the next S^T ahead of dQ";
    case BwdStep::b16_shared_state_space: return "b16 backward, shared loads and stores";
    case BwdStep::b17_fa4_order: return "b17 backward, FA4's order of the products";
    case BwdStep::final_bwd: return "final backward";
  }
  return "?";
}

double fa3_backward_device_bytes(const Problem& p) {
  const double e = dtype_bytes(p.dtype);
  const double rows_pad = double(p.batch) * p.heads * rows_allocated(p.nq);
  return e * double(2 * p.q_elems() + 2 * p.k_elems() + 2 * p.v_elems() + 2 * p.o_elems()) +  // Q K V O dO dQ dK dV
         4.0 * double(p.lse_elems()) + 4.0 * rows_pad * (2 + p.d);                          // LSE, lse2, D, dQ acc
}

/// The device tensors of one problem: its inputs, O and LSE from the forward, the
/// gradients and the backward's scratch, allocated and uploaded once.
struct BackwardRunner::Impl {
  Problem p;
  DeviceTensor q, k, v, dout, o, dq, dk, dv;
  DeviceBuffer<float> lse, lse2, delta, dq_accum;
  DeviceBuffer<int> order;
  Fa3BwdParams b;

  Impl(const Problem& prob, const AttnInputs& in) : p(prob) {
    const std::string why = backward_unsupported(p);
    if (!why.empty()) throw UsageError("the backward is not built for " + why);
    // O and LSE from chapter 05's forward (v8), downloaded and uploaded again: the
    // backward's inputs, outside the timed region.
    const GpuForward fwd = fa3_forward_gpu(p, in, Step::v8_head_dims, false);
    q = DeviceTensor::from_host(in.q, p.dtype);
    k = DeviceTensor::from_host(in.k, p.dtype);
    v = DeviceTensor::from_host(in.v, p.dtype);
    dout = DeviceTensor::from_host(in.dout, p.dtype);
    o = DeviceTensor::from_host(fwd.o, p.dtype);
    lse = DeviceBuffer<float>(p.lse_elems());
    lse.upload(fwd.lse);
    const int n_qblocks = ceil_div(p.nq, kBwdBr);  // each run sets its step's own (run())
    const std::size_t rows_pad = std::size_t(p.batch) * p.heads * rows_allocated(p.nq);
    dq = DeviceTensor(p.dtype, p.q_elems());
    dk = DeviceTensor(p.dtype, p.k_elems());
    dv = DeviceTensor(p.dtype, p.v_elems());
    lse2 = DeviceBuffer<float>(rows_pad);
    delta = DeviceBuffer<float>(rows_pad);
    dq_accum = DeviceBuffer<float>(rows_pad * p.d);
    order = DeviceBuffer<int>(std::size_t(p.batch) * p.heads * query_blocks_allocated(p.nq) * 2);
    b.o = o.data();
    b.dout = dout.data();
    b.lse = lse.get();
    b.lse2 = lse2.get();
    b.delta = delta.get();
    b.dq_accum = dq_accum.get();
    b.dq_order = order.get();
    b.dq = dq.data();
    b.dk = dk.data();
    b.dv = dv.data();
    set_bwd_problem(b, p);
    b.n_qblocks = n_qblocks;
  }
};

BackwardRunner::BackwardRunner(const Problem& p, const AttnInputs& in) : impl_(std::make_unique<Impl>(p, in)) {}
BackwardRunner::~BackwardRunner() = default;

GpuBackward BackwardRunner::run(BwdStep step, bool deterministic, bool time,
                                const std::function<bool(const GpuBackward&)>& judge) {
  Impl& m = *impl_;
  BwdStepArgs a;
  a.problem = m.p;
  a.q = m.q.data();
  a.k = m.k.data();
  a.v = m.v.data();
  a.dout = m.dout.data();
  a.params = m.b;
  a.params.deterministic = deterministic;
  set_bwd_layout(a.params, layout_step(step, m.p.d), m.p.nq);  // the final backward's: b12's or b13's
  const Fa3BwdParams& b = a.params;
  const PreparedStep main_kernel = prepare_step(step, a);

  // Every output and every scratch buffer poisoned: whatever a run leaves unwritten is NaN.
  m.dq.poison();
  m.dk.poison();
  m.dv.poison();
  m.lse2.poison();
  m.delta.poison();
  m.dq_accum.poison();
  m.order.poison();
  const char* post = std::getenv("ATTN_CH05_BWD_POSTPROCESS");  // "element": the first postprocess
  const bool by_element = post != nullptr && std::string(post) == "element";
  const char* pre = std::getenv("ATTN_CH05_BWD_PREPROCESS");  // "warp": the first preprocess
  const bool prep_by_warp = pre != nullptr && std::string(pre) == "warp";
  auto run = [&] {
    if (m.p.dtype == DType::f16)
      run_all<__half>(b, main_kernel, by_element, prep_by_warp);
    else
      run_all<__nv_bfloat16>(b, main_kernel, by_element, prep_by_warp);
  };
  run();
  CUDA_CHECK(cudaDeviceSynchronize());
  GpuBackward r;
  r.dq = m.dq.to_host();
  r.dk = m.dk.to_host();
  r.dv = m.dv.to_host();
  r.grid = main_kernel.grid;
  r.smem_bytes = main_kernel.smem_bytes;
  if (time && (!judge || judge(r))) r.time_ms = time_gpu(run).median_ms;
  return r;
}

GpuBackward fa3_backward_gpu(const Problem& p, const AttnInputs& in, BwdStep step, bool deterministic, bool time,
                             const std::function<bool(const GpuBackward&)>& judge) {
  return BackwardRunner(p, in).run(step, deterministic, time, judge);
}

void fa3_backward_launch_only(const Problem& p, const AttnInputs& in, const std::vector<int>& steps, int launches) {
  BackwardRunner runner(p, in);
  for (int k : steps) {
    const BwdStep s = BwdStep(k);
    if (!bwd_step_supports(s, p)) continue;
    for (int i = 0; i < launches; ++i) runner.run(s, /*deterministic=*/false, /*time=*/false);
  }
}

}  // namespace attn::ch05
