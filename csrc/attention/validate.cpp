#include "attention/validate.h"

#include <cmath>

#include "common/check.h"

namespace samattn {

double default_softmax_scale(int64_t head_dim) {
  SAMATTN_CHECK(head_dim >= 1, "head_dim must be >= 1, got ", head_dim);
  return 1.0 / std::sqrt(static_cast<double>(head_dim));
}

Status can_implement_backward(const AttentionBackwardParams& params) {
  try {
    detail::validate_backward_params(params);
    detail::validate_backward_launch(params);
  } catch (const Error& error) {
    return Status::failure(error.what());
  }
  return Status::success();
}

Status can_implement(const AttentionParams& params) {
  try {
    detail::validate_forward_params(params);
  } catch (const Error& error) {
    return Status::failure(error.what());
  }
  return Status::success();
}

namespace detail {

namespace {

bool is_known_dtype(DType dtype) {
  switch (dtype) {
    case DType::kFloat64:
    case DType::kFloat32:
    case DType::kFloat16:
    case DType::kBFloat16:
      return true;
  }
  return false;
}

bool is_known_backend(Backend backend) {
  return backend == Backend::kAuto || backend == Backend::kSimt ||
         backend == Backend::kTensorCore || backend == Backend::kHopper;
}

}  // namespace

void validate_forward_params(const AttentionParams& p) {
  SAMATTN_CHECK(is_known_dtype(p.dtype), "dtype ", static_cast<int>(p.dtype),
                " is not one of float64, float32, float16, bfloat16");
  SAMATTN_CHECK(is_known_backend(p.backend), "backend ", static_cast<int>(p.backend),
                " is not one of auto, simt, tensor_core, hopper");
  SAMATTN_CHECK(p.batch >= 0, "batch must be >= 0, got ", p.batch);
  SAMATTN_CHECK(p.heads_q >= 1, "heads_q must be >= 1, got ", p.heads_q);
  SAMATTN_CHECK(p.heads_kv >= 1, "heads_kv must be >= 1, got ", p.heads_kv);
  SAMATTN_CHECK(p.heads_q % p.heads_kv == 0, "heads_q (", p.heads_q,
                ") must be a multiple of heads_kv (", p.heads_kv, ") for grouped-query attention");
  SAMATTN_CHECK(p.seqlen_q >= 0, "seqlen_q must be >= 0, got ", p.seqlen_q);
  SAMATTN_CHECK(p.seqlen_k >= 0, "seqlen_k must be >= 0, got ", p.seqlen_k);
  SAMATTN_CHECK(p.head_dim >= 1 && p.head_dim <= kMaxHeadDim, "head_dim must be in [1, ",
                kMaxHeadDim, "], got ", p.head_dim);
  SAMATTN_CHECK(p.head_dim_v >= 1 && p.head_dim_v <= kMaxHeadDim, "head_dim_v must be in [1, ",
                kMaxHeadDim, "], got ", p.head_dim_v);
  SAMATTN_CHECK(p.kv_stride >= 1, "kv_stride must be >= 1, got ", p.kv_stride);
  SAMATTN_CHECK(p.num_splits >= 0, "num_splits must be >= 0 (0: automatic, 1: no split), got ",
                p.num_splits);
  if (p.softmax_scale) {
    SAMATTN_CHECK(std::isfinite(*p.softmax_scale), "softmax_scale must be finite, got ",
                  *p.softmax_scale);
  }
  validate_mask_options(p);
  if (output_rows(p) > 0) {
    SAMATTN_CHECK(p.q != nullptr, "q must not be null");
    SAMATTN_CHECK(p.out != nullptr, "out must not be null");
    if (p.seqlen_k > 0 && (!p.mask.is_varlen() || p.mask.total_k > 0)) {
      SAMATTN_CHECK(p.k != nullptr, "k must not be null");
      SAMATTN_CHECK(p.v != nullptr, "v must not be null");
    }
  }
}

void validate_backward_params(const AttentionBackwardParams& bp) {
  const AttentionParams& p = bp.forward;
  validate_forward_params(p);
  SAMATTN_CHECK(!p.mask.is_paged(),
                "the backward takes no paged KV cache (mask.block_table): its gradients would "
                "scatter into shared pages; gather the pages into a dense cache first");
  if (output_rows(p) > 0) {
    SAMATTN_CHECK(bp.dout != nullptr, "dout must not be null");
    SAMATTN_CHECK(bp.dq != nullptr, "dq must not be null");
  }
  if (p.batch > 0 && p.seqlen_k > 0 && (!p.mask.is_varlen() || p.mask.total_k > 0)) {
    SAMATTN_CHECK(bp.dk != nullptr, "dk must not be null");
    SAMATTN_CHECK(bp.dv != nullptr, "dv must not be null");
  }
}

void validate_backward_launch(const AttentionBackwardParams& bp) {
  if (output_rows(bp.forward) > 0 && bp.forward.seqlen_k > 0) {
    SAMATTN_CHECK(bp.forward.lse != nullptr,
                  "lse must not be null: the backward recomputes the probabilities from the "
                  "forward's log-sum-exp");
  }
  const size_t workspace = attention_backward_workspace_bytes(bp);
  SAMATTN_CHECK(workspace == 0 || bp.workspace != nullptr,
                "workspace must not be null: ", static_cast<uint64_t>(workspace),
                " bytes are needed (attention_backward_workspace_bytes)");
  SAMATTN_CHECK(reinterpret_cast<uintptr_t>(bp.workspace) % 256 == 0,
                "workspace must be aligned to 256 bytes, got ",
                static_cast<const void*>(bp.workspace));
}

int64_t output_rows(const AttentionParams& p) {
  // Varlen: the packed rows that exist, not batch x the longest sequence.
  if (p.mask.is_varlen()) return p.batch > 0 ? p.heads_q * p.mask.total_q : 0;
  return p.batch * p.heads_q * p.seqlen_q;
}

int64_t strided_key_count(const AttentionParams& p) {
  return (p.seqlen_k + p.kv_stride - 1) / p.kv_stride;
}

double resolved_softmax_scale(const AttentionParams& p) {
  return p.softmax_scale ? *p.softmax_scale : default_softmax_scale(p.head_dim);
}

}  // namespace detail
}  // namespace samattn
