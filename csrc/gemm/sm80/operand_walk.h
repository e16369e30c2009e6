// Internal: which global elements a loader thread of the sm80 GEMM reads, k tile by k tile, and
// how (host and device), so a CPU test can replay every read against the operand's bounds.
//
// A chunk of 16 bytes goes to shared memory by one of three copies:
//   kFullAsync: all its elements lie inside the operand and the operand allows cp.async;
//   kZeroFill:  none does (cp.async of 0 source bytes from the operand's base, or zero stores);
//   kElements:  some do (a tail) or the operand does not allow cp.async: element loads of the
//               `valid` leading elements, the rest zero.
// A cp.async that reads fewer than 16 source bytes is never issued: ptxas turns it into
// LDGSTS.ZFILL at the chunk address plus the zero-filled byte count, a 16-byte access that runs
// past the end of an allocation whose last element sits inside the chunk (compute-sanitizer
// memcheck failed the TF32 1 x 1 x 1 and mn-major tail cases on it).
#pragma once

#include <cstdint>

#include "common/host_device.h"
#include "gemm/sm80/gemm_sm80.h"
#include "gemm/sm80/tile_layout.h"

namespace samattn::detail::sm80 {

enum class ChunkCopy { kFullAsync, kZeroFill, kElements };

// The copy of a chunk with `valid` leading elements inside the operand (0..kChunkElems).
SAMATTN_HOST_DEVICE ChunkCopy chunk_copy(bool async, int valid, int chunk_elems) {
  if (!async) return ChunkCopy::kElements;
  if (valid == chunk_elems) return ChunkCopy::kFullAsync;
  return valid == 0 ? ChunkCopy::kZeroFill : ChunkCopy::kElements;
}

// A thread's walk over one operand: the two chunks of loader_chunk, k tile after k tile.
// `Bits` is the raw element type (2 or 4 bytes); loads never convert.
template <typename Bits>
struct OperandWalk {
  static constexpr int kElemBytes = static_cast<int>(sizeof(Bits));
  static constexpr int kChunkElems = kChunkBytes / kElemBytes;
  static constexpr int kBlockK = kKBytes / kElemBytes;

  const Bits* ptr[kChunksPerThread];  // the chunk's first element at the current k tile
  int line_left[kChunksPerThread];    // lines (mn for k-major, k for mn-major) left, from this one
  int fast_left;                      // elements left along the fast dimension, from this one
  int smem_offset;                    // chunk 0's byte offset in the tile

  // Sets up the walk of the mn block starting at mn0 (rows mn0.. of A or columns of B), of an
  // operand with mn_extent x k_extent elements. Strides and flags stay in `op` (kernel
  // parameters, read from the constant bank), so the walk holds eight registers of state.
  SAMATTN_HOST_DEVICE void init(const OperandArgs& op, int64_t batch, int mn0, int mn_extent,
                                int k_extent, int tid) {
    const bool mn_major = op.mn_major;
    const int64_t line_stride = mn_major ? op.k_stride : op.mn_stride;
    const int64_t fast_stride = mn_major ? op.mn_stride : op.k_stride;
    const Bits* base = static_cast<const Bits*>(op.ptr) + batch * op.batch_stride;
    const LoaderChunk first = loader_chunk<kElemBytes>(mn_major, tid, 0);
    smem_offset = tile_offset<kElemBytes>(mn_major, first.row, first.chunk);
#pragma unroll
    for (int i = 0; i < kChunksPerThread; ++i) {
      const LoaderChunk c = loader_chunk<kElemBytes>(mn_major, tid, i);
      const int64_t line_index = mn_major ? c.k : int64_t{mn0} + c.mn;
      const int64_t fast_index = mn_major ? int64_t{mn0} + c.mn : c.k;
      ptr[i] = base + line_index * line_stride + fast_index * fast_stride;
      line_left[i] = mn_major ? k_extent - c.k : mn_extent - mn0 - c.mn;
    }
    fast_left = mn_major ? mn_extent - mn0 - first.mn : k_extent - first.k;
  }

  // Elements of chunk i at the current k tile that lie inside the operand (leading ones).
  SAMATTN_HOST_DEVICE int valid(int i) const {
    if (line_left[i] <= 0 || fast_left <= 0) return 0;
    return fast_left < kChunkElems ? fast_left : kChunkElems;
  }

  // Moves on to the next k tile.
  SAMATTN_HOST_DEVICE void advance(const OperandArgs& op) {
#pragma unroll
    for (int i = 0; i < kChunksPerThread; ++i) {
      ptr[i] += kBlockK * op.k_stride;
      if (op.mn_major) line_left[i] -= kBlockK;
    }
    if (!op.mn_major) fast_left -= kBlockK;
  }
};

}  // namespace samattn::detail::sm80
