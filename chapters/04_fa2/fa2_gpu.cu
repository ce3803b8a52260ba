// Host side of chapter 04: upload, poison, launch a step, download, time.
#include "common/cuda/buffer.cuh"
#include "common/cuda/check.cuh"
#include "common/cuda/device_problem.cuh"
#include "common/cuda/timing.cuh"
#include "common/online_softmax.hpp"
#include "fa2_gpu.hpp"
#include "fa2_kernels.cuh"

namespace attn::ch04 {

const char* step_name(int step) {
  switch (step) {
    case 1: return "v1 loop swap (scalar)";
    case 2: return "v2 mma.sync";
    case 3: return "v3 ldmatrix + swizzle";
    case 4: return "v4 cp.async overlap";
    case 5: return "v5 heaviest first";
    case 6: return "v6 two tiles per warp";
    case 7: return "v7 deferred row sums";
    case 8: return "v8 O through smem";
    case 9: return "v9 tiles per head dim";
    case kFinal: return "final forward";
  }
  return "?";
}

std::string step_unsupported(int step, const Problem& p) {
  if (p.d != p.dv) return "d != dv";
  if (!step_built(step)) return "a lab step: this build has no lab (configure with -DTUTORIAL_LAB=ON)";
  if (step == kFinal || step == 9) {
    if (p.dtype == DType::f32) return "fp32 inputs (tensor-core steps take bf16 or fp16)";
    if (p.d != 64 && p.d != 128 && p.d != 256)
      return "head dim " + std::to_string(p.d) + (step == 9 ? " (v9: 64, 128, 256)" : " (final: 64, 128, 256)");
    return "";
  }
  if (p.dtype != DType::bf16) return std::string(dtype_name(p.dtype)) + " (steps 1-8 are built for bf16)";
  if (p.d != 64 && p.d != 128) return "head dim " + std::to_string(p.d) + " (steps 1-8: 64, 128)";
  return "";
}

namespace {

FwdParams make_params(const Problem& p, const DeviceTensor& q, const DeviceTensor& k, const DeviceTensor& v,
                      DeviceTensor& o, DeviceBuffer<float>& lse) {
  FwdParams f{};
  f.q = q.data();
  f.k = k.data();
  f.v = v.data();
  f.o = o.data();
  f.lse = lse.get();
  f.batch = p.batch;
  f.heads = p.heads;
  f.kv_heads = p.kv_heads;
  f.nq = p.nq;
  f.nk = p.nk;
  f.d = p.d;
  f.scale = float(p.softmax_scale());
  f.scale_log2 = float(p.softmax_scale() * kLog2e);
  f.causal = p.causal;
  return f;
}

bool launch_step(int step, const FwdParams& f, DType t) {
  switch (step) {
    case 1: return v1::launch(f, t, 0);
    case 2: return v2::launch(f, t, 0);
    case 3: return v3::launch(f, t, 0);
    case 4: return v4::launch(f, t, 0);
    case 5: return v5::launch(f, t, 0);
    case 6: return v6::launch(f, t, 0);
#if TUTORIAL_LAB
    case 7: return v7::launch(f, t, 0);
    case 8: return v8::launch(f, t, 0);
    case 9: return v9::launch(f, t, 0);
#endif
    case kFinal: return final_fwd::launch(f, t, 0);
  }
  return false;
}

}  // namespace

double fa2_device_bytes(const Problem& p, bool backward) {
  const double e = dtype_bytes(p.dtype);
  double bytes = e * double(p.q_elems() + p.k_elems() + p.v_elems() + p.o_elems()) + 4.0 * double(p.lse_elems());
  if (backward)
    bytes += e * double(p.o_elems() + p.q_elems() + p.k_elems() + p.v_elems()) +  // dO, dQ, dK, dV
             4.0 * double(p.q_elems() + p.lse_elems());                          // dQ accumulator, D
  return bytes;
}

// The problem on the device (common/cuda/device_problem.cuh): Q, K, V uploaded once, O and LSE
// allocated once, for every step a launch runs.
struct ForwardRunner::Impl : DeviceProblem {
  using DeviceProblem::DeviceProblem;
};

ForwardRunner::ForwardRunner(const Problem& p, const AttnInputs& in) : impl_(std::make_unique<Impl>(p, in)) {}
ForwardRunner::~ForwardRunner() = default;

GpuForward ForwardRunner::run(int step, bool time) {
  const Problem& p = impl_->p;
  DeviceTensor& o = impl_->o;
  DeviceBuffer<float>& lse = impl_->lse;
  const FwdParams f = make_params(p, impl_->q, impl_->k, impl_->v, o, lse);
  impl_->poison_outputs();
  if (!launch_step(step, f, p.dtype)) throw CudaError(std::string(step_name(step)) + ": no kernel for this problem");
  CUDA_CHECK_LAUNCH(step_name(step));
  CUDA_CHECK(cudaDeviceSynchronize());
  GpuForward r;
  r.o = o.to_host();
  const std::vector<float> l = lse.download();
  r.lse.assign(l.begin(), l.end());
  if (time)
    r.time_ms = time_gpu([&] {
                  launch_step(step, f, p.dtype);
                  CUDA_CHECK_LAUNCH(step_name(step));
                }).median_ms;
  return r;
}

GpuForward fa2_forward_gpu(const Problem& p, const AttnInputs& in, int step, bool time) {
  return ForwardRunner(p, in).run(step, time);
}

std::string backward_unsupported(const Problem& p) {
  if (p.d != p.dv) return "d != dv";
  if (p.dtype == DType::f32) return "fp32 inputs";
  if (p.d != 64 && p.d != 128) return "head dim " + std::to_string(p.d) + " (backward: 64, 128)";
  return "";
}

GpuBackward fa2_backward_gpu(const Problem& p, const AttnInputs& in, bool deterministic, bool time) {
  const DeviceTensor q = DeviceTensor::from_host(in.q, p.dtype), k = DeviceTensor::from_host(in.k, p.dtype),
                     v = DeviceTensor::from_host(in.v, p.dtype), dout = DeviceTensor::from_host(in.dout, p.dtype);
  DeviceTensor o(p.dtype, p.o_elems());
  DeviceBuffer<float> lse(p.lse_elems());
  const FwdParams f = make_params(p, q, k, v, o, lse);
  if (!final_fwd::launch(f, p.dtype, 0)) throw CudaError("backward: no forward kernel for this problem");
  CUDA_CHECK_LAUNCH("forward for the backward");

  DeviceTensor dq(p.dtype, p.q_elems()), dk(p.dtype, p.k_elems()), dv(p.dtype, p.v_elems());
  DeviceBuffer<float> dq_accum(p.q_elems()), delta(p.lse_elems());
  BwdParams b{};
  b.q = q.data();
  b.k = k.data();
  b.v = v.data();
  b.o = o.data();
  b.dout = dout.data();
  b.lse = lse.get();
  b.dq = dq.data();
  b.dk = dk.data();
  b.dv = dv.data();
  b.dq_accum = dq_accum.get();
  b.delta = delta.get();
  b.batch = p.batch;
  b.heads = p.heads;
  b.kv_heads = p.kv_heads;
  b.nq = p.nq;
  b.nk = p.nk;
  b.d = p.d;
  b.scale = f.scale;
  b.scale_log2 = f.scale_log2;
  b.causal = p.causal;
  dq.poison();
  dk.poison();
  dv.poison();
  dq_accum.poison();
  delta.poison();
  if (!launch_backward(b, p.dtype, deterministic, 0)) throw CudaError("backward: no kernel for this problem");
  CUDA_CHECK_LAUNCH("backward");
  CUDA_CHECK(cudaDeviceSynchronize());
  GpuBackward r;
  r.dq = dq.to_host();
  r.dk = dk.to_host();
  r.dv = dv.to_host();
  if (time)
    r.time_ms = time_gpu([&] {
                  launch_backward(b, p.dtype, deterministic, 0);
                  CUDA_CHECK_LAUNCH("backward");
                }).median_ms;
  return r;
}

}  // namespace attn::ch04
