// Internal: tile shapes of the tensor-core forward kernel, in one place. Plain C++ so the host
// dispatcher can read shared-memory sizes without including CUDA device code.
#pragma once

#include <cstdint>

namespace samattn::tensor_core {

// Head dimensions with an instantiation (fp16, bf16 and float with TF32); q and v must share
// it. Anything else runs on SIMT.
inline constexpr int kSupportedHeadDims[] = {32, 64, 96, 128, 192, 256};

// The masked kernel keeps block coordinates and key indices in 32-bit registers: its seqlen_q
// and seqlen_k stay below this.
inline constexpr int64_t kMaxMaskedLength = int64_t{1} << 30;

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

// Tile shapes per head dim, chosen by measurement on H100 (bf16, benchmarks/NOTES.md):
//  - hdim <= 128: kBlockM = 128 as 4 warps of 32 rows (two 16-row mma tiles per warp), as in
//    FlashAttention-2. Each K/V fragment read from shared memory feeds two mmas; every block
//    streams all of its head's K and V, so 128 rows halve L2 traffic against 64; and at <= 255
//    registers two blocks share an SM, so one block's softmax overlaps the other's mmas.
//    (64 x 64 blocks of 16-row warps measured 10-20% slower at hdim 96 and 128.)
//  - kBlockN: 128 at hdim 32 and 96 at hdim 64, where the per-iteration softmax, shuffles and
//    barriers are large next to the mmas (hdim 64 at 128 spills: S alone is 128 registers);
//    64 above, so S stays small next to the growing O.
//  - hdim 192 and 256: 64 x 64 blocks of 4 warps of 16 rows (O alone is 96 or 128 registers per
//    thread). Two blocks fit an H100 SM (77 / 99 KiB of shared memory each); FA2's A100 choice
//    of 128 x 64 with 8 warps fits only one and measured 10% slower on H100.
struct HeadDimTiles {
  int head_dim;
  TileShape shape;
};
inline constexpr HeadDimTiles kTileShapes16Bit[] = {
    {32, {4, 2, 128, 2}}, {64, {4, 2, 96, 2}},  {96, {4, 2, 64, 2}},
    {128, {4, 2, 64, 2}}, {192, {4, 1, 64, 2}}, {256, {4, 1, 64, 2}},
};
// float (TF32) tiles take twice the shared memory per element: fewer keys per block keep two
// blocks per SM on H100 and every tile within the 99 KiB opt-in of sm86/sm89.
inline constexpr HeadDimTiles kTileShapesTf32[] = {
    {32, {4, 2, 64, 2}},  {64, {4, 2, 64, 2}},  {96, {4, 2, 32, 2}},
    {128, {4, 2, 32, 2}}, {192, {4, 1, 32, 2}}, {256, {4, 1, 16, 2}},
};

constexpr TileShape tile_shape(int64_t head_dim, int element_bytes) {
  for (const HeadDimTiles& entry : element_bytes == 4 ? kTileShapesTf32 : kTileShapes16Bit) {
    if (entry.head_dim == head_dim) return entry.shape;
  }
  return {4, 1, 64, 1};  // not instantiated: is_supported_head_dim() gates every use
}

// Shared tiles are row-major with one 16-byte vector of padding per row: the row pitch is then an
// odd number of 16-byte units, so the 8 row addresses of an ldmatrix hit 8 distinct 16-byte bank
// groups (conflict-free for every head dim that is a multiple of 16).
constexpr int tile_row_stride(int64_t head_dim, int element_bytes) {
  return static_cast<int>(head_dim) + 16 / element_bytes;
}

// Q, one K and one V tile: K of the next block loads during P.V, V during Q.K^T.
constexpr int forward_smem_bytes(int64_t head_dim, int element_bytes) {
  const TileShape shape = tile_shape(head_dim, element_bytes);
  const int rows = 16 * shape.m_tiles * shape.warps + 2 * shape.block_n;
  return rows * tile_row_stride(head_dim, element_bytes) * element_bytes;
}

// The masked kernel's per-element mask tile (patterns, block maps, element masks): kBlockM rows
// of kBlockN fp32 terms, the row pitch 8 floats longer than a row so that the float2 reads of
// one half-warp (4 rows x 4 column pairs) land on 32 distinct banks. It follows the K and V
// tiles and exists only for calls that need it.
constexpr int mask_tile_pitch(int64_t head_dim, int element_bytes) {
  return (tile_shape(head_dim, element_bytes).block_n + 31) / 32 * 32 + 8;
}

constexpr int mask_tile_bytes(int64_t head_dim, int element_bytes) {
  const TileShape shape = tile_shape(head_dim, element_bytes);
  return 16 * shape.m_tiles * shape.warps * mask_tile_pitch(head_dim, element_bytes) *
         int(sizeof(float));
}

// The masked kernel's per-warp record of the classes of 32 key blocks and the fixed pattern's
// summary columns (32 bytes a warp), and each query row's first key of its fixed-pattern block
// (4 bytes a row): kept in shared memory rather than in registers across the main loop.
constexpr int key_window_bytes(int64_t head_dim, int element_bytes) {
  const TileShape shape = tile_shape(head_dim, element_bytes);
  return 32 * shape.warps + 4 * 16 * shape.m_tiles * shape.warps;
}

// Shared memory of the masked kernel: the unmasked tiles, the key-block records, plus the mask
// tile when needed.
constexpr int forward_masked_smem_bytes(int64_t head_dim, int element_bytes, bool with_tile) {
  return forward_smem_bytes(head_dim, element_bytes) + key_window_bytes(head_dim, element_bytes) +
         (with_tile ? mask_tile_bytes(head_dim, element_bytes) : 0);
}

template <int kHeadDim, int kElementBytes>
struct ForwardConfig {
  static constexpr TileShape kShape = tile_shape(kHeadDim, kElementBytes);
  static constexpr int kWarps = kShape.warps;
  static constexpr int kThreads = 32 * kWarps;
  static constexpr int kMTiles = kShape.m_tiles;
  static constexpr int kWarpRows = 16 * kMTiles;
  static constexpr int kBlockM = kWarpRows * kWarps;
  static constexpr int kBlockN = kShape.block_n;
  static constexpr int kMinBlocksPerSm = kShape.min_blocks_per_sm;
  static constexpr int kRowStride = tile_row_stride(kHeadDim, kElementBytes);  // elements
  static constexpr int kQTileElems = kBlockM * kRowStride;
  static constexpr int kKVTileElems = kBlockN * kRowStride;
  static constexpr int kSmemBytes = forward_smem_bytes(kHeadDim, kElementBytes);
  static constexpr int kChunkElems = 16 / kElementBytes;  // elements per 16-byte copy
  static constexpr int kMaskPitch = mask_tile_pitch(kHeadDim, kElementBytes);  // floats
  static constexpr int kKeyWindowBytes = key_window_bytes(kHeadDim, kElementBytes);

  static_assert(kHeadDim % 32 == 0, "tile loads give each thread whole 16-byte chunks");
  static_assert((kRowStride * kElementBytes / 16) % 2 == 1, "row pitch must be odd in 16 B");
  static_assert(kBlockN % 16 == 0, "K fragments are read 16 keys at a time");
  static_assert(kSmemBytes == (kQTileElems + 2 * kKVTileElems) * kElementBytes, "tile layout");
  static_assert(kBlockM * kHeadDim / kChunkElems % kThreads == 0, "Q tile splits over threads");
  static_assert(kBlockN * kHeadDim / kChunkElems % kThreads == 0, "K/V tiles split evenly");
  static_assert(kMaskPitch % 32 == 8, "mask tile rows 8 banks apart");
  static_assert(kSmemBytes % 16 == 0, "the mask tile starts 16-byte aligned");
};

}  // namespace samattn::tensor_core
