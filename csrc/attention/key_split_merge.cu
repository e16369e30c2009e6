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

template <typename Element>
__global__ void __launch_bounds__(kMergeThreads) merge_key_split_kernel(const MergeParams m) {
  for (int64_t row = blockIdx.x; row < m.rows; row += gridDim.x) {
    const float* lse = m.parts_lse + row;
    const float merged = merged_lse(lse, m.parts, m.rows);
    const int64_t i = row % m.seqlen_q;
    const int64_t head = row / m.seqlen_q % m.heads_q;
    const int64_t batch = row / m.seqlen_q / m.heads_q;
    Element* out = static_cast<Element*>(m.out) + batch * m.out_batch_stride +
                   head * m.out_head_stride + i * m.out_row_stride;
    const float* parts_out = m.parts_out + row * m.dim_v;
    for (int64_t d = threadIdx.x; d < m.dim_v; d += kMergeThreads) {
      out[d] = simt::narrow<Element>(
          merged_value(parts_out + d, lse, m.parts, m.rows * m.dim_v, m.rows, merged));
    }
    if (threadIdx.x == 0 && m.lse != nullptr) m.lse[row] = merged;
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
