// Internal: dq = scale * the Hopper backward's fp32 dQ accumulator, rounded to the element type
// (nearest).
// The accumulator is in backward_config.h's chunk layout (fragment order, rows padded to whole
// blocks of backward_block_m); dq has arbitrary row, head and batch strides.
#pragma once

#include <cstdint>

#include <cuda_runtime.h>

#include "attention/backward_kernel_params.h"
#include "attention/hopper/backward_config.h"
#include "attention/hopper/backward_wgmma.cuh"
#include "common/cuda_check.h"
#include "common/device.h"

namespace samattn::hopper {

inline constexpr int kDqConvertThreads = 256;

// Consecutive float4 slots 4u..4u+3 of the accumulator hold 8 consecutive columns of two rows
// (backward_dq_slot_position: the slots' lanes 4k..4k+3 cover columns 8j..8j+7 of rows r and
// r + 8): one thread per quad reads 64 contiguous bytes and writes 16 bytes to each row, and the
// quads of columns 8j and 8j + 8 lie 8 threads apart in a warp, so its stores fill whole
// sectors (backward_supports() has checked dq's 16-byte alignment and strides).
inline constexpr int kDqConvertSlotsPerThread = 4;

template <typename Element, int kHeadDim>
__global__ void __launch_bounds__(kDqConvertThreads)
    backward_dq_convert_kernel(const __grid_constant__ detail::BackwardKernelParams p) {
  const detail::ForwardKernelParams& f = p.fwd;
  constexpr int kBlockM = backward_block_m(kHeadDim);
  constexpr int kQuadsPerChunk = kBlockM * kHeadDim / 4 / kDqConvertSlotsPerThread;
  const int64_t chunks_per_head = backward_dq_accum_rows(f.seqlen_q, kHeadDim) / kBlockM;
  const int64_t total = f.batch * f.heads_q * chunks_per_head * kQuadsPerChunk;
  const float scale = static_cast<float>(p.scale);
  const float4* accum = static_cast<const float4*>(p.dq_accum);
  Element* dq = static_cast<Element*>(p.dq);
  const int64_t step = static_cast<int64_t>(gridDim.x) * kDqConvertThreads;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * kDqConvertThreads + threadIdx.x; i < total;
       i += step) {
    const int64_t chunk = i / kQuadsPerChunk;  // (b * heads_q + h) * chunks_per_head + block
    const DqSlotPosition at = backward_dq_slot_position(
        kHeadDim, static_cast<int>(i % kQuadsPerChunk) * kDqConvertSlotsPerThread);
    const int64_t bh = chunk / chunks_per_head;
    const int64_t query = chunk % chunks_per_head * kBlockM + at.row;
    uint32_t upper[kDqConvertSlotsPerThread], lower[kDqConvertSlotsPerThread];
#pragma unroll
    for (int e = 0; e < kDqConvertSlotsPerThread; ++e) {
      const float4 v = accum[i * kDqConvertSlotsPerThread + e];
      upper[e] = bwd::pack_pair<Element>(v.x * scale, v.y * scale);  // row, columns col + 2e
      lower[e] = bwd::pack_pair<Element>(v.z * scale, v.w * scale);  // row + 8
    }
    Element* out = dq + bh / f.heads_q * p.dq_batch_stride + bh % f.heads_q * p.dq_head_stride +
                   query * p.dq_row_stride + at.col;
    if (query < f.seqlen_q) {
      *reinterpret_cast<uint4*>(out) = make_uint4(upper[0], upper[1], upper[2], upper[3]);
    }
    if (query + 8 < f.seqlen_q) {
      *reinterpret_cast<uint4*>(out + 8 * p.dq_row_stride) =
          make_uint4(lower[0], lower[1], lower[2], lower[3]);
    }
  }
}

template <typename Element, int kHeadDim>
void launch_backward_dq_convert(const detail::BackwardKernelParams& p, cudaStream_t stream) {
  const int64_t quads = p.fwd.batch * p.fwd.heads_q *
                        backward_dq_accum_rows(p.fwd.seqlen_q, kHeadDim) * kHeadDim / 4 /
                        kDqConvertSlotsPerThread;
  if (quads == 0) return;
  backward_dq_convert_kernel<Element, kHeadDim>
      <<<detail::grid_stride_blocks(quads, kDqConvertThreads), kDqConvertThreads, 0, stream>>>(p);
  SAMATTN_CHECK_LAUNCH();
}

}  // namespace samattn::hopper
