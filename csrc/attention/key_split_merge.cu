// The merge of a split-key call's chunks (key_split.h): one thread block per query row reads the
// row's fp32 chunk outputs and lse from the workspace and writes the rounded output and lse.
#include <cstdint>

#include "attention/key_split.h"
#include "attention/simt/numeric.cuh"
#include "common/check.h"
#include "common/cuda_check.h"
#include "common/device.h"
#include "common/element_of.cuh"

namespace samattn::detail {
namespace {

// Head dims are at most kMaxHeadDim (256): two columns per thread at most.
constexpr int kMergeThreads = 128;

struct MergeParams {
  const float* parts_out;  // (parts, rows, dim_v)
  const float* parts_lse;  // (parts, rows)
  int64_t parts, rows, dim_v;
  int64_t heads_q, seqlen_q;
  void* out;
  int64_t out_batch_stride, out_head_stride, out_row_stride;
  float* lse;  // (rows), or null
};

// One block per row (grid-stride). Warp 0 reads the row's chunk lse (at most kMaxChunks, 4 a
// lane), reduces them with shuffles and leaves each chunk's slot (chunk_slot) in shared memory;
// then every thread sums its columns over the chunks, whose loads are independent and unrolled so
// that several are in flight (the chunks' outputs come from L2: a serial chain of them would set
// the merge's time).
template <typename Element>
__global__ void __launch_bounds__(kMergeThreads) merge_key_split_kernel(const MergeParams m) {
  constexpr int kPerLane = static_cast<int>(kMaxChunks) / 32;
  static_assert(kMaxChunks % 32 == 0, "warp 0 holds the chunks' lse, kPerLane a lane");
  __shared__ float slots[kMaxChunks];
  __shared__ float row_lse;
  const int lane = static_cast<int>(threadIdx.x) % 32;
  for (int64_t row = blockIdx.x; row < m.rows; row += gridDim.x) {
    if (threadIdx.x < 32) {
      float lse[kPerLane];
      float largest = -INFINITY;
#pragma unroll
      for (int i = 0; i < kPerLane; ++i) {
        const int64_t c = lane + 32 * i;
        lse[i] = c < m.parts ? m.parts_lse[c * m.rows + row] : -INFINITY;
        largest = merge_max(largest, lse[i]);
      }
#pragma unroll
      for (int offset = 16; offset > 0; offset /= 2) {
        largest = merge_max(largest, __shfl_xor_sync(0xffffffffu, largest, offset));
      }
      float sum = 0.f;
#pragma unroll
      for (int i = 0; i < kPerLane; ++i) sum += chunk_term(lse[i], largest);
#pragma unroll
      for (int offset = 16; offset > 0; offset /= 2) {
        sum += __shfl_xor_sync(0xffffffffu, sum, offset);
      }
      const float merged = merged_from(largest, sum);
#pragma unroll
      for (int i = 0; i < kPerLane; ++i) {
        const int64_t c = lane + 32 * i;
        if (c < m.parts) slots[c] = chunk_slot(lse[i], merged);
      }
      if (lane == 0) row_lse = merged;
    }
    __syncthreads();
    const float merged = row_lse;
    const int64_t i = row % m.seqlen_q;
    const int64_t head = row / m.seqlen_q % m.heads_q;
    const int64_t batch = row / m.seqlen_q / m.heads_q;
    Element* out = static_cast<Element*>(m.out) + batch * m.out_batch_stride +
                   head * m.out_head_stride + i * m.out_row_stride;
    const float* parts_out = m.parts_out + row * m.dim_v;
    const int64_t chunk_stride = m.rows * m.dim_v;
    for (int64_t d = threadIdx.x; d < m.dim_v; d += kMergeThreads) {
      float value = 0.f;
#pragma unroll 8
      for (int64_t c = 0; c < m.parts; ++c) {
        // Loaded whatever the slot, so the loads need not wait for it.
        value += chunk_share(slots[c], parts_out[c * chunk_stride + d]);
      }
      out[d] = simt::narrow<Element>(merged != merged ? NAN : value);
    }
    if (threadIdx.x == 0 && m.lse != nullptr) m.lse[row] = merged;
    __syncthreads();  // the slots are rewritten for the next row
  }
}

template <typename Element>
void launch_merge(const MergeParams& m, cudaStream_t stream) {
  merge_key_split_kernel<Element>
      <<<grid_stride_blocks(m.rows * kMergeThreads, kMergeThreads), kMergeThreads, 0, stream>>>(m);
  SAMATTN_CHECK_LAUNCH();
}

}  // namespace

void merge_key_split(const AttentionParams& p, const KeySplit& split, const PriorPart& workspace,
                     cudaStream_t stream) {
  const MergeParams m{
      workspace.out,       workspace.lse,      split.parts(),     p.batch * p.heads_q * p.seqlen_q,
      p.head_dim_v,        p.heads_q,          p.seqlen_q,        p.out,
      p.out_strides.batch, p.out_strides.head, p.out_strides.seq, static_cast<float*>(p.lse)};
  if (m.rows == 0) return;
  switch (p.dtype) {
    case DType::kFloat16:
      return launch_merge<ElementOf<DType::kFloat16>::type>(m, stream);
    case DType::kBFloat16:
      return launch_merge<ElementOf<DType::kBFloat16>::type>(m, stream);
    default:
      break;
  }
  SAMATTN_CHECK(false, "the split-key forward takes float16 and bfloat16, got ",
                dtype_name(p.dtype));
}

}  // namespace samattn::detail
