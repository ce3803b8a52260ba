#include <sstream>

#include "common/device.hpp"
#include "common/errors.hpp"
#include "common/traffic.hpp"

namespace attn {

std::string DeviceInfo::describe() const {
  std::ostringstream s;
  s << name << " (sm_" << cc_major << cc_minor << ", " << sms << " SMs, " << format_bytes(double(total_mem)) << ")";
  return s.str();
}

std::optional<DeviceInfo> select_device(DeviceChoice choice, std::string* mode) {
  if (choice == DeviceChoice::cpu) {
    *mode = "CPU models only (--device cpu)";
    return std::nullopt;
  }
  std::string why;
  auto dev = query_device(&why);
  if (!dev) {
    if (choice == DeviceChoice::cuda) throw UsageError("--device cuda: " + why);
    *mode = "CPU models only (" + why + ")";
    return std::nullopt;
  }
  *mode = "CPU + GPU (" + dev->describe() + ")";
  return dev;
}

void require_device_memory(const DeviceInfo& dev, double bytes, const std::string& what) {
  if (bytes > 0.95 * double(dev.free_mem))
    throw UsageError(what + " needs " + format_bytes(bytes) + " of device memory; " +
                     format_bytes(double(dev.free_mem)) + " is free on " + dev.name +
                     " (try a smaller --n, --batch or --heads)");
}

}  // namespace attn
