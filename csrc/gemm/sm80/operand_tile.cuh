// Internal: one GEMM operand (A or B) on its way through shared memory in the sm80 kernel: the
// cp.async loader and the fragment reads of the layout described in tile_layout.h.
#pragma once

#include <cstdint>
#include <type_traits>

#include "attention/tensor_core/mma.cuh"
#include "gemm/sm80/gemm_sm80.h"
#include "gemm/sm80/tile_layout.h"

namespace samattn::detail::sm80 {

using tensor_core::shared_address;

// 16 bytes global -> shared, of which the first `src_bytes` are read and the rest zero-filled.
__device__ __forceinline__ void cp_async_zfill(uint32_t dst, const void* src, int src_bytes) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src),
               "r"(src_bytes));
}

// A thread's share of one operand's loads: the two chunks of loader_chunk, the second exactly
// kTileBytes / 2 after the first in shared memory.
template <typename Element>
struct OperandLoader {
  static constexpr int kElemBytes = static_cast<int>(sizeof(Element));
  static constexpr int kChunkElems = kChunkBytes / kElemBytes;
  static constexpr int kBlockK = kKBytes / kElemBytes;
  // 16-bit raw element (loads never convert).
  using Bits = std::conditional_t<kElemBytes == 2, uint16_t, uint32_t>;

  const Bits* ptr[kChunksPerThread];  // the chunk's first element at the current k tile
  int line_left[kChunksPerThread];    // lines (mn for k-major, k for mn-major) left, from this one
  int fast_left;                      // elements left along the fast dimension, from this one
  int smem_offset;                    // chunk 0's byte offset in the tile

  // Sets up the loads of the mn block starting at mn0 (rows mn0.. of A or columns of B), of
  // an operand with mn_extent x k_extent elements. Strides and flags stay in `op` (kernel
  // parameters, read from the constant bank), so the loader holds eight registers of state.
  __device__ __forceinline__ void init(const OperandArgs& op, int64_t batch, int mn0, int mn_extent,
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

  // Issues this thread's copies of the current k tile into `tile` (shared address), then
  // moves on to the next k tile. Elements outside the operand are zero-filled.
  __device__ __forceinline__ void load(const OperandArgs& op, uint32_t tile) {
    const int64_t fast_stride = op.mn_major ? op.mn_stride : op.k_stride;
#pragma unroll
    for (int i = 0; i < kChunksPerThread; ++i) {
      const int valid = line_left[i] > 0 ? min(max(fast_left, 0), kChunkElems) : 0;
      const uint32_t dst = tile + smem_offset + i * (kTileBytes / kChunksPerThread);
      if (op.async) {
        cp_async_zfill(dst, valid > 0 ? ptr[i] : op.ptr, valid * kElemBytes);
      } else {
        alignas(16) Bits v[kChunkElems];
#pragma unroll
        for (int e = 0; e < kChunkElems; ++e) v[e] = e < valid ? ptr[i][e * fast_stride] : Bits(0);
        const uint4 packed = *reinterpret_cast<const uint4*>(v);
        asm volatile("st.shared.v4.b32 [%0], {%1, %2, %3, %4};\n" ::"r"(dst), "r"(packed.x),
                     "r"(packed.y), "r"(packed.z), "r"(packed.w));
      }
      ptr[i] += kBlockK * op.k_stride;
      if (op.mn_major) line_left[i] -= kBlockK;
    }
    if (!op.mn_major) fast_left -= kBlockK;
  }
};

// The four registers of a 16-mn x one-mma-k-step block (tile_layout.h gives their order).
// `stage` is the stage's shared address, `offset` the block's byte offset in it.
template <int kElemBytes>
__device__ __forceinline__ void load_fragment(uint32_t (&r)[4], uint32_t stage, uint32_t offset,
                                              bool mn_major) {
  const uint32_t address = stage + offset;
  if (kElemBytes == 4 && mn_major) {
#pragma unroll
    for (int q = 0; q < 4; ++q) {
      asm volatile("ld.shared.b32 %0, [%1];\n"
                   : "=r"(r[q])
                   : "r"(stage + tf32_register_offset(offset, q)));
    }
  } else if (mn_major) {
    tensor_core::ldmatrix_x4_trans(r, address);
  } else {
    tensor_core::ldmatrix_x4(r, address);
  }
}

}  // namespace samattn::detail::sm80
