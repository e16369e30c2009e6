// Internal: tile shapes of the tensor-core forward kernel, in one place. Plain C++ so the host
// dispatcher can read shared-memory sizes without including CUDA device code.
#pragma once

#include <cstdint>

namespace samattn::tensor_core {

// Head dimensions with an instantiation; q and v must share it. Anything else runs on SIMT.
inline constexpr int kSupportedHeadDims[] = {32, 64, 96, 128, 192, 256};

constexpr bool is_supported_head_dim(int64_t head_dim) {
  for (int d : kSupportedHeadDims) {
    if (d == head_dim) return true;
  }
  return false;
}

struct TileShape {
  int warps;              // warps per block
  int m_tiles;            // 16-row mma tiles each warp owns: kBlockM = 16 * m_tiles * warps
  int block_n;            // keys per main-loop iteration
  int min_blocks_per_sm;  // __launch_bounds__ occupancy target (caps registers per thread)
};

// FlashAttention-2's sm80 tile shapes (numbers and reasoning in benchmarks/NOTES.md):
//  - kBlockM = 128 everywhere: every block streams all of its head's K and V, so L2 traffic is
//    (seqlen_q / kBlockM) * |K + V|; 64-row blocks would double it and approach L2 bandwidth on
//    H100 at long sequences.
//  - Up to hdim 128, 4 warps of 32 rows: a K or V fragment read from shared memory feeds two
//    mmas, and at <= 255 registers two blocks share an SM, so one block's softmax overlaps the
//    other's mmas across the barriers.
//  - hdim 192 and 256: 8 warps of 16 rows, since O alone would need 192 or 256 registers per
//    thread at 32 rows; one block per SM (128-135 KiB of shared memory at hdim 256).
//  - kBlockN = 128 for hdim <= 64, where the per-iteration softmax, shuffles and barriers are
//    large next to the mmas; 64 above, so S stays small next to the growing O.
struct HeadDimTiles {
  int head_dim;
  TileShape shape;
};
inline constexpr HeadDimTiles kTileShapes[] = {
    {32, {4, 2, 64, 2}},  {64, {4, 2, 64, 2}},  {96, {4, 2, 64, 2}},
    {128, {4, 2, 64, 2}}, {192, {8, 1, 64, 1}}, {256, {8, 1, 64, 1}},
};

constexpr TileShape tile_shape(int head_dim) {
  for (const HeadDimTiles& entry : kTileShapes) {
    if (entry.head_dim == head_dim) return entry.shape;
  }
  return {4, 1, 64, 1};  // not instantiated: is_supported_head_dim() gates every use
}

template <int kHeadDim>
struct ForwardConfig {
  static constexpr TileShape kShape = tile_shape(kHeadDim);
  static constexpr int kWarps = kShape.warps;
  static constexpr int kThreads = 32 * kWarps;
  static constexpr int kMTiles = kShape.m_tiles;
  static constexpr int kWarpRows = 16 * kMTiles;
  static constexpr int kBlockM = kWarpRows * kWarps;
  static constexpr int kBlockN = kShape.block_n;
  static constexpr int kMinBlocksPerSm = kShape.min_blocks_per_sm;
  // Shared tiles are row-major with one 16-byte vector of padding per row: the row pitch is then
  // an odd number of 16-byte units, so the 8 row addresses of an ldmatrix hit 8 distinct
  // 16-byte bank groups (conflict-free for every head dim that is a multiple of 16).
  static constexpr int kRowStride = kHeadDim + 8;  // elements
  static constexpr int kElementBytes = 2;
  static constexpr int kQTileElems = kBlockM * kRowStride;
  static constexpr int kKVTileElems = kBlockN * kRowStride;
  // Q, one K and one V tile: K of the next block loads during P.V, V during Q.K^T.
  static constexpr int kSmemBytes = (kQTileElems + 2 * kKVTileElems) * kElementBytes;

  static_assert(kHeadDim % 32 == 0, "tile loads give each thread whole 16-byte chunks");
  static_assert((kRowStride * kElementBytes / 16) % 2 == 1, "row pitch must be odd in 16 B");
  static_assert(kBlockN % 16 == 0, "keys are consumed 16 at a time by P.V");
  static_assert(kBlockM * kHeadDim / 8 % kThreads == 0, "Q tile must split evenly over threads");
  static_assert(kBlockN * kHeadDim / 8 % kThreads == 0, "K/V tiles must split evenly");
};

// Dynamic shared memory of the instantiation for `head_dim` (0 when there is none).
constexpr int forward_smem_bytes(int64_t head_dim) {
  switch (head_dim) {
    case 32:
      return ForwardConfig<32>::kSmemBytes;
    case 64:
      return ForwardConfig<64>::kSmemBytes;
    case 96:
      return ForwardConfig<96>::kSmemBytes;
    case 128:
      return ForwardConfig<128>::kSmemBytes;
    case 192:
      return ForwardConfig<192>::kSmemBytes;
    case 256:
      return ForwardConfig<256>::kSmemBytes;
  }
  return 0;
}

}  // namespace samattn::tensor_core
