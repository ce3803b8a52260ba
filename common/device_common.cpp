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

bool hopper_device(const DeviceInfo& dev, const std::string& what, std::string* why) {
  if (dev.cc_major == 9 && dev.cc_minor == 0) return true;
  if (why)
    *why = what + " needs an sm_90 GPU (Hopper: its code is built for sm_90a alone); this is " + dev.name + " (sm_" +
           std::to_string(dev.cc_major) + std::to_string(dev.cc_minor) + ")";
  return false;
}

void require_device_memory(const DeviceInfo& dev, double bytes, const std::string& what) {
  if (bytes > 0.95 * double(dev.free_mem))
    throw UsageError(what + " needs " + format_bytes(bytes) + " of device memory; " +
                     format_bytes(double(dev.free_mem)) + " is free on " + dev.name +
                     " (try a smaller --n, --batch or --heads)");
}

}  // namespace attn
