// Internal: the Sparse Transformer "fixed" pattern at its real cost, on the Hopper forward.
//
// Query i sees key j <= i when j / l == i / l (its own pattern block) or j % l >= l - c (one of
// the c summary columns that end every pattern block). At l = 128 every key block under the
// diagonal holds summary columns, so block skipping saves nothing and a masked kernel pays for
// all of causal attention (FlexAttention does too). The pattern is the disjoint union of
//   (a) the local part: l * floor(i / l) <= j <= i, the row's own pattern block, and
//   (b) the summary part: the summary columns of the pattern blocks before the row's own.
//       Gathered into consecutive keys (summary column t of pattern block p becomes key
//       p * c + t), query i sees keys [0, floor(i / l) * c): a staircase, which the Hopper
//       forward runs as a dense causal-like call (ForwardKernelParams::staircase_*) writing an
//       fp32 output and lse into the workspace. At S = 16k, l = 128, c = 16 that is 1/8 of
//       causal attention's pairs.
// (b) runs first; (a) then runs on the tensor-core masked kernel (the pattern with no summary
// columns, a few key blocks per row block) and merges (b) into every row from l on before
// normalising, as the strided pattern's band does (strided_pattern.h), so the output is rounded
// once. The backward runs on the masked kernels (the pattern in registers).
#pragma once

#include <cstddef>
#include <cstdint>

#include <cuda_runtime_api.h>

#include "attention/mask_policy.h"
#include "samattn/attention.h"
#include "samattn/error.h"

namespace samattn::detail {

// The key row of k and v that summary key s of the gathered part (b) holds: summary column
// s % c of pattern block s / c.
SAMATTN_HOST_DEVICE int64_t summary_key_row(int64_t s, int64_t l, int64_t c) {
  return s / c * l + l - c + s % c;
}

// How many gathered summary keys (b) needs: query i sees those below floor(i / l) * c, so the
// columns of the last query's pattern block and those past the last key are never seen; the
// rest are a prefix of the gathered keys.
int64_t fixed_summary_keys(const AttentionParams& params);

// Whether the decomposition can run the call: the fixed pattern, float16 or bfloat16, no element
// mask, block map, varlen, window or kv_stride, a summary part (seqlen_q > l and a summary column
// before the last query's pattern block), the Hopper forward for (b) and the tensor-core masked
// kernel for (a) on this device. Otherwise the fixed pattern runs on the masked kernels.
Status fixed_decomposition_status(const AttentionParams& params);

// Bytes of workspace the decomposition needs (the gathered summary keys and values, the summary
// part's fp32 output and lse); 0 when it does not apply.
size_t fixed_forward_workspace_bytes(const AttentionParams& params);

// Runs the decomposition (params validated, fixed_decomposition_status ok, params.workspace of
// fixed_forward_workspace_bytes bytes, 256-byte aligned).
void fixed_forward(const AttentionParams& params, cudaStream_t stream);

// Copies rows summary_key_row(s, l, c), s < rows, of each (batch, head) of src
// ((batch, heads, *, dim) elements of element_bytes with strides in elements) into dst,
// contiguous (batch, heads, rows, dim). Two tensors (keys and values) in one launch.
struct SummaryGather {
  const void* src[2];
  void* dst[2];
  Strides src_strides[2];
  int64_t dim[2];
  int64_t batch, heads, rows, l, c;
  int element_bytes;
};
void gather_summary_rows(const SummaryGather& gather, cudaStream_t stream);

}  // namespace samattn::detail
