// Internal: the host-side checks shared by the CUDA path and the CPU reference.
#pragma once

#include "samattn/attention.h"

namespace samattn::detail {

// Throws samattn::Error naming the first invalid field of `params`.
void validate_forward_params(const AttentionParams& params);

// Number of output rows (batch * heads_q * seqlen_q); zero means there is nothing to launch.
int64_t output_rows(const AttentionParams& params);

// Keys kept by kv_stride: ceil(seqlen_k / kv_stride).
int64_t strided_key_count(const AttentionParams& params);

// Checks of params.mask (validate_mask.cpp); called by validate_forward_params.
void validate_mask_options(const AttentionParams& params);

// Varlen only: cu_seqlens_q/k in host memory start at 0, never decrease, end at total_q/k and
// no sequence exceeds seqlen_q/k (the references read them; device arrays are the caller's).
void validate_host_cu_seqlens(const AttentionParams& params);

// cache_seqlens in host memory: each entry in [0, seqlen_k] (the references and the per-entry
// path read them; the decoding kernel clamps them on the device).
void validate_host_cache_seqlens(const AttentionParams& params);

double resolved_softmax_scale(const AttentionParams& params);

// Throws samattn::Error naming the first invalid field of a backward problem (the forward
// problem, dout, dq, dk, dv). Shared by the CUDA path and the CPU reference.
void validate_backward_params(const AttentionBackwardParams& params);

// The CUDA path's further requirements: lse and the workspace.
void validate_backward_launch(const AttentionBackwardParams& params);

}  // namespace samattn::detail
