// Internal: dq = scale * the Hopper backward's fp32 dQ accumulator, rounded to the element type.
// The accumulator is in backward_config.h's chunk layout (fragment order, rows padded to whole
// blocks of backward_block_m); dq has arbitrary row, head and batch strides.
#pragma once

#include <cstdint>

#include <cuda_runtime.h>

#include "attention/backward_kernel_params.h"
#include "attention/hopper/backward_config.h"
#include "common/cuda_check.h"
#include "common/device.h"

namespace samattn::hopper {

inline constexpr int kDqConvertThreads = 256;

// One thread per (row, column pair): the pair is adjacent in the chunk too (the column's lowest
// bit is the value's lowest bit), so it is one 8-byte load.
template <typename Element, int kHeadDim>
__global__ void __launch_bounds__(kDqConvertThreads)
    backward_dq_convert_kernel(const __grid_constant__ detail::BackwardKernelParams p) {
  const detail::ForwardKernelParams& f = p.fwd;
  constexpr int kBlockM = backward_block_m(kHeadDim);
  constexpr int kPairs = kHeadDim / 2;
  const int64_t rows_per_head = backward_dq_accum_rows(f.seqlen_q, kHeadDim);
  const int64_t total = f.batch * f.heads_q * f.seqlen_q * kPairs;
  const float scale = static_cast<float>(p.scale);
  const float* accum = static_cast<const float*>(p.dq_accum);
  Element* dq = static_cast<Element*>(p.dq);
  const int64_t step = static_cast<int64_t>(gridDim.x) * kDqConvertThreads;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * kDqConvertThreads + threadIdx.x; i < total;
       i += step) {
    const int col = static_cast<int>(i % kPairs) * 2;
    const int64_t row = i / kPairs;  // (b * heads_q + h) * seqlen_q + query
    const int64_t query = row % f.seqlen_q;
    const int64_t bh = row / f.seqlen_q;
    const int64_t block_begin = query / kBlockM * kBlockM;
    const float2 pair = *reinterpret_cast<const float2*>(
        accum + (bh * rows_per_head + block_begin) * kHeadDim +
        backward_dq_chunk_offset(kHeadDim, static_cast<int>(query - block_begin), col));
    Element* out = dq + bh / f.heads_q * p.dq_batch_stride + bh % f.heads_q * p.dq_head_stride +
                   query * p.dq_row_stride + col;
    out[0] = Element(pair.x * scale);
    out[1] = Element(pair.y * scale);
  }
}

template <typename Element, int kHeadDim>
void launch_backward_dq_convert(const detail::BackwardKernelParams& p, cudaStream_t stream) {
  const int64_t pairs = p.fwd.batch * p.fwd.heads_q * p.fwd.seqlen_q * (kHeadDim / 2);
  if (pairs == 0) return;
  backward_dq_convert_kernel<Element, kHeadDim>
      <<<detail::grid_stride_blocks(pairs, kDqConvertThreads), kDqConvertThreads, 0, stream>>>(p);
  SAMATTN_CHECK_LAUNCH();
}

}  // namespace samattn::hopper
