// Internal: cached facts about the current CUDA device, and the per-kernel shared-memory opt-in.
#pragma once

#include <cstdint>

#include <cuda_runtime_api.h>

namespace samattn::detail {

struct DeviceInfo {
  int index;
  int major, minor;    // compute capability
  int max_smem_optin;  // bytes of shared memory one block may opt in to
  int multiprocessors;
};

// The current device's facts, queried once per device and cached.
const DeviceInfo& current_device_info();

// Blocks of a grid-stride loop over `units` work items, `threads` a block: one block per
// `threads` items, at most kGridStrideBlocksPerSm per SM of the current device (several times
// what an SM holds at once, so every SM stays busy to the end of the loop).
inline constexpr int kGridStrideBlocksPerSm = 32;
unsigned grid_stride_blocks(int64_t units, int threads);

// Lets `kernel` use `bytes` of dynamic shared memory on the current device (needed above
// 48 KiB). Idempotent and cached per (kernel, device); throws if the device cannot provide it.
void allow_dynamic_smem(const void* kernel, int bytes);

}  // namespace samattn::detail
