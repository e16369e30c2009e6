// Internal: global -> shared tile copies of the SIMT kernels (zero-filled past the valid region,
// so compute loops can run over whole tiles).
#pragma once

#include <cstdint>

#include "attention/simt/numeric.cuh"

namespace samattn::simt {

// Copies rows [0, rows) x columns [col_begin, col_begin + kCols) of a row-major global tile,
// times `scale`, into tile[column][row] (transposed, so compute loops read consecutive rows as
// one vector).
template <int kRows, int kCols, int kStride, int kThreads, typename Element, typename Acc>
__device__ __forceinline__ void load_transposed(Acc* tile, const Element* src, int64_t row_stride,
                                                int rows, int col_begin, int cols,
                                                Acc scale = Acc(1)) {
#pragma unroll
  for (int e = threadIdx.x; e < kRows * kCols; e += kThreads) {
    const int row = e / kCols;
    const int col = e % kCols;
    Acc value = 0;
    if (row < rows && col_begin + col < cols) {
      value = widen(src[row * row_stride + col_begin + col]) * scale;
    }
    tile[col * kStride + row] = value;
  }
}

// Copies rows [0, rows) x columns [0, kCols) of a row-major global tile into tile[row][col].
template <int kRows, int kCols, int kThreads, typename Element, typename Acc>
__device__ __forceinline__ void load_rows(Acc* tile, const Element* src, int64_t row_stride,
                                          int rows, int cols) {
#pragma unroll 4
  for (int e = threadIdx.x; e < kRows * kCols; e += kThreads) {
    const int row = e / kCols;
    const int col = e % kCols;
    Acc value = 0;
    if (row < rows && col < cols) value = widen(src[row * row_stride + col]);
    tile[row * kCols + col] = value;
  }
}

// A kRows x kCols global tile held in registers between its load and its store to shared
// memory, so the next tile's global loads overlap the current tile's arithmetic.
template <int kRows, int kCols, int kThreads, typename Acc>
struct PrefetchedTile {
  static_assert((kRows * kCols) % kThreads == 0, "tile must split evenly over the threads");
  static constexpr int kPerThread = kRows * kCols / kThreads;
  Acc values[kPerThread];

  template <typename Element>
  __device__ __forceinline__ void load(const Element* src, int64_t row_stride, int rows, int cols) {
#pragma unroll
    for (int i = 0; i < kPerThread; ++i) {
      const int e = threadIdx.x + i * kThreads;
      const int row = e / kCols;
      const int col = e % kCols;
      values[i] = (row < rows && col < cols) ? widen(src[row * row_stride + col]) : Acc(0);
    }
  }

  // tile[row][col] with rows kStride apart.
  template <int kStride>
  __device__ __forceinline__ void store_rows(Acc* tile) const {
#pragma unroll
    for (int i = 0; i < kPerThread; ++i) {
      const int e = threadIdx.x + i * kThreads;
      tile[(e / kCols) * kStride + e % kCols] = values[i];
    }
  }

  // tile[col][row] with columns kStride apart (transposed).
  template <int kStride>
  __device__ __forceinline__ void store_transposed(Acc* tile) const {
#pragma unroll
    for (int i = 0; i < kPerThread; ++i) {
      const int e = threadIdx.x + i * kThreads;
      tile[(e % kCols) * kStride + e / kCols] = values[i];
    }
  }
};

}  // namespace samattn::simt
