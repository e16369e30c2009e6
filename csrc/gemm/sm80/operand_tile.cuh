// Internal: one GEMM operand (A or B) on its way through shared memory in the sm80 kernel: the
// cp.async loader and the fragment reads of the layout described in tile_layout.h.
#pragma once

#include <cstdint>
#include <type_traits>

#include "attention/tensor_core/mma.cuh"
#include "gemm/sm80/gemm_sm80.h"
#include "gemm/sm80/operand_walk.h"
#include "gemm/sm80/tile_layout.h"

namespace samattn::detail::sm80 {

using tensor_core::shared_address;

// 16 bytes global -> shared: all 16 read (src_bytes 16) or none, zero-filled (src_bytes 0);
// operand_walk.h says why nothing in between.
__device__ __forceinline__ void cp_async_zfill(uint32_t dst, const void* src, int src_bytes) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src),
               "r"(src_bytes));
}

// A thread's share of one operand's loads: the two chunks of loader_chunk, the second exactly
// kTileBytes / 2 after the first in shared memory; operand_walk.h says which elements each
// chunk reads and by which copy.
template <typename Element>
struct OperandLoader {
  // 16-bit raw element (loads never convert).
  using Bits = std::conditional_t<sizeof(Element) == 2, uint16_t, uint32_t>;
  using Walk = OperandWalk<Bits>;
  Walk walk;

  __device__ __forceinline__ void init(const OperandArgs& op, int64_t batch, int mn0, int mn_extent,
                                       int k_extent, int tid) {
    walk.init(op, batch, mn0, mn_extent, k_extent, tid);
  }

  // Issues this thread's copies of the current k tile into `tile` (shared address), then
  // moves on to the next k tile. Elements outside the operand are zero-filled.
  __device__ __forceinline__ void load(const OperandArgs& op, uint32_t tile) {
    const int64_t fast_stride = op.mn_major ? op.mn_stride : op.k_stride;
#pragma unroll
    for (int i = 0; i < kChunksPerThread; ++i) {
      const int valid = walk.valid(i);
      const uint32_t dst = tile + walk.smem_offset + i * (kTileBytes / kChunksPerThread);
      const ChunkCopy copy = chunk_copy(op.async, valid, Walk::kChunkElems);
      if (copy != ChunkCopy::kElements) {
        const bool full = copy == ChunkCopy::kFullAsync;
        cp_async_zfill(dst, full ? walk.ptr[i] : op.ptr, full ? kChunkBytes : 0);
      } else {
        alignas(16) Bits v[Walk::kChunkElems];
#pragma unroll
        for (int e = 0; e < Walk::kChunkElems; ++e) {
          v[e] = e < valid ? walk.ptr[i][e * fast_stride] : Bits(0);
        }
        const uint4 packed = *reinterpret_cast<const uint4*>(v);
        asm volatile("st.shared.v4.b32 [%0], {%1, %2, %3, %4};\n" ::"r"(dst), "r"(packed.x),
                     "r"(packed.y), "r"(packed.z), "r"(packed.w));
      }
    }
    walk.advance(op);
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
