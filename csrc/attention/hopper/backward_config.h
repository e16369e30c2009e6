// Internal: tile shapes of the Hopper (sm_90a, wgmma + TMA) attention backward. Plain C++ so the
// host dispatcher can read shared-memory sizes without including CuTe or device code.
#pragma once

#include <cstdint>

namespace samattn::hopper {

// Head dims with a backward instantiation (fp16 and bf16; q and v share it). At 256 the dK and
// dV accumulators of 64 keys alone would take 256 registers per consumer thread.
inline constexpr int kBackwardHeadDims[] = {64, 128};

constexpr bool is_backward_head_dim(int64_t head_dim) {
  for (int d : kBackwardHeadDims) {
    if (d == head_dim) return true;
  }
  return false;
}

// Query rows per step. 128 at head_dim 64: the S^T / dP^T wgmmas get N = 128 (an N = 64 wgmma
// with both operands in shared memory reads them at the full shared-memory bandwidth, 128 B/clk)
// and the per-step waits, barriers and statistics are paid half as often; the accumulators (S^T
// and dP^T 64 registers each, dK, dV and dQ 32 each) fit the consumers' 240. 64 at head_dim 128,
// where dK and dV alone take 128 registers.
constexpr int backward_block_m(int64_t head_dim) { return head_dim <= 64 ? 128 : 64; }

// Kernel variants built besides the default in a -DSAMATTN_HOPPER_TUNING=ON build (benchmarks),
// for bf16 at head_dim 64 only and selected by the environment variable
// SAMATTN_HOPPER_BWD_VARIANT, to measure alternatives in one process (both measured slower than
// the default on the H200, benchmarks/NOTES.md): kBlockM64, the 64-row steps of the first
// version; kDqPerWarpgroup, the 128-row kernel with each consumer warpgroup computing and adding
// its own partial dQ (no barrier between the warpgroups).
enum class BackwardVariant { kDefault, kBlockM64, kDqPerWarpgroup };

// One block = (batch, kv head, kBlockN = 128 keys): a producer warpgroup (one thread issues the
// TMA copies, one warp stages lse and D) and two consumer warpgroups, each owning 64 of the keys
// (the wgmma M of one warpgroup) for the whole kernel. The block walks the query blocks of
// backward_block_m(head_dim) rows of every query head of its group through a kStages-deep ring
// of Q / dO tiles; dS goes through shared memory (two buffers) for dQ = dS K.
struct BackwardConfig {
  static constexpr int kBlockN = 128;  // keys per block
  static constexpr int kStages = 2;    // Q / dO / lse / D pipeline depth
  static constexpr int kDsBuffers = 2;
  static constexpr int kConsumerWarpgroups = 2;
  static constexpr int kThreads = 128 * (1 + kConsumerWarpgroups);
  static constexpr int kConsumerThreads = 128 * kConsumerWarpgroups;
  static constexpr int kStatsThreads = 32;  // the warp that stages lse and D
  static constexpr int kBarrierBytes = 1024;
};

// K and V tiles, kStages x (Q and dO tiles), the dS buffers, lse and D per stage, barriers
// (checked against the kernel's SharedStorage by a static_assert in backward_kernel.cuh).
constexpr int backward_smem_bytes(int64_t head_dim, int element_bytes, int block_m) {
  using C = BackwardConfig;
  const int64_t tiles = 2 * C::kBlockN * head_dim + 2 * C::kStages * block_m * head_dim +
                        C::kDsBuffers * block_m * C::kBlockN;
  const int64_t stats = 2 * C::kStages * block_m * 4;
  return static_cast<int>(tiles * element_bytes + stats) + C::kBarrierBytes;
}
constexpr int backward_smem_bytes(int64_t head_dim, int element_bytes) {
  return backward_smem_bytes(head_dim, element_bytes, backward_block_m(head_dim));
}

}  // namespace samattn::hopper
