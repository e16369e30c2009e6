// Internal: the Sparse Transformer "strided" pattern at its real cost on the tensor cores.
//
// Query i sees key j <= i when i - j < l or (i - j) % l == 0. With key blocks of 64-128, every
// block under the diagonal holds visible and hidden pairs, so block skipping saves nothing. The
// pattern is the disjoint union of
//   (a) a band: 0 <= i - j <= l - 1 (a causal window of l - 1 keys), and
//   (b) residue classes: i - j = l * t, t >= 1. For residue r, queries r + l, r + 2l, ... see
//       keys r, r + l, ... strictly before them: plain causal attention between the strided
//       views q[r + l :: l] and k[r :: l], v[r :: l].
// (b) runs first, as dense causal calls whose batch index is the residue (batch stride = one
// row, row stride = l rows; heads are the (batch, head) pairs when they merge into one stride,
// else one call per batch entry), writing an fp32 output and lse into a workspace. (a) then
// runs the masked kernel's row-range path and merges that prior part into each row's softmax
// before normalising, so the output is rounded once. A window on top (query i sees j >= i - W)
// shortens the band to min(l - 1, W) and gives the residue views a window of floor(W / l) - 1.
//
// Backward: the FlashAttention backward of each part, fed the total lse and
// D = rowsum(dO * O), is exactly that part's share of the gradient; the shares are summed.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include <cuda_runtime_api.h>

#include "attention/backward_kernel_params.h"
#include "samattn/attention.h"

namespace samattn::detail {

// Residues r0 .. r0 + count - 1 whose views have the same number of query rows and keys.
struct ResidueGroup {
  int64_t first_residue, count;
  int64_t rows;  // query rows of each view: a = 0 .. rows - 1 is query r + l * (a + 1)
  int64_t keys;  // keys of each view the causal rule can reach: c = 0 .. keys - 1 is key r + l * c
};

// The residue views of a (seqlen_q, seqlen_k) problem with stride l, grouped (at most three
// groups); views without query rows are left out. `window_left` is the call's (-1: none).
std::vector<ResidueGroup> residue_groups(int64_t seqlen_q, int64_t seqlen_k, int64_t l,
                                         int64_t window_left);

// True when the call is the strided pattern in a form the decomposition covers: float16 or
// bfloat16, no element mask, block map, varlen or kv_stride. Decided from the parameters alone.
bool strided_decomposition_applies(const AttentionParams& params);

// Bytes of fp32 workspace the decomposition's forward needs: the residue part's output and lse,
// (batch, heads_q, seqlen_q, head_dim_v) and (batch, heads_q, seqlen_q); 0 when it does not apply
// or has no residue part (seqlen_q <= l, where the pattern is the band alone, or a window below l).
size_t strided_forward_workspace_bytes(const AttentionParams& params);

// Runs the decomposition on the tensor-core kernels (params validated, tensor_core::supports()
// true, params.workspace of strided_forward_workspace_bytes bytes).
void strided_forward(const AttentionParams& params, cudaStream_t stream);

// The backward's decomposition: the tensor-core backward (float16/bfloat16, head dims 32-128),
// atomic dQ (not deterministic), a residue part. The parts add dK and dV into fp32 accumulators
// of strided_backward_workspace_bytes bytes (the caller's workspace), dQ into dq_accum; the band
// runs last and converts all three.
bool strided_backward_applies(const AttentionBackwardParams& params);
size_t strided_backward_workspace_bytes(const AttentionBackwardParams& params);

// `full`: the whole problem's kernel parameters with D computed and dq_accum set;
// `accumulators`: strided_backward_workspace_bytes(params) bytes, 256-byte aligned.
void strided_backward(const AttentionBackwardParams& params, const BackwardKernelParams& full,
                      void* accumulators, cudaStream_t stream);

}  // namespace samattn::detail
