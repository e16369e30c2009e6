// Internal: the shared-memory layout of the sm80 GEMM's operand tiles, as pure index functions
// (host and device), so a CPU test can replay every store and fragment read of a tile.
//
// A stage of an operand is a kTileMN x kBlockK tile (mn = m for A, n for B) of 8 KiB, stored
// the way global memory holds it, in 16-byte chunks:
//   k-major  (contiguous along k):  128 rows of mn, 4 chunks of k each (64 bytes per row);
//   mn-major (contiguous along mn): kBlockK rows of k, 128 mn each (256 or 512 bytes per row).
// Chunks are XOR-swizzled within their row so that cp.async stores (8 lanes: one row of 8
// chunks, or two rows of 4) and ldmatrix reads (8 rows at one logical chunk) touch 8 distinct
// 16-byte bank groups:
//   k-major:          chunk ^ ((row / 2) % 4)
//   mn-major, 16-bit: chunk ^ (row % 8)
//   mn-major, tf32:   chunk ^ (2 * (row % 4))   (also conflict-free for the 32-bit reads below)
//
// Fragments: ldmatrix.x4 reads a 16 (mn) x one-mma-k-step block as four 8 x 8 b16 matrices in
// the order (mn 0-7, k lo), (mn 8-15, k lo), (mn 0-7, k hi), (mn 8-15, k hi), which is the mma
// A fragment a0..a3 and, for B, the fragments (b0, b1) of n 0-7 = (r0, r2) and of n 8-15 =
// (r1, r3). k-major tiles are read plain, mn-major ones with .trans; 32-bit (tf32) elements
// pass through ldmatrix as pairs of b16, which works for k-major tiles, so mn-major tf32 tiles
// are read with four 32-bit loads per lane instead.
#pragma once

#include <cstdint>

#include "common/host_device.h"

namespace samattn::detail::sm80 {

inline constexpr int kTileMN = 128;         // rows of A / columns of B per block tile
inline constexpr int kTileBytes = 8192;     // one operand, one stage
inline constexpr int kKBytes = 64;          // bytes of k per stage and mn
inline constexpr int kChunkBytes = 16;      // a cp.async / ldmatrix row
inline constexpr int kMmaKBytes = 32;       // bytes of k per mma (k16 16-bit, k8 tf32)
inline constexpr int kLoaderThreads = 256;  // threads that share a tile's loads
inline constexpr int kChunksPerThread = kTileBytes / kChunkBytes / kLoaderThreads;
static_assert(kChunksPerThread == 2, "the loader moves two chunks per thread and operand");

// Byte offset of chunk `chunk` of row `row` in a tile (swizzled).
template <int kElemBytes>
SAMATTN_HOST_DEVICE int tile_offset(bool mn_major, int row, int chunk) {
  if (!mn_major) return row * kKBytes + ((chunk ^ ((row >> 1) & 3)) * kChunkBytes);
  constexpr int kRowBytes = kTileMN * kElemBytes;
  const int swizzle = kElemBytes == 2 ? (row & 7) : ((row & 3) << 1);
  return row * kRowBytes + ((chunk ^ swizzle) * kChunkBytes);
}

// The chunk a loader thread moves: tile row and chunk, and its first element's place in the
// block tile (mn) and k slice (k).
struct LoaderChunk {
  int row, chunk, mn, k;
};

// Chunk `i` (0 or 1) of thread `tid`: consecutive threads take consecutive chunks of a row;
// chunk 1 lies half a tile after chunk 0 (same swizzle, offset + kTileBytes / 2).
template <int kElemBytes>
SAMATTN_HOST_DEVICE LoaderChunk loader_chunk(bool mn_major, int tid, int i) {
  constexpr int kChunkElems = kChunkBytes / kElemBytes;
  constexpr int kBlockK = kKBytes / kElemBytes;
  const int chunks_per_row = mn_major ? kTileMN / kChunkElems : kBlockK / kChunkElems;
  const int rows_per_pass = kLoaderThreads / chunks_per_row;
  const int row = tid / chunks_per_row + i * rows_per_pass, chunk = tid % chunks_per_row;
  if (mn_major) return {row, chunk, chunk * kChunkElems, row};
  return {row, chunk, row, chunk * kChunkElems};
}

// Byte offset (in a tile) of the address this lane gives for the 16-mn x one-mma-k-step block
// at (mn0, k step kk). For ldmatrix, lane l addresses row l % 8 of matrix l / 8; for the
// 32-bit reads of mn-major tf32 tiles, the lane's own element of register 0 (see
// tf32_register_offset for the others).
template <int kElemBytes>
SAMATTN_HOST_DEVICE int fragment_offset(bool mn_major, int mn0, int kk, int lane) {
  constexpr int kChunkElems = kChunkBytes / kElemBytes;
  constexpr int kMmaK = kMmaKBytes / kElemBytes;
  if (!mn_major) {
    const int matrix = lane / 8;
    const int row = mn0 + (matrix & 1) * 8 + lane % 8;
    const int chunk = kk * (kMmaKBytes / kChunkBytes) + (matrix >> 1);
    return tile_offset<kElemBytes>(false, row, chunk);
  }
  if (kElemBytes == 2) {
    const int matrix = lane / 8;
    const int row = kk * kMmaK + (matrix >> 1) * 8 + lane % 8;
    const int chunk = (mn0 + (matrix & 1) * 8) / kChunkElems;
    return tile_offset<kElemBytes>(true, row, chunk);
  }
  const int mn = mn0 + lane / 4, row = kk * kMmaK + lane % 4;
  return tile_offset<kElemBytes>(true, row, mn / kChunkElems) + (mn % kChunkElems) * kElemBytes;
}

// Mn-major tf32: register q's element (mn + 8 (q & 1), k + 4 (q >> 1)) relative to register
// 0's at `offset`: mn + 8 is chunk + 2 (bit 1 of the chunk, which the swizzle may flip: an
// XOR), k + 4 is four 512-byte rows on (the same swizzle: an add).
SAMATTN_HOST_DEVICE uint32_t tf32_register_offset(uint32_t offset, int q) {
  constexpr uint32_t kNextMN = 2 * kChunkBytes;
  constexpr uint32_t kNextK = 4 * kTileMN * 4;
  return ((q & 1) ? offset ^ kNextMN : offset) + (q >> 1) * kNextK;
}

// The fragment offset of a warp's mma block `block` (16 mn further per block) from block 0's,
// for the same k step: k-major tiles +1024 bytes (16 rows) per block; mn-major tiles flip
// swizzled chunk bits (16-bit: chunk + 2 per block, tf32: chunk + 4), an XOR. Valid where the
// chunk bits a block index flips are zero at the warp's origin, as for the kernel's warp tiles
// (A: origins 0 and 64, four blocks; B: origins 0, 32, 64, 96, two blocks); the CPU test
// test_gemm_layout.cpp replays them.
template <int kElemBytes>
SAMATTN_HOST_DEVICE uint32_t block_offset(uint32_t block0_offset, bool mn_major, int block) {
  constexpr uint32_t kRowsStep = 16 * kKBytes;
  constexpr uint32_t kChunkStep = kElemBytes == 2 ? 2 * kChunkBytes : 4 * kChunkBytes;
  return mn_major ? block0_offset ^ (kChunkStep * block) : block0_offset + kRowsStep * block;
}

}  // namespace samattn::detail::sm80
