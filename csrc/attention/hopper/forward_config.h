// Internal: tile shapes of the Hopper (sm_90a, wgmma + TMA) forward kernel. Plain C++ so the
// host dispatcher can read shared-memory sizes without including CuTe or device code.
#pragma once

#include <cstdint>

namespace samattn::hopper {

// Head dimensions with an instantiation (fp16 and bf16; q and v share it).
inline constexpr int kSupportedHeadDims[] = {64, 128, 256};

constexpr bool is_supported_head_dim(int64_t head_dim) {
  for (int d : kSupportedHeadDims) {
    if (d == head_dim) return true;
  }
  return false;
}

// One block = one producer warpgroup (a single thread issues every TMA copy) and two consumer
// warpgroups, each owning 64 of the block's kBlockM = 128 query rows for the whole kernel (the
// wgmma M of one warpgroup is 64). kBlockN keys per pipeline stage: 128 up to head dim 128 (S is
// then 64 fp32 registers per thread next to O's 32 or 64); 64 at head dim 256, where O alone is
// 128 registers per thread and Q + 2 stages of K and V must fit the 227 KiB of an H100 SM.
inline constexpr int kBlockM = 128;
inline constexpr int kConsumerWarpgroups = 2;
inline constexpr int kThreads = 128 * (1 + kConsumerWarpgroups);

constexpr int block_n(int64_t head_dim) { return head_dim <= 128 ? 128 : 64; }
constexpr int stages(int64_t /*head_dim*/) { return 2; }

// Q tile + stages x (K tile + V tile), plus a little for the mbarriers (checked against the
// kernel's SharedStorage by a static_assert in forward_kernel.cuh).
inline constexpr int kBarrierBytes = 1024;
constexpr int forward_smem_bytes(int64_t head_dim, int element_bytes) {
  const int64_t tiles = kBlockM * head_dim + 2 * stages(head_dim) * block_n(head_dim) * head_dim;
  return static_cast<int>(tiles * element_bytes) + kBarrierBytes;
}

}  // namespace samattn::hopper
