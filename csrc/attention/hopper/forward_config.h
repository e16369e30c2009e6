// Internal: tile shapes of the Hopper (sm_90a, wgmma + TMA) forward kernel. Plain C++ so the
// host dispatcher can read shared-memory sizes and grid shapes without including CuTe or device
// code.
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

// One block = one producer warpgroup (a single thread issues every TMA copy) and
// consumer_warpgroups consumer warpgroups, each owning 64 query rows of the block's tile (the
// wgmma M of one warpgroup is 64). block_n keys per pipeline stage, `stages` K and V stages,
// q_buffers Q tiles (2: the next tile's Q loads while the current one is still in use).
struct ForwardTile {
  int consumer_warpgroups;
  int block_n;
  int stages;
  int q_buffers;
  // 0, or k: every k-th exponential of an unmasked block runs on the FMA pipe, not the MUFU.
  int exp2_fma_share;

  constexpr int block_m() const { return 64 * consumer_warpgroups; }
  constexpr int threads() const { return 128 * (1 + consumer_warpgroups); }
  // setmaxnreg targets: the producer keeps the minimum, the consumers share the rest of the
  // 64K-register file (the pool is what __launch_bounds__(threads, 1) gave the block).
  constexpr int producer_registers() const { return consumer_warpgroups == 2 ? 24 : 32; }
  constexpr int consumer_registers() const { return consumer_warpgroups == 2 ? 240 : 160; }
};

// Head dim 64: S (64 fp32 registers per thread at 128 keys), P (32) and O (32) leave room, and
// 3 stages of K and V (96 KiB) keep the copy engine ahead of a MUFU-bound softmax; 2 Q tiles
// (32 KiB). Per key block and consumer warp the GEMMs take 512 tensor clocks and 64 ex2 per
// thread 512 MUFU clocks: one exponential in 8 on the FMA pipe (~12 more issue slots each)
// takes the MUFU to 448 and keeps the issue slots under the tensor time.
// Head dim 128: S 64 + P 32 + O 64 registers; 2 Q tiles + 2 stages = 192 KiB.
// Head dim 256: O alone is 128 registers; 80 keys per stage (S 40, P 20) is the widest that lets
// one Q tile (64 KiB) and 2 stages of K and V (160 KiB) fit the 227 KiB an H100 block may opt in
// to. The next tile's Q then waits until the consumers are done with the current one.
constexpr ForwardTile forward_tile(int64_t head_dim) {
  if (head_dim <= 64) return {2, 128, 3, 2, 8};
  if (head_dim <= 128) return {2, 128, 2, 2, 0};
  return {2, 80, 2, 1, 0};
}

// Two of the kernel's overlap features as run-time switches, so one benchmark run can measure
// what each is worth (SAMATTN_HOPPER_ABLATION, read by the launcher on every call; both on
// unless it names them).
struct ForwardKernelOptions {
  bool pingpong = true;     // consumer warpgroups take turns issuing their GEMMs
  bool exp2_on_fma = true;  // ForwardTile::exp2_fma_share of the exponentials on the FMA pipe
};

// Q tiles + stages x (K tile + V tile), plus a little for the mbarriers (checked against the
// kernel's SharedStorage by a static_assert in forward_traits.cuh).
inline constexpr int kBarrierBytes = 1024;
constexpr int forward_smem_bytes(int64_t head_dim, int element_bytes) {
  const ForwardTile tile = forward_tile(head_dim);
  const int64_t elements = int64_t{tile.q_buffers} * tile.block_m() * head_dim +
                           2 * int64_t{tile.stages} * tile.block_n * head_dim;
  return static_cast<int>(elements * element_bytes) + kBarrierBytes;
}

}  // namespace samattn::hopper
