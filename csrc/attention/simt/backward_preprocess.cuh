// Internal: the backward's first step, D_i = dout_i . out_i for every query row, into the
// workspace, in the lse's row layout. One warp per row, lanes striding over the columns, a
// fixed-order warp reduction.
#pragma once

#include <cstdint>

#include "attention/backward_kernel_params.h"
#include "attention/simt/numeric.cuh"

namespace samattn::simt {

inline constexpr int kPreprocessThreads = 256;
inline constexpr int kPreprocessRowsPerBlock = kPreprocessThreads / 32;

// Query rows D is computed for: one per row of the lse.
__host__ __device__ inline int64_t preprocess_rows(const detail::ForwardKernelParams& f) {
  return f.cu_seqlens_q != nullptr ? f.heads_q * f.total_q : f.batch * f.heads_q * f.seqlen_q;
}

template <typename Element>
__global__ void __launch_bounds__(kPreprocessThreads)
    backward_preprocess_kernel(const detail::BackwardKernelParams p) {
  using Acc = typename AccumulatorOf<Element>::type;
  const detail::ForwardKernelParams& f = p.fwd;
  const int64_t row = static_cast<int64_t>(blockIdx.x) * kPreprocessRowsPerBlock + threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  // Rows in the lse's layout: (batch, heads_q, seqlen_q), or varlen (heads_q, total_q) with the
  // packed tensors' batch strides 0.
  const int64_t rows_per_head = f.cu_seqlens_q != nullptr ? f.total_q : f.seqlen_q;
  if (row >= preprocess_rows(f)) return;
  const int64_t query = row % rows_per_head;
  const int64_t bh = row / rows_per_head;
  const int64_t b = bh / f.heads_q;
  const int64_t h = bh % f.heads_q;
  const Element* out = static_cast<const Element*>(f.out) + b * f.o_batch_stride +
                       h * f.o_head_stride + query * f.o_row_stride;
  const Element* dout = static_cast<const Element*>(p.dout) + b * p.do_batch_stride +
                        h * p.do_head_stride + query * p.do_row_stride;
  Acc sum = 0;
  for (int col = lane; col < f.head_dim_v; col += 32) sum += widen(dout[col]) * widen(out[col]);
#pragma unroll
  for (int offset = 16; offset > 0; offset /= 2) sum += __shfl_xor_sync(0xffffffffu, sum, offset);
  if (lane == 0) static_cast<Acc*>(p.delta)[row] = sum;
}

}  // namespace samattn::simt
