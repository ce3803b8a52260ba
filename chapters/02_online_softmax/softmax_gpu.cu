// Chapter 02 on the GPU: buffers, the checked run, and the timed runs of the four steps.
#include "softmax_gpu.hpp"

#include "common/cuda/buffer.cuh"
#include "common/cuda/check.cuh"
#include "common/cuda/timing.cuh"
#include "common/errors.hpp"
#include "row_ops.cuh"

namespace attn::ch02 {

const char* kernel_name(Kernel k) {
  switch (k) {
    case Kernel::three_pass: return "v1 safe, 3 sweeps over HBM";
    case Kernel::online: return "v2 online, 2 sweeps over HBM";
    case Kernel::online_registers: return "v3 online, row in registers, 1 sweep over HBM";
    case Kernel::fused: return "v4 fused with V, 1 sweep";
  }
  return "?";
}

Variant kernel_variant(Kernel k) {
  switch (k) {
    case Kernel::three_pass: return Variant::safe3;
    case Kernel::online: return Variant::online2;
    case Kernel::online_registers: return Variant::online_on_chip;
    case Kernel::fused: return Variant::fused;
  }
  return Variant::online2;
}

std::vector<Kernel> all_kernels() {
  return {Kernel::three_pass, Kernel::online, Kernel::online_registers, Kernel::fused};
}

struct GpuSoftmax::Impl {
  Problem p;
  DeviceBuffer<float> S, P, V, O, L;
  RowArgs args{};
};

GpuSoftmax::GpuSoftmax(const Problem& p, const SoftmaxInputs& in) : impl_(std::make_unique<Impl>()) {
  Impl& m = *impl_;
  m.p = p;
  if (p.dv != 32 && p.dv != 64 && p.dv != 128) throw UsageError("the fused kernel supports dv = 32, 64 or 128");
  if (row_count(p) > std::size_t(0x7fffffff)) throw UsageError("more than 2^31 - 1 rows (one thread block each)");
  m.S = DeviceBuffer<float>(p.s_elems());
  m.P = DeviceBuffer<float>(p.s_elems());
  m.V = DeviceBuffer<float>(p.v_elems());
  m.O = DeviceBuffer<float>(p.o_elems());
  m.L = DeviceBuffer<float>(p.lse_elems());
  m.S.upload(in.s);
  m.V.upload(in.v);
  m.args = RowArgs{m.S.get(), m.P.get(), m.L.get(), m.V.get(), m.O.get(), (long long)row_count(p), p.nq, p.nk,
                   p.dv, p.heads, p.kv_heads, p.causal, float(p.softmax_scale())};
}

GpuSoftmax::~GpuSoftmax() = default;

GpuResult GpuSoftmax::run(Kernel k, bool time) {
  Impl& m = *impl_;
  GpuResult r;
  r.streamed = k == Kernel::online_registers && !row_fits_in_registers(m.p.nk);
  auto launch = [&] {
    switch (k) {
      case Kernel::three_pass: v1::launch(m.args); break;
      case Kernel::online: v2::launch(m.args); break;
      case Kernel::online_registers:
        if (r.streamed) v2::launch(m.args);  // too long for registers: v2
        else v3::launch(m.args);
        break;
      case Kernel::fused: v4::launch(m.args); break;
    }
    CUDA_CHECK_LAUNCH(kernel_name(k));
  };
  // The checked run: every output poisoned first, so an element nobody writes is NaN.
  const bool fused = k == Kernel::fused;
  (fused ? m.O : m.P).poison();
  m.L.poison();
  launch();
  CUDA_CHECK(cudaDeviceSynchronize());
  (fused ? r.o : r.p) = (fused ? m.O : m.P).download();
  r.lse = m.L.download();
  if (time) r.time_ms = time_gpu(launch).median_ms;
  return r;
}

}  // namespace attn::ch02
