// Built when TUTORIAL_CUDA is OFF: there is no GPU path at all.
#include "common/device.hpp"

namespace attn {

bool cuda_built() { return false; }

std::optional<DeviceInfo> query_device(std::string* why_not) {
  if (why_not) *why_not = "built without the CUDA toolkit";
  return std::nullopt;
}

}  // namespace attn
