#include "tensor_params.h"

#include <c10/util/Exception.h>

#include "common/check.h"

// TORCH_CHECK_VALUE / TORCH_CHECK_TYPE with a message built by samattn's formatter (see
// common/check.h for why no iostreams): c10 passes a ready std::string through untouched.
#define SAMATTN_CHECK_VALUE(cond, ...) \
  TORCH_CHECK_VALUE(cond, ::samattn::detail::concat("samattn: ", __VA_ARGS__))
#define SAMATTN_CHECK_TYPE(cond, ...) \
  TORCH_CHECK_TYPE(cond, ::samattn::detail::concat("samattn: ", __VA_ARGS__))

namespace samattn::torch_ops {
namespace {

std::string list(at::IntArrayRef values) {
  std::string out = "[";
  for (size_t i = 0; i < values.size(); ++i) {
    out += (i ? ", " : "") + std::to_string(values[i]);
  }
  return out + "]";
}

const char* name(at::ScalarType type) { return c10::toString(type); }

std::string name(const at::Device& device) { return device.str(); }

DType to_dtype(at::ScalarType type, const char* arg) {
  switch (type) {
    case at::kDouble:
      return DType::kFloat64;
    case at::kFloat:
      return DType::kFloat32;
    case at::kHalf:
      return DType::kFloat16;
    case at::kBFloat16:
      return DType::kBFloat16;
    default:
      break;
  }
  SAMATTN_CHECK_TYPE(false, arg, " dtype must be one of float64, float32, float16, bfloat16, got ",
                     name(type));
}

Backend to_backend(std::string_view name) {
  if (name == "auto") return Backend::kAuto;
  if (name == "simt") return Backend::kSimt;
  if (name == "tensor_core") return Backend::kTensorCore;
  if (name == "hopper") return Backend::kHopper;
  SAMATTN_CHECK_VALUE(false, "backend must be one of 'auto', 'simt', 'tensor_core', 'hopper', got '", name,
                      "'");
}

void check_layout(const at::Tensor& t, const char* arg) {
  SAMATTN_CHECK_VALUE(t.defined(), arg, " must be a tensor, got None");
  SAMATTN_CHECK_VALUE(t.dim() == 4, arg,
                      " must be 4-D (batch, heads, seq_len, head_dim), got shape ",
                      list(t.sizes()));
  SAMATTN_CHECK_VALUE(t.stride(3) == 1 || t.size(3) <= 1, arg,
                      " must be contiguous in its last dimension (stride 1), got strides ",
                      list(t.strides()), "; call .contiguous() first");
  SAMATTN_CHECK_VALUE(!t.is_sparse(), arg, " must be a dense tensor");
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
  SAMATTN_CHECK_TYPE(key.scalar_type() == query.scalar_type(), "key dtype (",
                     name(key.scalar_type()), ") must match query dtype (",
                     name(query.scalar_type()), ")");
  SAMATTN_CHECK_TYPE(value.scalar_type() == query.scalar_type(), "value dtype (",
                     name(value.scalar_type()), ") must match query dtype (",
                     name(query.scalar_type()), ")");
  SAMATTN_CHECK_VALUE(query.device().is_cuda() || query.device().is_cpu(),
                      "query must be on a CUDA device or the CPU, got ", name(query.device()));
  SAMATTN_CHECK_VALUE(key.device() == query.device(), "key is on ", name(key.device()),
                      " but query is on ", name(query.device()),
                      "; all inputs must be on one device");
  SAMATTN_CHECK_VALUE(value.device() == query.device(), "value is on ", name(value.device()),
                      " but query is on ", name(query.device()),
                      "; all inputs must be on one device");

  const int64_t batch = query.size(0);
  SAMATTN_CHECK_VALUE(key.size(0) == batch && value.size(0) == batch, "batch sizes differ: query ",
                      batch, ", key ", key.size(0), ", value ", value.size(0));
  SAMATTN_CHECK_VALUE(value.size(1) == key.size(1), "value heads (", value.size(1),
                      ") must equal key heads (", key.size(1), ")");
  SAMATTN_CHECK_VALUE(key.size(1) >= 1 && query.size(1) % key.size(1) == 0, "query heads (",
                      query.size(1), ") must be a multiple of key/value heads (", key.size(1),
                      ") for grouped-query attention");
  SAMATTN_CHECK_VALUE(value.size(2) == key.size(2), "value seq_len (", value.size(2),
                      ") must equal key seq_len (", key.size(2), ")");
  SAMATTN_CHECK_VALUE(key.size(3) == query.size(3), "key head_dim (", key.size(3),
                      ") must equal query head_dim (", query.size(3), ")");
  SAMATTN_CHECK_VALUE(query.size(3) >= 1 && query.size(3) <= kMaxHeadDim,
                      "head_dim must be in [1, ", kMaxHeadDim, "], got ", query.size(3));
  SAMATTN_CHECK_VALUE(value.size(3) >= 1 && value.size(3) <= kMaxHeadDim,
                      "value head_dim must be in [1, ", kMaxHeadDim, "], got ", value.size(3));

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

void check_output(const at::Tensor& out, const at::Tensor& query, const AttentionParams& p,
                  const char* arg) {
  SAMATTN_CHECK_VALUE(out.defined(), arg, " must be a tensor, got None");
  SAMATTN_CHECK_TYPE(out.scalar_type() == query.scalar_type(), arg, " dtype (",
                     name(out.scalar_type()), ") must match query dtype (",
                     name(query.scalar_type()), ")");
  SAMATTN_CHECK_VALUE(out.device() == query.device(), arg, " is on ", name(out.device()),
                      " but query is on ", name(query.device()));
  const std::vector<int64_t> expected{p.batch, p.heads_q, p.seqlen_q, p.head_dim_v};
  SAMATTN_CHECK_VALUE(out.sizes() == at::IntArrayRef(expected), arg, " must have shape ",
                      list(expected), ", got ", list(out.sizes()));
  // An empty tensor's strides are never used (the expanded gradient of an empty output has
  // strides 0).
  SAMATTN_CHECK_VALUE(out.numel() == 0 || out.stride(3) == 1 || out.size(3) <= 1, arg,
                      " must be contiguous in its last dimension, got strides ",
                      list(out.strides()));
}

void check_lse(const at::Tensor& lse, const at::Tensor& query, const AttentionParams& p) {
  SAMATTN_CHECK_VALUE(lse.defined(), "lse must be a tensor, got None");
  const at::ScalarType expected_type = lse_dtype(query.scalar_type());
  SAMATTN_CHECK_TYPE(lse.scalar_type() == expected_type, "lse dtype must be ", name(expected_type),
                     " for ", name(query.scalar_type()), " inputs, got ", name(lse.scalar_type()));
  SAMATTN_CHECK_VALUE(lse.device() == query.device(), "lse is on ", name(lse.device()),
                      " but query is on ", name(query.device()));
  const std::vector<int64_t> expected{p.batch, p.heads_q, p.seqlen_q};
  SAMATTN_CHECK_VALUE(lse.sizes() == at::IntArrayRef(expected), "lse must have shape ",
                      list(expected), " (the forward's return_lse=True output), got ",
                      list(lse.sizes()));
  SAMATTN_CHECK_VALUE(lse.is_contiguous(), "lse must be contiguous, got strides ",
                      list(lse.strides()));
}

void set_output(AttentionParams& p, const at::Tensor& out) {
  p.out = out.data_ptr();
  p.out_strides = strides_of(out);
}

AttentionBackwardParams make_backward_params(const AttentionParams& forward, const at::Tensor& dout,
                                             const at::Tensor& dq, const at::Tensor& dk,
                                             const at::Tensor& dv) {
  AttentionBackwardParams bp;
  bp.forward = forward;
  bp.dout = dout.data_ptr();
  bp.dout_strides = strides_of(dout);
  bp.dq = dq.data_ptr();
  bp.dk = dk.data_ptr();
  bp.dv = dv.data_ptr();
  bp.dq_strides = strides_of(dq);
  bp.dk_strides = strides_of(dk);
  bp.dv_strides = strides_of(dv);
  return bp;
}

void check_params(const AttentionParams& p) {
  const Status status = can_implement(p);
  TORCH_CHECK_VALUE(status.ok(), std::string(status.message()));
}

}  // namespace samattn::torch_ops
