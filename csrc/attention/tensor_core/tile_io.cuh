// Internal: global <-> shared tile movement of the tensor-core forward, in 16-byte vectors.
#pragma once

#include <cstdint>

#include "attention/tensor_core/mma.cuh"

namespace samattn::tensor_core {

// Starts cp.async copies of rows [0, valid_rows) of a (kRows, kHeadDim) row-major global tile
// into tile[row * kRowStride + col]; rows past valid_rows are zero-filled, so masked keys
// multiply finite zeros in P.V and padded query rows stay finite.
//
// A thread always copies the same 16-byte column chunk of rows row0, row0 + kRowStep, ...:
// consecutive threads take consecutive chunks of a row (coalesced), shared-memory offsets are
// compile-time immediates, and the global address advances by one 64-bit add per chunk. The
// empty asm hides that add's pattern from the compiler, which would otherwise precompute every
// chunk's 64-bit offset once per kernel and hold them all in registers across the main loop.
template <int kRows, int kHeadDim, int kRowStride, int kThreads, typename Element>
__device__ __forceinline__ void load_tile_async(Element* tile, const Element* src,
                                                int64_t row_stride, int valid_rows) {
  constexpr int kChunkElems = 16 / int(sizeof(Element));
  constexpr int kChunksPerRow = kHeadDim / kChunkElems;
  constexpr int kRowStep = kThreads / kChunksPerRow;  // rows covered by one pass of the threads
  constexpr int kPasses = (kRows + kRowStep - 1) / kRowStep;
  static_assert(kRowStep >= 1, "a row has more chunks than the block has threads");
  const int thread = static_cast<int>(threadIdx.x);
  if (kThreads % kChunksPerRow != 0 && thread >= kRowStep * kChunksPerRow) return;
  const int row0 = thread / kChunksPerRow;
  const int col = thread % kChunksPerRow * kChunkElems;
  const uint32_t dst = shared_address(tile + row0 * kRowStride + col);
  const int64_t step = kRowStep * row_stride;
  const Element* from = src + row0 * row_stride + col;
#pragma unroll
  for (int i = 0; i < kPasses; ++i) {
    const int row = row0 + i * kRowStep;
    if (kRows % kRowStep == 0 || row < kRows) {
      const bool valid = row < valid_rows;
      cp_async_16(dst + i * kRowStep * kRowStride * int(sizeof(Element)), valid ? from : src,
                  valid);
    }
    from += step;
    asm("" : "+l"(from));
  }
}

// Copies rows [0, valid_rows) of a warp's (kWarpRows, kHeadDim) staged output tile to global
// memory, one 16-byte vector per lane and step.
template <int kWarpRows, int kHeadDim, int kRowStride, typename Element>
__device__ __forceinline__ void store_warp_rows(Element* dst, int64_t row_stride,
                                                const Element* staged, int valid_rows, int lane) {
  constexpr int kChunkElems = 16 / int(sizeof(Element));
  constexpr int kChunksPerRow = kHeadDim / kChunkElems;
  static_assert(kWarpRows * kChunksPerRow % 32 == 0, "each lane stores as many vectors");
#pragma unroll
  for (int i = 0; i < kWarpRows * kChunksPerRow / 32; ++i) {
    const int chunk = lane + 32 * i;
    const int row = chunk / kChunksPerRow;
    const int col = chunk % kChunksPerRow * kChunkElems;
    if (row < valid_rows) {
      *reinterpret_cast<uint4*>(dst + row * row_stride + col) =
          *reinterpret_cast<const uint4*>(staged + row * kRowStride + col);
    }
  }
}

// Writes two adjacent output elements, rounded to the element type.
__device__ __forceinline__ void store_pair(float* dst, float a, float b) {
  *reinterpret_cast<float2*>(dst) = make_float2(a, b);
}

template <typename Element>
__device__ __forceinline__ void store_pair(Element* dst, float a, float b) {
  *reinterpret_cast<uint32_t*>(dst) = pack<Element>(a, b);
}

}  // namespace samattn::tensor_core
