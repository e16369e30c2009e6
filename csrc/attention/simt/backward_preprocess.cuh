// Internal: the backward's first step, D_i = dout_i . out_i for every query row, into the
// workspace, in the lse's row layout. The general kernel: one warp per row, lanes striding over
// the columns; the vector kernel (rows of whole, aligned 16-byte chunks): kLanesPerRow lanes per
// row, one 16-byte load of each tensor per lane and step (16-bit elements). Both end in a
// fixed-order butterfly reduction, so reruns are bit-identical.
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

// Row `row` of out and dout. Rows are in the lse's layout: (batch, heads_q, seqlen_q), or varlen
// (heads_q, total_q) with the packed tensors' batch strides 0.
template <typename Element>
struct PreprocessRow {
  const Element* out;
  const Element* dout;
};
template <typename Element>
__device__ __forceinline__ PreprocessRow<Element> preprocess_row(
    const detail::BackwardKernelParams& p, int64_t row) {
  const detail::ForwardKernelParams& f = p.fwd;
  const int64_t rows_per_head = f.cu_seqlens_q != nullptr ? f.total_q : f.seqlen_q;
  const int64_t query = row % rows_per_head;
  const int64_t bh = row / rows_per_head;
  const int64_t b = bh / f.heads_q;
  const int64_t h = bh % f.heads_q;
  return {static_cast<const Element*>(f.out) + b * f.o_batch_stride + h * f.o_head_stride +
              query * f.o_row_stride,
          static_cast<const Element*>(p.dout) + b * p.do_batch_stride + h * p.do_head_stride +
              query * p.do_row_stride};
}

template <typename Element>
__global__ void __launch_bounds__(kPreprocessThreads)
    backward_preprocess_kernel(const detail::BackwardKernelParams p) {
  using Acc = typename AccumulatorOf<Element>::type;
  const detail::ForwardKernelParams& f = p.fwd;
  const int64_t row = static_cast<int64_t>(blockIdx.x) * kPreprocessRowsPerBlock + threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  if (row >= preprocess_rows(f)) return;
  const auto [out, dout] = preprocess_row<Element>(p, row);
  Acc sum = 0;
  for (int col = lane; col < f.head_dim_v; col += 32) sum += widen(dout[col]) * widen(out[col]);
#pragma unroll
  for (int offset = 16; offset > 0; offset /= 2) sum += __shfl_xor_sync(0xffffffffu, sum, offset);
  if (lane == 0) static_cast<Acc*>(p.delta)[row] = sum;
}

inline constexpr int kPreprocessVectorBytes = 16;

template <typename Element, int kLanesPerRow>
__global__ void __launch_bounds__(kPreprocessThreads)
    backward_preprocess_vector_kernel(const detail::BackwardKernelParams p) {
  using Acc = typename AccumulatorOf<Element>::type;
  constexpr int kVec = kPreprocessVectorBytes / sizeof(Element);
  constexpr int kRowsPerWarp = 32 / kLanesPerRow;
  const detail::ForwardKernelParams& f = p.fwd;
  const int lane = threadIdx.x % 32;
  const int part = lane % kLanesPerRow;
  const int64_t warp =
      static_cast<int64_t>(blockIdx.x) * kPreprocessRowsPerBlock + threadIdx.x / 32;
  const int64_t row = warp * kRowsPerWarp + lane / kLanesPerRow;
  // No early return: every lane takes part in the shuffles below.
  const bool real = row < preprocess_rows(f);
  Acc sum = 0;
  if (real) {
    const auto [out, dout] = preprocess_row<Element>(p, row);
    for (int col = part * kVec; col < f.head_dim_v; col += kLanesPerRow * kVec) {
      const uint4 o_raw = *reinterpret_cast<const uint4*>(out + col);
      const uint4 do_raw = *reinterpret_cast<const uint4*>(dout + col);
      const Element* o = reinterpret_cast<const Element*>(&o_raw);
      const Element* d = reinterpret_cast<const Element*>(&do_raw);
#pragma unroll
      for (int e = 0; e < kVec; ++e) sum += widen(d[e]) * widen(o[e]);
    }
  }
#pragma unroll
  for (int offset = kLanesPerRow / 2; offset > 0; offset /= 2) {
    sum += __shfl_xor_sync(0xffffffffu, sum, offset);
  }
  if (real && part == 0) static_cast<Acc*>(p.delta)[row] = sum;
}

}  // namespace samattn::simt
