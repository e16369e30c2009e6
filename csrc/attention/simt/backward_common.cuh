// Internal: the pieces both SIMT backward kernels share: the two block products they are built
// from, and the probabilities recomputed from the forward's log-sum-exp.
#pragma once

#include <cstdint>

#include "attention/backward_kernel_params.h"
#include "attention/mask_policy.cuh"
#include "attention/simt/numeric.cuh"
#include "attention/simt/tile_io.cuh"

namespace samattn::simt {

// acc[i][j] += sum_d A[a0 + i][d] * B[b0 + j][d] over d < dims, for row-major global tiles A
// (a_rows valid of kRowsA) and B (b_rows valid of kRowsB): both stream through shared memory
// kChunk columns at a time, transposed so each thread reads its rows as one vector. Begins
// with a barrier, so callers may overwrite any shared tile read before the call.
template <int kRowsA, int kStrideA, int kRowsB, int kStrideB, int kChunk, int kThreads,
          typename Element, typename Acc, int kTA, int kTB>
__device__ __forceinline__ void chunked_dot(Acc (&acc)[kTA][kTB], Acc* a_tile, Acc* b_tile,
                                            const Element* a, int64_t a_row_stride, int a_rows,
                                            const Element* b, int64_t b_row_stride, int b_rows,
                                            int dims, int a0, int b0) {
#pragma unroll 1
  for (int dim_begin = 0; dim_begin < dims; dim_begin += kChunk) {
    __syncthreads();  // the previous readers of both tiles are done
    load_transposed<kRowsA, kChunk, kStrideA, kThreads>(a_tile, a, a_row_stride, a_rows, dim_begin,
                                                        dims);
    load_transposed<kRowsB, kChunk, kStrideB, kThreads>(b_tile, b, b_row_stride, b_rows, dim_begin,
                                                        dims);
    __syncthreads();
#pragma unroll
    for (int d = 0; d < kChunk; ++d) {
      Acc a_frag[kTA];
      Acc b_frag[kTB];
      load_vector(a_frag, a_tile + d * kStrideA + a0);
      load_vector(b_frag, b_tile + d * kStrideB + b0);
#pragma unroll
      for (int i = 0; i < kTA; ++i)
#pragma unroll
        for (int j = 0; j < kTB; ++j) acc[i][j] += a_frag[i] * b_frag[j];
    }
  }
}

// acc[i][c] += sum_r W[r][w0 + i] * X[r][c0 + c] over the rows r < rows of a block: W is a
// shared tile (rows kStrideW apart), X a row-major global tile staged kStaged rows at a time
// (zero-filled past `rows` and past `cols`). Begins with a barrier, so W may have just been
// written.
template <int kStaged, int kBucket, int kStrideW, int kThreads, typename Element, typename Acc,
          int kTW, int kTO>
__device__ __forceinline__ void accumulate_rows(Acc (&acc)[kTW][kTO], const Acc* w_tile, int w0,
                                                Acc* staged, const Element* x, int64_t x_row_stride,
                                                int rows, int cols, int c0) {
#pragma unroll 1
  for (int row_begin = 0; row_begin < rows; row_begin += kStaged) {
    __syncthreads();  // W is complete; the previous readers of `staged` are done
    load_rows<kStaged, kBucket, kThreads>(staged, x + row_begin * x_row_stride, x_row_stride,
                                          rows - row_begin, cols);
    __syncthreads();
#pragma unroll 8
    for (int r = 0; r < kStaged; ++r) {
      Acc w_frag[kTW];
      Acc x_frag[kTO];
      load_vector(w_frag, w_tile + (row_begin + r) * kStrideW + w0);
      load_vector(x_frag, staged + r * kBucket + c0);
#pragma unroll
      for (int i = 0; i < kTW; ++i)
#pragma unroll
        for (int c = 0; c < kTO; ++c) acc[i][c] += w_frag[i] * x_frag[c];
    }
  }
}

// What a query row contributes to the backward: its log-sum-exp in the log2 domain and D.
// Rows past seqlen_q and rows that saw no key (lse -inf) get lse2 = +inf, so every probability
// recomputed for them is exactly 0 and they add nothing.
template <typename Acc>
struct QueryRowStats {
  Acc lse2;
  Acc delta;
};

template <typename Acc>
__device__ __forceinline__ QueryRowStats<Acc> load_row_stats(const detail::BackwardKernelParams& p,
                                                             int64_t b, int64_t h, int64_t query) {
  constexpr double kLog2e = 1.4426950408889634;
  const Acc inf = -negative_infinity<Acc>();
  if (query >= p.fwd.seqlen_q) return {inf, Acc(0)};
  // delta is contiguous (B, Hq, Sq); lse has the forward's strides.
  const int64_t row = (b * p.fwd.heads_q + h) * p.fwd.seqlen_q + query;
  const Acc lse =
      static_cast<const Acc*>(p.fwd.lse)[b * p.fwd.lse_batch_stride + h * p.fwd.lse_head_stride + query];
  const Acc delta = static_cast<const Acc*>(p.delta)[row];
  return {lse == negative_infinity<Acc>() ? inf : lse * static_cast<Acc>(kLog2e), delta};
}

// The probability and dS of one (query, key) pair from its scaled score (log2 domain, -inf when
// hidden) and dout . v.
template <typename Acc>
__device__ __forceinline__ void probability_and_ds(Acc& score_to_p, Acc& dp_to_ds,
                                                   const QueryRowStats<Acc>& row) {
  score_to_p = exp2_acc(score_to_p - row.lse2);
  dp_to_ds = score_to_p * (dp_to_ds - row.delta);
}

}  // namespace samattn::simt
