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

// One thread per float4 of the accumulator, read in its own order (a warp reads 512 contiguous
// bytes): its values 0, 1 are (row, columns col and col + 1) and 2, 3 the same columns of row
// + 8 (backward_dq_slot_position), each pair one 4-byte store (backward_supports() has checked
// dq's 16-byte alignment and strides).
template <typename Element, int kHeadDim>
__global__ void __launch_bounds__(kDqConvertThreads)
    backward_dq_convert_kernel(const __grid_constant__ detail::BackwardKernelParams p) {
  const detail::ForwardKernelParams& f = p.fwd;
  constexpr int kBlockM = backward_block_m(kHeadDim);
  constexpr int kSlotsPerChunk = kBlockM * kHeadDim / 4;
  const int64_t chunks_per_head = backward_dq_accum_rows(f.seqlen_q, kHeadDim) / kBlockM;
  const int64_t total = f.batch * f.heads_q * chunks_per_head * kSlotsPerChunk;
  const float scale = static_cast<float>(p.scale);
  const float4* accum = static_cast<const float4*>(p.dq_accum);
  Element* dq = static_cast<Element*>(p.dq);
  const int64_t step = static_cast<int64_t>(gridDim.x) * kDqConvertThreads;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * kDqConvertThreads + threadIdx.x; i < total;
       i += step) {
    const int64_t chunk = i / kSlotsPerChunk;  // (b * heads_q + h) * chunks_per_head + block
    const DqSlotPosition at =
        backward_dq_slot_position(kHeadDim, static_cast<int>(i % kSlotsPerChunk));
    const int row = at.row, col = at.col;
    const int64_t bh = chunk / chunks_per_head;
    const int64_t query = chunk % chunks_per_head * kBlockM + row;
    const float4 v = accum[i];
    Element* out = dq + bh / f.heads_q * p.dq_batch_stride + bh % f.heads_q * p.dq_head_stride +
                   query * p.dq_row_stride + col;
    if (query < f.seqlen_q) {
      *reinterpret_cast<uint32_t*>(out) = bwd::pack_pair<Element>(v.x * scale, v.y * scale);
    }
    if (query + 8 < f.seqlen_q) {
      *reinterpret_cast<uint32_t*>(out + 8 * p.dq_row_stride) =
          bwd::pack_pair<Element>(v.z * scale, v.w * scale);
    }
  }
}

template <typename Element, int kHeadDim>
void launch_backward_dq_convert(const detail::BackwardKernelParams& p, cudaStream_t stream) {
  const int64_t slots =
      p.fwd.batch * p.fwd.heads_q * backward_dq_accum_rows(p.fwd.seqlen_q, kHeadDim) * kHeadDim / 4;
  if (slots == 0) return;
  backward_dq_convert_kernel<Element, kHeadDim>
      <<<detail::grid_stride_blocks(slots, kDqConvertThreads), kDqConvertThreads, 0, stream>>>(p);
  SAMATTN_CHECK_LAUNCH();
}

}  // namespace samattn::hopper
