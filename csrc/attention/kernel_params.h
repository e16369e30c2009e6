// Internal: what a forward kernel receives, derived once on the host from AttentionParams.
#pragma once

#include <cstdint>

#include "attention/mask_policy.h"
#include "samattn/attention.h"

namespace samattn::detail {

struct ForwardKernelParams {
  const void* q;
  const void* k;
  const void* v;
  void* out;
  void* lse;  // nullable; contiguous (batch, heads_q, seqlen_q) in the accumulation type

  // Element strides. The k/v row strides already include kv_stride, so kernels walk the kept
  // keys densely: logical key n lives at row n * kv_stride.
  int64_t q_batch_stride, q_head_stride, q_row_stride;
  int64_t k_batch_stride, k_head_stride, k_row_stride;
  int64_t v_batch_stride, v_head_stride, v_row_stride;
  int64_t o_batch_stride, o_head_stride, o_row_stride;

  int64_t batch, heads_q, group_size;  // group_size = heads_q / heads_kv
  int64_t seqlen_q;
  int64_t kept_keys;  // ceil(seqlen_k / kv_stride)
  int64_t kv_stride;  // position of logical key n is n * kv_stride (used by the causal mask)
  int head_dim, head_dim_v;
  double scale_log2;  // softmax_scale * log2(e): scores go through exp2
  bool causal;

  // lse element (b, h, i) lives at b * lse_batch_stride + h * lse_head_stride + i: (B, Hq, Sq)
  // contiguous, or a slice of a varlen (Hq, total_q) array.
  int64_t lse_batch_stride, lse_head_stride;

  // Masks (attention/mask_policy.h): the structural policy (causal, window, pattern) at
  // physical positions (logical key n is position n * kv_stride), and the optional element mask
  // tensor indexed by (b, query head, query, position).
  MaskPolicy policy;
  bool has_policy;  // false: only causal and kv_stride hide keys (the original fast checks)
  const void* mask;
  MaskDType mask_dtype;
  int64_t mask_batch_stride, mask_head_stride, mask_row_stride, mask_col_stride;
  // Block-sparse map (samattn/mask.h), indexed by (b, query head, query / block_q, position /
  // block_k), or null.
  const uint8_t* block_map;
  int64_t block_q, block_k;
  int64_t block_batch_stride, block_head_stride, block_row_stride, block_col_stride;
  // Window, pattern, element mask or block map: the kMasked kernels run (mask_policy.cuh).
  bool masked;

  // Read by the tensor-core masked kernel only (tensor_core/forward_masked_kernel.cuh); the other
  // kernels are never given values other than these defaults (null, 1, false).
  // Varlen in one launch: sequence b owns q/out rows [cu_seqlens_q[b], cu_seqlens_q[b + 1]) and
  // k/v rows [cu_seqlens_k[b], cu_seqlens_k[b + 1]) of the packed tensors (batch strides 0),
  // read on the device and clamped to [0, total_q] / [0, total_k] and to the maximum lengths, so
  // invalid contents cannot make a kernel touch memory outside the tensors. seqlen_q and
  // kept_keys are then the maximum lengths; lse is (Hq, total_q).
  const int32_t* cu_seqlens_q;
  const int32_t* cu_seqlens_k;
  int64_t total_q, total_k;
  // lse element of row i is at ... + i * lse_row_stride (strided views of an lse array).
  int64_t lse_row_stride;
  // `out` is an fp32 array instead of the element type (the strided decomposition's workspace).
  bool out_is_float;
  // A second softmax part merged into every row before normalisation (the strided pattern's
  // residue classes, attention/strided_pattern.h): its natural-log lse and normalised output,
  // contiguous fp32 (batch, heads_q, seqlen_q) and (batch, heads_q, seqlen_q, head_dim_v), valid
  // for rows >= prior_rows_begin (earlier rows have no prior part). Null when absent.
  const float* prior_out;
  const float* prior_lse;
  int64_t prior_rows_begin;
  // Dense batches only: > 0, the kept keys of the last batch entry (the split-key forward's
  // shorter last chunk, in the same launch as the others, attention/key_split.h); 0: kept_keys.
  int64_t last_batch_kept_keys;

  // Read by the Hopper forward only (0 elsewhere): with staircase_keys > 0, a causal call's
  // query i sees the logical keys n < (i / staircase_rows) * staircase_keys instead of those with
  // n * kv_stride <= i (the fixed pattern's summary part, attention/fixed_pattern.h). The Hopper
  // forward also honours out_is_float (the output then leaves from registers).
  int64_t staircase_rows, staircase_keys;
};

// True when a call needs the tensor-core masked kernel: any mask option, varlen, a prior part,
// an fp32 output or a strided lse.
inline bool needs_masked_kernel(const ForwardKernelParams& p) {
  return p.masked || p.cu_seqlens_q != nullptr || p.prior_lse != nullptr || p.out_is_float ||
         p.lse_row_stride != 1;
}

// True when partial key blocks need the per-element mask tile (a pattern, a block map or an
// element mask); causal, the window, kv_stride and sequence ends alone are per-row key ranges.
SAMATTN_HOST_DEVICE bool needs_mask_tile(const ForwardKernelParams& p) {
  return p.policy.pattern != SparsePattern::kNone || p.block_map != nullptr || p.mask != nullptr;
}

// True when the tensor-core forward masks the partial key blocks of the fixed pattern with
// arithmetic in registers (per row: the pattern block's key range; per key: summary column or
// not), which needs no mask tile: the fixed pattern without a block map or element mask on top.
SAMATTN_HOST_DEVICE bool forward_fixed_pattern_in_registers(const ForwardKernelParams& p) {
  return p.policy.pattern == SparsePattern::kFixed && p.block_map == nullptr && p.mask == nullptr;
}

// The tensor-core forward's mask tile: what needs one, less what it masks in registers.
SAMATTN_HOST_DEVICE bool forward_needs_mask_tile(const ForwardKernelParams& p) {
  return needs_mask_tile(p) && !forward_fixed_pattern_in_registers(p);
}

// Derives the kernel parameters from validated AttentionParams (strides with kv_stride folded
// in, kept key count, log2-scaled softmax scale; varlen's cu_seqlens and lse layout).
ForwardKernelParams make_forward_kernel_params(const AttentionParams& params);

// Blocks of a grid with one block per (batch, head, block_m query rows), checked against the
// launch limit (throws samattn::Error beyond it).
unsigned query_block_grid(const ForwardKernelParams& params, int block_m);

}  // namespace samattn::detail
