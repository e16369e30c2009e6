#include "tensor_params.h"

#include <c10/util/Exception.h>

namespace samattn::torch_ops {
namespace {

DType to_dtype(at::ScalarType type, const char* name) {
  switch (type) {
    case at::kDouble: return DType::kFloat64;
    case at::kFloat: return DType::kFloat32;
    case at::kHalf: return DType::kFloat16;
    case at::kBFloat16: return DType::kBFloat16;
    default: break;
  }
  TORCH_CHECK_TYPE(false, "samattn: ", name,
                   " dtype must be one of float64, float32, float16, bfloat16, got ", type);
}

Backend to_backend(std::string_view name) {
  if (name == "auto") return Backend::kAuto;
  if (name == "simt") return Backend::kSimt;
  if (name == "tensor_core") return Backend::kTensorCore;
  TORCH_CHECK_VALUE(false, "samattn: backend must be one of 'auto', 'simt', 'tensor_core', got '",
                    name, "'");
}

void check_layout(const at::Tensor& t, const char* name) {
  TORCH_CHECK_VALUE(t.defined(), "samattn: ", name, " must be a tensor, got None");
  TORCH_CHECK_VALUE(t.dim() == 4, "samattn: ", name,
                    " must be 4-D (batch, heads, seq_len, head_dim), got shape ", t.sizes());
  TORCH_CHECK_VALUE(t.stride(3) == 1 || t.size(3) <= 1, "samattn: ", name,
                    " must be contiguous in its last dimension (stride 1), got strides ",
                    t.strides(), "; call .contiguous() first");
  TORCH_CHECK_VALUE(!t.is_sparse(), "samattn: ", name, " must be a dense tensor");
}

Strides strides_of(const at::Tensor& t) { return Strides{t.stride(0), t.stride(1), t.stride(2)}; }

}  // namespace

at::ScalarType lse_dtype(at::ScalarType input) {
  return input == at::kDouble ? at::kDouble : at::kFloat;
}

AttentionParams make_forward_params(const at::Tensor& query, const at::Tensor& key,
                                    const at::Tensor& value, const ForwardOptions& options) {
  check_layout(query, "query");
  check_layout(key, "key");
  check_layout(value, "value");
  const DType dtype = to_dtype(query.scalar_type(), "query");
  TORCH_CHECK_TYPE(key.scalar_type() == query.scalar_type(), "samattn: key dtype (",
                   key.scalar_type(), ") must match query dtype (", query.scalar_type(), ")");
  TORCH_CHECK_TYPE(value.scalar_type() == query.scalar_type(), "samattn: value dtype (",
                   value.scalar_type(), ") must match query dtype (", query.scalar_type(), ")");
  TORCH_CHECK_VALUE(query.device().is_cuda() || query.device().is_cpu(),
                    "samattn: query must be on a CUDA device or the CPU, got ", query.device());
  TORCH_CHECK_VALUE(key.device() == query.device(), "samattn: key is on ", key.device(),
                    " but query is on ", query.device(), "; all inputs must be on one device");
  TORCH_CHECK_VALUE(value.device() == query.device(), "samattn: value is on ", value.device(),
                    " but query is on ", query.device(), "; all inputs must be on one device");

  const int64_t batch = query.size(0);
  TORCH_CHECK_VALUE(key.size(0) == batch && value.size(0) == batch,
                    "samattn: batch sizes differ: query ", batch, ", key ", key.size(0),
                    ", value ", value.size(0));
  TORCH_CHECK_VALUE(value.size(1) == key.size(1), "samattn: value heads (", value.size(1),
                    ") must equal key heads (", key.size(1), ")");
  TORCH_CHECK_VALUE(key.size(1) >= 1 && query.size(1) % key.size(1) == 0,
                    "samattn: query heads (", query.size(1),
                    ") must be a multiple of key/value heads (", key.size(1),
                    ") for grouped-query attention");
  TORCH_CHECK_VALUE(value.size(2) == key.size(2), "samattn: value seq_len (", value.size(2),
                    ") must equal key seq_len (", key.size(2), ")");
  TORCH_CHECK_VALUE(key.size(3) == query.size(3), "samattn: key head_dim (", key.size(3),
                    ") must equal query head_dim (", query.size(3), ")");
  TORCH_CHECK_VALUE(query.size(3) >= 1 && query.size(3) <= kMaxHeadDim,
                    "samattn: head_dim must be in [1, ", kMaxHeadDim, "], got ", query.size(3));
  TORCH_CHECK_VALUE(value.size(3) >= 1 && value.size(3) <= kMaxHeadDim,
                    "samattn: value head_dim must be in [1, ", kMaxHeadDim, "], got ",
                    value.size(3));

  AttentionParams p;
  p.q = query.data_ptr();
  p.k = key.data_ptr();
  p.v = value.data_ptr();
  p.dtype = dtype;
  p.batch = batch;
  p.heads_q = query.size(1);
  p.heads_kv = key.size(1);
  p.seqlen_q = query.size(2);
  p.seqlen_k = key.size(2);
  p.head_dim = query.size(3);
  p.head_dim_v = value.size(3);
  p.q_strides = strides_of(query);
  p.k_strides = strides_of(key);
  p.v_strides = strides_of(value);
  p.softmax_scale = options.scale;
  p.causal = options.causal;
  p.kv_stride = options.kv_stride;
  p.backend = to_backend(options.backend);
  return p;
}

void check_output(const at::Tensor& out, const at::Tensor& query, const AttentionParams& p) {
  TORCH_CHECK_VALUE(out.defined(), "samattn: out must be a tensor, got None");
  TORCH_CHECK_TYPE(out.scalar_type() == query.scalar_type(), "samattn: out dtype (",
                   out.scalar_type(), ") must match query dtype (", query.scalar_type(), ")");
  TORCH_CHECK_VALUE(out.device() == query.device(), "samattn: out is on ", out.device(),
                    " but query is on ", query.device());
  const std::vector<int64_t> expected{p.batch, p.heads_q, p.seqlen_q, p.head_dim_v};
  TORCH_CHECK_VALUE(out.sizes() == at::IntArrayRef(expected), "samattn: out must have shape ",
                    at::IntArrayRef(expected), ", got ", out.sizes());
  TORCH_CHECK_VALUE(out.stride(3) == 1 || out.size(3) <= 1,
                    "samattn: out must be contiguous in its last dimension, got strides ",
                    out.strides());
}

void set_output(AttentionParams& p, const at::Tensor& out) {
  p.out = out.data_ptr();
  p.out_strides = strides_of(out);
}

void check_params(const AttentionParams& p) {
  const Status status = can_implement(p);
  TORCH_CHECK_VALUE(status.ok(), status.message());
}

}  // namespace samattn::torch_ops
