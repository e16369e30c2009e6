// Internal: the workspace pieces of the Sparse Transformer decompositions (strided_pattern.h,
// fixed_pattern.h): 256-byte aligned, among them a prior softmax part's fp32 output and lse,
// which the tensor-core masked kernel merges into each row (ForwardKernelParams::prior_*).
#pragma once

#include <cstddef>
#include <cstdint>

#include "samattn/attention.h"

namespace samattn::detail {

inline constexpr size_t kWorkspaceAlignment = 256;

inline size_t workspace_round_up(size_t bytes) {
  return (bytes + kWorkspaceAlignment - 1) / kWorkspaceAlignment * kWorkspaceAlignment;
}

// A prior part's normalised output and natural-log lse, contiguous fp32.
struct PriorPart {
  float* out;  // (batch, heads_q, seqlen_q, head_dim_v)
  float* lse;  // (batch, heads_q, seqlen_q)
};

inline size_t prior_out_bytes(const AttentionParams& p) {
  return workspace_round_up(static_cast<size_t>(p.batch * p.heads_q * p.seqlen_q * p.head_dim_v) *
                            sizeof(float));
}

inline size_t prior_lse_bytes(const AttentionParams& p) {
  return workspace_round_up(static_cast<size_t>(p.batch * p.heads_q * p.seqlen_q) * sizeof(float));
}

inline size_t prior_part_bytes(const AttentionParams& p) {
  return prior_out_bytes(p) + prior_lse_bytes(p);
}

// The prior part at `base` (256-byte aligned): its output, then its lse.
inline PriorPart carve_prior_part(void* base, const AttentionParams& p) {
  auto* bytes = static_cast<unsigned char*>(base);
  return {reinterpret_cast<float*>(bytes), reinterpret_cast<float*>(bytes + prior_out_bytes(p))};
}

}  // namespace samattn::detail
