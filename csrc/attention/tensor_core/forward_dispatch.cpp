#include <cstdint>
#include <string>

#include "attention/alignment.h"
#include "attention/tensor_core/forward_config.h"
#include "attention/tensor_core/forward_launch.h"
#include "attention/validate.h"
#include "common/check.h"
#include "common/device.h"

namespace samattn::tensor_core {
namespace {

Status unsupported(const std::string& why) {
  return Status::failure("backend tensor_core does not support " + why);
}

// Whether the masked kernel needs its per-element mask tile (tensor_core/forward_config.h):
// detail::forward_needs_mask_tile on the call's options (the fixed pattern alone is masked in
// registers).
bool wants_mask_tile(const AttentionParams& p) {
  const bool map_or_mask = p.mask.has_block_map() || p.mask.has_element_mask();
  const bool pattern_needs_tile =
      p.mask.pattern != SparsePattern::kNone && p.mask.pattern != SparsePattern::kFixed;
  return map_or_mask || pattern_needs_tile;
}

// What the call alone decides (dtype, head dims, mask options), before any device is queried: a
// call this path cannot take never touches the CUDA runtime (it may run where no GPU is present).
Status supports_call(const AttentionParams& p) {
  if (p.mask.any()) {
    // Masks, varlen and sparse patterns run on the masked kernel (forward_masked_kernel.cuh).
    if (p.dtype != DType::kFloat16 && p.dtype != DType::kBFloat16) {
      return unsupported(
          detail::concat("attn_mask, block-sparse maps, window, sparse patterns "
                         "and varlen in dtype ",
                         dtype_name(p.dtype), " (supported: float16, bfloat16)"));
    }
    if (p.seqlen_q >= kMaxMaskedLength || p.seqlen_k >= kMaxMaskedLength) {
      return unsupported(detail::concat("masks with seqlen_q ", p.seqlen_q, " and seqlen_k ",
                                        p.seqlen_k, " (both must be below 2^30)"));
    }
  }
  if (p.dtype == DType::kFloat32 && !p.allow_tf32) {
    return unsupported("dtype float32 without allow_tf32 (it would round the inputs to TF32)");
  }
  if (p.dtype != DType::kFloat16 && p.dtype != DType::kBFloat16 && p.dtype != DType::kFloat32) {
    return unsupported(detail::concat("dtype ", dtype_name(p.dtype),
                                      " (supported: float16, bfloat16, float32 with allow_tf32)"));
  }
  if (p.head_dim != p.head_dim_v) {
    return unsupported(detail::concat("head_dim ", p.head_dim, " with head_dim_v ", p.head_dim_v,
                                      " (they must be equal)"));
  }
  if (!is_supported_head_dim(p.head_dim)) {
    return unsupported(detail::concat(
        "head_dim ", p.head_dim, " (supported: ", detail::comma_list(kSupportedHeadDims), ")"));
  }
  return Status::success();
}

}  // namespace

Status supports(const AttentionParams& p) {
  const Status call = supports_call(p);
  return call.ok() ? supports(p, detail::current_device_info()) : call;
}

Status supports(const AttentionParams& p, const detail::DeviceInfo& device) {
  if (const Status call = supports_call(p); !call.ok()) return call;
  if (device.major < 8) {
    return unsupported(detail::concat("compute capability ", device.major, ".", device.minor,
                                      " (needs 8.0 or newer)"));
  }
  const int bytes = dtype_size(p.dtype);
  const int smem = p.mask.any() ? forward_masked_smem_bytes(p.head_dim, bytes, wants_mask_tile(p))
                                : forward_smem_bytes(p.head_dim, bytes);
  if (smem > device.max_smem_optin) {
    return unsupported(detail::concat("head_dim ", p.head_dim, " on this device: it needs ", smem,
                                      " bytes of shared memory per block, the device allows ",
                                      device.max_smem_optin));
  }
  const int64_t keys = detail::strided_key_count(p);
  // Varlen sequences start at any physical row of k and v.
  const int64_t kv_rows = p.mask.is_varlen() ? 1 : p.kv_stride;
  // A paged cache's batch stride steps between its pages, each of page_size rows.
  const bool paged = p.mask.is_paged();
  const int64_t kv_batches = paged ? p.mask.num_pages : p.batch;
  const int64_t kv_span = paged ? p.mask.page_size : keys * p.kv_stride / kv_rows;
  const std::string misaligned[] = {
      detail::misalignment("q", p.q, p.q_strides, p.q_strides.seq, p.batch, p.heads_q, p.seqlen_q,
                           bytes),
      detail::misalignment("k", p.k, p.k_strides, p.k_strides.seq * kv_rows, kv_batches, p.heads_kv,
                           kv_span, bytes),
      detail::misalignment("v", p.v, p.v_strides, p.v_strides.seq * kv_rows, kv_batches, p.heads_kv,
                           kv_span, bytes),
      detail::misalignment("out", p.out, p.out_strides, p.out_strides.seq, p.batch, p.heads_q,
                           p.seqlen_q, bytes)};
  for (const std::string& why : misaligned) {
    if (!why.empty()) return unsupported(why);
  }
  return Status::success();
}

namespace {

template <DType kDType>
void dispatch_head_dim(const detail::ForwardKernelParams& params, cudaStream_t stream) {
  switch (params.head_dim) {
    case 32:
      return launch_forward<kDType, 32>(params, stream);
    case 64:
      return launch_forward<kDType, 64>(params, stream);
    case 96:
      return launch_forward<kDType, 96>(params, stream);
    case 128:
      return launch_forward<kDType, 128>(params, stream);
    case 192:
      return launch_forward<kDType, 192>(params, stream);
    case 256:
      return launch_forward<kDType, 256>(params, stream);
  }
  SAMATTN_CHECK(false, "backend tensor_core does not support head_dim ", params.head_dim,
                " (supported: ", detail::comma_list(kSupportedHeadDims), ")");
}

}  // namespace

void dispatch_forward(DType dtype, const detail::ForwardKernelParams& params, cudaStream_t stream) {
  switch (dtype) {
    case DType::kFloat16:
      return dispatch_head_dim<DType::kFloat16>(params, stream);
    case DType::kBFloat16:
      return dispatch_head_dim<DType::kBFloat16>(params, stream);
    case DType::kFloat32:  // supports() admitted it only with allow_tf32
      return dispatch_head_dim<DType::kFloat32>(params, stream);
    default:
      break;
  }
  SAMATTN_CHECK(false, "backend tensor_core does not support dtype ", dtype_name(dtype),
                " (supported: float16, bfloat16, float32 with allow_tf32)");
}

}  // namespace samattn::tensor_core
