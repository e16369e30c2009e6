// Internal: cached facts about the current CUDA device, and the per-kernel shared-memory opt-in.
#pragma once

#include <cuda_runtime_api.h>

namespace samattn::detail {

struct DeviceInfo {
  int index;
  int major, minor;              // compute capability
  int max_smem_optin;            // bytes of shared memory one block may opt in to
  int multiprocessors;
};

// The current device's facts, queried once per device and cached.
const DeviceInfo& current_device_info();

// Lets `kernel` use `bytes` of dynamic shared memory on the current device (needed above
// 48 KiB). Idempotent and cached per (kernel, device); throws if the device cannot provide it.
void allow_dynamic_smem(const void* kernel, int bytes);

}  // namespace samattn::detail
