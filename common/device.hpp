#pragma once
/// \file device.hpp
/// \brief Which GPU (if any) this run uses. Declared without CUDA headers so the
///        CPU-only build shares it; without a CUDA toolkit query_device() says so.

#include <cstddef>
#include <optional>
#include <string>

#include "common/cli.hpp"

namespace attn {

struct DeviceInfo {
  std::string name;
  int cc_major = 0, cc_minor = 0;
  int sms = 0;
  std::size_t total_mem = 0, free_mem = 0;
  std::size_t l2_bytes = 0;
  std::size_t smem_per_block_optin = 0;
  std::string describe() const;  ///< "NVIDIA H200 (sm_90, 132 SMs, 140 GB)"
};

/// True when this binary was built with its CUDA kernels.
bool cuda_built();

/// The current CUDA device, or nullopt with the reason in `why_not`
/// ("built without CUDA", "no CUDA device: ...").
std::optional<DeviceInfo> query_device(std::string* why_not = nullptr);

/// Applies --device: cpu never uses the GPU, cuda requires one (UsageError
/// otherwise), auto uses one when present. `mode` receives the line the report
/// prints: "CPU models only (reason)" or "CPU + GPU (name)".
std::optional<DeviceInfo> select_device(DeviceChoice choice, std::string* mode);

/// True when `dev` runs the Hopper-only kernels (sm_90a code: TMA, mbarrier, wgmma,
/// setmaxnreg). Otherwise false, with the one line a chapter prints in `why`:
/// "<what> needs an sm_90 GPU (Hopper); this is NVIDIA A100 (sm_80)".
bool hopper_device(const DeviceInfo& dev, const std::string& what, std::string* why = nullptr);

/// UsageError when `bytes` of device memory would not fit in what is free now.
void require_device_memory(const DeviceInfo& dev, double bytes, const std::string& what);

}  // namespace attn
