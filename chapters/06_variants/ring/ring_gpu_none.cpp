// The GPU backends in a build without the CUDA toolkit: they say so.
#include "common/errors.hpp"
#include "ring/ring_gpu.hpp"

namespace attn::ch06::ring {

bool nccl_built() { return false; }

std::string ring_gpu_unsupported(const Problem&, bool) { return "built without CUDA"; }

GpuRingResult ring_gpu(const Problem&, const AttnInputs&, const GpuRingOptions&) {
  throw UsageError("the streams and nccl backends need a CUDA build (use --backend threads)");
}

SingleGpuTiming single_gpu_timing(const Problem&, const AttnInputs&, bool) { return {}; }
double d2d_copy_ms(double) { return 0; }

}  // namespace attn::ch06::ring
