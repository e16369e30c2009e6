// Internal: tile shapes of the tensor-core backward (fp16/bf16), in one place. Plain C++ so the
// host dispatcher can read shared-memory sizes without including CUDA device code.
#pragma once

#include <cstdint>

#include "attention/tensor_core/forward_config.h"

namespace samattn::tensor_core {

// Head dims with a backward instantiation. Each warp keeps dK and dV of its 16 keys in registers
// (head_dim / 2 floats a lane each); above 128 both would not fit next to S^T and dP^T, so two
// warps share each 16 keys there (BackwardConfig::kColumnSplit).
inline constexpr int kBackwardHeadDims[] = {32, 64, 96, 128, 192, 256};

constexpr bool is_backward_head_dim(int64_t head_dim) {
  for (int d : kBackwardHeadDims) {
    if (d == head_dim) return true;
  }
  return false;
}

// Both kernels use 64 x 64 tiles on 4 warps of 16 rows:
//  - dK/dV kernel: one block per (batch, kv head, 64 keys); a warp owns 16 keys and walks the
//    query blocks (64 rows) of every query head of the group, computing S^T = K Q^T and
//    dP^T = V dO^T with keys as mma rows, so P^T and dS^T are A fragments of dV += P^T dO and
//    dK += dS^T Q straight from the accumulators (no transposes through shared memory).
//  - dQ (deterministic mode): one block per (batch, head, 64 queries), the forward's layout.
// Shared memory: K, V, Q, dO tiles (row pitch head_dim + 8 elements, as in the forward), the dS
// tile (64 x 72 elements) for dQ += dS K, and lse / D of the query block (64 floats each).
struct BackwardConfigBase {
  static constexpr int kWarps = 4;
  static constexpr int kThreads = 32 * kWarps;
  static constexpr int kBlockM = 64;  // query rows per step
  static constexpr int kBlockN = 64;  // keys per block
  static constexpr int kMinBlocksPerSm = 2;
  static constexpr int kDsStride = kBlockN + 8;  // odd multiple of 16 bytes in 16-bit elements
  // Masked kernels' tile of fp32 mask terms, 64 x 64 with rows 8 banks apart (float2 reads of a
  // half-warp, 4 rows x 4 column pairs, hit 32 distinct banks).
  static constexpr int kMaskPitch = kBlockN + 8;
  static constexpr int kMaskTileBytes = kBlockM * kMaskPitch * int(sizeof(float));
};

constexpr int backward_smem_bytes(int64_t head_dim) {
  const int stride = tile_row_stride(head_dim, 2);
  return (2 * BackwardConfigBase::kBlockN + 2 * BackwardConfigBase::kBlockM) * stride * 2 +
         BackwardConfigBase::kBlockM * BackwardConfigBase::kDsStride * 2 +
         2 * BackwardConfigBase::kBlockM * int(sizeof(float));
}

// The masked kernels add the mask tile for calls with a pattern, block map or element mask.
constexpr int backward_masked_smem_bytes(int64_t head_dim, bool with_tile) {
  return backward_smem_bytes(head_dim) + (with_tile ? BackwardConfigBase::kMaskTileBytes : 0);
}

template <int kHeadDim>
struct BackwardConfig : BackwardConfigBase {
  static constexpr int kRowStride = tile_row_stride(kHeadDim, 2);  // elements
  static constexpr int kTileElems = 64 * kRowStride;
  static constexpr int kSmemBytes = backward_smem_bytes(kHeadDim);
  static constexpr int kDTiles = kHeadDim / 8;   // 8-column accumulator tiles of a 16-row tile
  static constexpr int kKSteps = kHeadDim / 16;  // mma k-steps over the head dim
  // Queries of one S^T / dP^T pass of the dK/dV kernel: above head dim 64, dK and dV take 96+
  // registers, so S^T and dP^T are computed for half the step's queries at a time.
  static constexpr int kSubQueries = kHeadDim <= 64 ? kBlockM : kBlockM / 2;
  // Above head dim 128 the dK/dV kernel runs 8 warps in two groups of 4 that split the head dim:
  // warps w and w + 4 own the same 16 keys and compute the same S^T, P^T, dP^T and dS^T, and each
  // keeps dK and dV of its half of the columns (head_dim / 4 floats a lane each; both whole would
  // take head_dim / 2 each, 256 registers at head dim 256) and adds its half of dQ. S^T and dP^T
  // are computed twice: 7 products a step's worth instead of 5.
  static constexpr int kColumnSplit = kHeadDim > 128 ? 2 : 1;
  static constexpr int kDkdvWarps = kWarps * kColumnSplit;
  static constexpr int kDkdvThreads = 32 * kDkdvWarps;
  static constexpr int kDkdvMinBlocksPerSm = kColumnSplit == 1 ? kMinBlocksPerSm : 1;

  static_assert(kHeadDim % 32 == 0, "tile loads give each thread whole 16-byte chunks");
  static_assert((kRowStride * 2 / 16) % 2 == 1, "row pitch must be odd in 16 B");
  static_assert((kDsStride * 2 / 16) % 2 == 1, "dS row pitch must be odd in 16 B");
  static_assert(kBlockM == kBlockN, "tiles are carved as 64-row blocks");
  static_assert(kBlockM == 16 * kWarps, "a warp owns 16 rows");
  static_assert(kSubQueries % 16 == 0 && kBlockM % kSubQueries == 0, "whole 16-query mma steps");
  static_assert(kMaskPitch % 32 == 8, "mask tile rows 8 banks apart");
  static_assert(kSmemBytes % 16 == 0, "the mask tile starts 16-byte aligned");
};

}  // namespace samattn::tensor_core
