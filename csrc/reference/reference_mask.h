// Internal: the host twin of the kernels' mask handling, for the fp64 references: where a
// (batch, head) slice's rows live (varlen or dense) and what a (query, key) pair adds to its
// score (0, -inf, or the additive mask value). Structure comes from attention/mask_policy.h, the
// same code the kernels run.
#pragma once

#include <cstdint>
#include <limits>

#include "attention/mask_policy.h"
#include "common/host_float.h"
#include "samattn/attention.h"

namespace samattn::detail {

// The rows of sequence `b`: its first row in the (packed or per-batch) tensors and its lengths
// (a dense batch entry's keys: cache_seqlens[b] where given).
struct SequenceRows {
  int64_t q_row0, k_row0;  // added to the row index (0 unless varlen)
  int64_t seqlen_q, seqlen_k;
};

inline SequenceRows sequence_rows(const AttentionParams& p, int64_t b) {
  if (p.mask.has_cache_seqlens()) return {0, 0, p.seqlen_q, p.mask.cache_seqlens[b]};
  if (!p.mask.is_varlen()) return {0, 0, p.seqlen_q, p.seqlen_k};
  const int64_t q0 = p.mask.cu_seqlens_q[b], k0 = p.mask.cu_seqlens_k[b];
  return {q0, k0, p.mask.cu_seqlens_q[b + 1] - q0, p.mask.cu_seqlens_k[b + 1] - k0};
}

// Offset of row `row` of sequence `b`'s lse: (B, Hq, Sq) dense, (Hq, total_q) varlen.
inline int64_t lse_offset(const AttentionParams& p, int64_t b, int64_t h, int64_t row) {
  if (p.mask.is_varlen()) return h * p.mask.total_q + p.mask.cu_seqlens_q[b] + row;
  return (b * p.heads_q + h) * p.seqlen_q + row;
}

inline double load_mask_value(const MaskOptions& m, int64_t offset) {
  switch (m.dtype) {
    case MaskDType::kBool:
      return static_cast<const uint8_t*>(m.data)[offset] != 0
                 ? 0.0
                 : -std::numeric_limits<double>::infinity();
    case MaskDType::kFloat64:
      return load_as_double(m.data, offset, DType::kFloat64);
    case MaskDType::kFloat32:
      return load_as_double(m.data, offset, DType::kFloat32);
    case MaskDType::kFloat16:
      return load_as_double(m.data, offset, DType::kFloat16);
    case MaskDType::kBFloat16:
      return load_as_double(m.data, offset, DType::kBFloat16);
  }
  return 0.0;
}

// What query i of sequence (b, h) adds to its score with key j: -inf when the key is hidden
// (kv_stride, causal, window, pattern, an unlisted block, a false boolean mask), otherwise the
// additive mask value (0 without one). `hidden` is set when the key takes no part in the softmax at
// all; an additive -inf leaves the key in the row but with weight 0, which is the same thing.
inline bool reference_key_bias(const AttentionParams& p, const MaskPolicy& policy, int64_t b,
                               int64_t h, int64_t i, int64_t j, double& bias) {
  bias = 0.0;
  if (j % p.kv_stride != 0) return false;
  if (!structurally_visible(policy, i, j)) return false;
  if (p.mask.has_block_map()) {
    const MaskOptions& m = p.mask;
    const int64_t entry = b * m.block_batch_stride + h * m.block_head_stride +
                          (i / m.block_q) * m.block_row_stride +
                          (j / m.block_k) * m.block_col_stride;
    if (m.block_map[entry] == 0) return false;
  }
  if (p.mask.has_element_mask()) {
    const MaskOptions& m = p.mask;
    bias = load_mask_value(
        m, b * m.batch_stride + h * m.head_stride + i * m.row_stride + j * m.col_stride);
    if (bias == -std::numeric_limits<double>::infinity()) return false;
  }
  return true;
}

}  // namespace samattn::detail
