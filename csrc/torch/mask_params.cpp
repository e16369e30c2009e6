// Torch-side checks and binding of the mask options and of varlen (packed) batches. Every
// failed check raises before anything is allocated or launched and names the argument.
#include <c10/util/Exception.h>

#include <ATen/ATen.h>

#include "common/check.h"
#include "tensor_params.h"
#include "torch_checks.h"

namespace samattn::torch_ops {
namespace {

MaskDType to_mask_dtype(at::ScalarType type) {
  switch (type) {
    case at::kBool:
      return MaskDType::kBool;
    case at::kDouble:
      return MaskDType::kFloat64;
    case at::kFloat:
      return MaskDType::kFloat32;
    case at::kHalf:
      return MaskDType::kFloat16;
    case at::kBFloat16:
      return MaskDType::kBFloat16;
    default:
      break;
  }
  SAMATTN_CHECK_TYPE(false,
                     "attn_mask dtype must be bool or a float type (float32 or the "
                     "query's dtype), got ",
                     c10::toString(type));
}

SparsePattern to_pattern(std::string_view name) {
  if (name == "none") return SparsePattern::kNone;
  if (name == "strided") return SparsePattern::kStrided;
  if (name == "fixed") return SparsePattern::kFixed;
  SAMATTN_CHECK_VALUE(false, "sparse_pattern must be one of 'none', 'strided', 'fixed', got '",
                      name, "'");
}

void check_cu_seqlens(const at::Tensor& cu, const at::Tensor& query, int64_t total,
                      int64_t max_seqlen, const char* name, const char* max_name) {
  SAMATTN_CHECK_TYPE(cu.scalar_type() == at::kInt, name, " must be int32, got ",
                     c10::toString(cu.scalar_type()));
  SAMATTN_CHECK_VALUE(cu.device() == query.device(), name, " is on ", cu.device().str(),
                      " but query is on ", query.device().str(), "; it must be on the same device");
  SAMATTN_CHECK_VALUE(cu.dim() == 1 && cu.size(0) >= 1, name,
                      " must be 1-D with batch + 1 entries, got shape ", shape_list(cu.sizes()));
  SAMATTN_CHECK_VALUE(cu.is_contiguous(), name, " must be contiguous");
  // CUDA cu_seqlens are not read back: that would synchronise every call (and break CUDA-graph
  // capture). As in FlashAttention-2 their contents are the caller's contract; the kernels clamp
  // them, so wrong ones give wrong values but never reads or writes outside the tensors. The
  // CUDA-core path reads them once on the host and checks them there (attention/varlen.cpp).
  if (cu.is_cuda()) return;
  const at::Tensor host = cu.to(at::kCPU);
  const int32_t* values = host.data_ptr<int32_t>();
  const int64_t batch = cu.size(0) - 1;
  SAMATTN_CHECK_VALUE(values[0] == 0, name, "[0] must be 0, got ", values[0]);
  for (int64_t b = 0; b < batch; ++b) {
    const int64_t length = static_cast<int64_t>(values[b + 1]) - values[b];
    SAMATTN_CHECK_VALUE(length >= 0, name, " must be non-decreasing, got ", name, "[", b,
                        "] = ", values[b], " > ", name, "[", b + 1, "] = ", values[b + 1]);
    SAMATTN_CHECK_VALUE(length <= max_seqlen, "sequence ", b, " has ", length, " tokens by ", name,
                        " but ", max_name, " is ", max_seqlen);
  }
  SAMATTN_CHECK_VALUE(values[batch] == total, name, "[-1] (", values[batch],
                      ") must equal the total tokens of the packed tensor (", total, ")");
}

void check_packed(const at::Tensor& t, const char* arg) {
  SAMATTN_CHECK_VALUE(t.defined(), arg, " must be a tensor, got None");
  SAMATTN_CHECK_VALUE(t.dim() == 3, arg, " must be 3-D (total_tokens, heads, head_dim), got shape ",
                      shape_list(t.sizes()));
  SAMATTN_CHECK_VALUE(t.stride(2) == 1 || t.size(2) <= 1, arg,
                      " must be contiguous in its last dimension, got strides ",
                      shape_list(t.strides()));
}

void bind_block_map(AttentionParams& params, const at::Tensor& query, const at::Tensor& map,
                    int64_t block_q, int64_t block_k) {
  SAMATTN_CHECK_TYPE(map.scalar_type() == at::kBool || map.scalar_type() == at::kByte,
                     "block_map dtype must be bool or uint8, got ",
                     c10::toString(map.scalar_type()));
  SAMATTN_CHECK_VALUE(map.device() == query.device(), "block_map is on ", map.device().str(),
                      " but query is on ", query.device().str());
  SAMATTN_CHECK_VALUE(block_q >= 1 && block_k >= 1,
                      "block sizes must be >= 1, got block_q = ", block_q, ", block_k = ", block_k);
  const int64_t q_blocks = (params.seqlen_q + block_q - 1) / block_q;
  const int64_t k_blocks = (params.seqlen_k + block_k - 1) / block_k;
  const std::vector<int64_t> full{params.batch, params.heads_q, q_blocks, k_blocks};
  SAMATTN_CHECK_VALUE(map.dim() == 4,
                      "block_map must be 4-D (batch|1, heads|1, query blocks, "
                      "key blocks) = ",
                      shape_list(full), ", got shape ", shape_list(map.sizes()));
  int64_t strides[4];
  for (int64_t d = 0; d < 4; ++d) {
    const bool broadcast_ok = d < 2 && map.size(d) == 1;
    SAMATTN_CHECK_VALUE(map.size(d) == full[d] || broadcast_ok, "block_map of shape ",
                        shape_list(map.sizes()),
                        " does not match (batch|1, heads|1, ceil(Sq / block_q), "
                        "ceil(Sk / block_k)) = ",
                        shape_list(full), " in dimension ", d);
    strides[d] = map.size(d) == 1 ? 0 : map.stride(d);
  }
  MaskOptions& m = params.mask;
  m.block_map = static_cast<const uint8_t*>(map.data_ptr());
  m.block_q = block_q;
  m.block_k = block_k;
  m.block_batch_stride = strides[0];
  m.block_head_stride = strides[1];
  m.block_row_stride = strides[2];
  m.block_col_stride = strides[3];
}

// CUDA lengths are not read back here (no synchronisation): the decoding kernel clamps them and
// the per-entry path checks them when it reads them; CPU ones are checked by the reference.
void bind_cache_seqlens(AttentionParams& params, const at::Tensor& query,
                        const at::Tensor& lengths) {
  SAMATTN_CHECK_TYPE(lengths.scalar_type() == at::kInt, "cache_seqlens must be int32, got ",
                     c10::toString(lengths.scalar_type()));
  SAMATTN_CHECK_VALUE(lengths.device() == query.device(), "cache_seqlens is on ",
                      lengths.device().str(), " but query is on ", query.device().str(),
                      "; it must be on the same device");
  SAMATTN_CHECK_VALUE(lengths.dim() == 1 && lengths.size(0) == params.batch,
                      "cache_seqlens must be 1-D with one entry per batch entry (", params.batch,
                      "), got shape ", shape_list(lengths.sizes()));
  SAMATTN_CHECK_VALUE(lengths.is_contiguous(), "cache_seqlens must be contiguous");
  params.mask.cache_seqlens = lengths.data_ptr<int32_t>();
}

}  // namespace

void bind_mask(AttentionParams& params, const at::Tensor& query, const MaskArguments& args) {
  MaskOptions& m = params.mask;
  m.window_left = args.window_left;
  m.window_right = args.window_right;
  m.pattern = to_pattern(args.sparse_pattern);
  m.pattern_block = args.sparse_block;
  m.pattern_summary = args.sparse_summary;
  m.causal_lower_right = args.causal_lower_right;
  m.window_follows_causal = args.window_follows_causal;
  if (args.block_map != nullptr && args.block_map->has_value() && (*args.block_map)->defined()) {
    bind_block_map(params, query, **args.block_map, args.block_q, args.block_k);
  }
  if (args.cache_seqlens != nullptr && args.cache_seqlens->has_value() &&
      (*args.cache_seqlens)->defined()) {
    bind_cache_seqlens(params, query, **args.cache_seqlens);
  }
  if (!args.attn_mask.has_value() || !args.attn_mask->defined()) return;
  const at::Tensor& mask = *args.attn_mask;
  m.dtype = to_mask_dtype(mask.scalar_type());
  SAMATTN_CHECK_TYPE(mask.scalar_type() == at::kBool || mask.scalar_type() == at::kFloat ||
                         mask.scalar_type() == query.scalar_type(),
                     "attn_mask dtype must be bool, float32 or the query's dtype (",
                     c10::toString(query.scalar_type()), "), got ",
                     c10::toString(mask.scalar_type()));
  SAMATTN_CHECK_VALUE(mask.device() == query.device(), "attn_mask is on ", mask.device().str(),
                      " but query is on ", query.device().str());
  SAMATTN_CHECK_VALUE(!params.mask.is_varlen(),
                      "attn_mask is not supported with varlen (packed) inputs");
  const std::vector<int64_t> full{params.batch, params.heads_q, params.seqlen_q, params.seqlen_k};
  SAMATTN_CHECK_VALUE(mask.dim() >= 2 && mask.dim() <= 4,
                      "attn_mask must have 2 to 4 dimensions "
                      "broadcastable to (batch, heads, seq_len_q, seq_len_k) = ",
                      shape_list(full), ", got shape ", shape_list(mask.sizes()));
  // Right-aligned broadcasting, as torch does: missing leading dimensions have size 1.
  int64_t strides[4] = {0, 0, 0, 0};
  const int64_t offset = 4 - mask.dim();
  for (int64_t d = 0; d < mask.dim(); ++d) {
    const int64_t size = mask.size(d), want = full[offset + d];
    SAMATTN_CHECK_VALUE(
        size == want || size == 1, "attn_mask of shape ", shape_list(mask.sizes()),
        " is not broadcastable to (batch, heads, seq_len_q, seq_len_k) = ", shape_list(full),
        ": dimension ", d, " has size ", size, ", expected ", want, " or 1");
    strides[offset + d] = (size == 1) ? 0 : mask.stride(d);
  }
  m.data = mask.data_ptr();
  m.batch_stride = strides[0];
  m.head_stride = strides[1];
  m.row_stride = strides[2];
  m.col_stride = strides[3];
}

AttentionParams make_varlen_params(const at::Tensor& query, const at::Tensor& key,
                                   const at::Tensor& value, const at::Tensor& cu_seqlens_q,
                                   const at::Tensor& cu_seqlens_k, int64_t max_seqlen_q,
                                   int64_t max_seqlen_k, const ForwardOptions& options) {
  check_packed(query, "query");
  check_packed(key, "key");
  check_packed(value, "value");
  SAMATTN_CHECK_VALUE(max_seqlen_q >= 0 && max_seqlen_k >= 0,
                      "max_seqlen_q and max_seqlen_k must be >= 0, got ", max_seqlen_q, " and ",
                      max_seqlen_k);
  SAMATTN_CHECK_VALUE(key.size(0) == value.size(0), "value tokens (", value.size(0),
                      ") must equal key tokens (", key.size(0), ")");
  SAMATTN_CHECK_VALUE(cu_seqlens_q.dim() == 1 && cu_seqlens_k.dim() == 1 &&
                          cu_seqlens_q.size(0) == cu_seqlens_k.size(0),
                      "cu_seqlens_q and cu_seqlens_k must be 1-D with the same length (batch + 1), "
                      "got shapes ",
                      shape_list(cu_seqlens_q.sizes()), " and ", shape_list(cu_seqlens_k.sizes()));
  check_cu_seqlens(cu_seqlens_q, query, query.size(0), max_seqlen_q, "cu_seqlens_q",
                   "max_seqlen_q");
  check_cu_seqlens(cu_seqlens_k, query, key.size(0), max_seqlen_k, "cu_seqlens_k", "max_seqlen_k");
  // The 4-D checks of make_forward_params on (1, H, total, D) views: dtype, device, heads, dims.
  AttentionParams p =
      make_forward_params(query.transpose(0, 1).unsqueeze(0), key.transpose(0, 1).unsqueeze(0),
                          value.transpose(0, 1).unsqueeze(0), options);
  p.batch = cu_seqlens_q.size(0) - 1;
  p.seqlen_q = max_seqlen_q;
  p.seqlen_k = max_seqlen_k;
  p.q_strides = Strides{0, query.stride(1), query.stride(0)};
  p.k_strides = Strides{0, key.stride(1), key.stride(0)};
  p.v_strides = Strides{0, value.stride(1), value.stride(0)};
  p.mask.cu_seqlens_q = cu_seqlens_q.data_ptr<int32_t>();
  p.mask.cu_seqlens_k = cu_seqlens_k.data_ptr<int32_t>();
  p.mask.total_q = query.size(0);
  p.mask.total_k = key.size(0);
  return p;
}

}  // namespace samattn::torch_ops
