// The NCCL backend in a build that found no NCCL: it says so.
#include "common/errors.hpp"
#include "ring/ring_nccl.hpp"

namespace attn::ch06::ring {

bool nccl_built() { return false; }

GpuRingResult ring_nccl(const Problem&, const AttnInputs&, const GpuRingOptions&) {
  throw UsageError("this build has no NCCL backend (NCCL was not found at configure time; see ring/part.cmake)");
}

}  // namespace attn::ch06::ring
