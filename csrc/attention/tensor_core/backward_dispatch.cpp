#include <cstdint>
#include <string>

#include "attention/alignment.h"
#include "attention/tensor_core/backward_config.h"
#include "attention/tensor_core/backward_launch.h"
#include "attention/tensor_core/forward_launch.h"
#include "common/check.h"
#include "common/device.h"

namespace samattn::tensor_core {
namespace {

Status unsupported(const std::string& why) {
  return Status::failure("backend tensor_core does not support " + why);
}

}  // namespace

bool backward_has_kernel(const AttentionParams& p) {
  return (p.dtype == DType::kFloat16 || p.dtype == DType::kBFloat16) &&
         p.head_dim == p.head_dim_v && is_backward_head_dim(p.head_dim);
}

Status backward_supports(const AttentionBackwardParams& bp) {
  const AttentionParams& p = bp.forward;
  if (p.dtype != DType::kFloat16 && p.dtype != DType::kBFloat16) {
    return unsupported(detail::concat("the backward in dtype ", dtype_name(p.dtype),
                                      " (supported: float16, bfloat16)"));
  }
  if (p.head_dim != p.head_dim_v || !is_backward_head_dim(p.head_dim)) {
    return unsupported(detail::concat("the backward with head_dim ", p.head_dim, " and head_dim_v ",
                                      p.head_dim_v, " (supported: equal, one of ",
                                      detail::comma_list(kBackwardHeadDims), ")"));
  }
  if (p.mask.is_varlen() && p.kv_stride != 1) {
    return unsupported("the backward of varlen with kv_stride > 1");
  }
  // dtype, compute capability, the alignment of q, k, v and out, and mask support.
  const Status forward = supports(p);
  if (!forward.ok()) return forward;
  const detail::DeviceInfo& device = detail::current_device_info();
  const bool mask_tile =
      p.mask.pattern != SparsePattern::kNone || p.mask.has_block_map() || p.mask.has_element_mask();
  const int smem = p.mask.any() ? backward_masked_smem_bytes(p.head_dim, mask_tile)
                                : backward_smem_bytes(p.head_dim);
  if (smem > device.max_smem_optin) {
    return unsupported(detail::concat(
        "the backward with head_dim ", p.head_dim, " on this device: it needs ", smem,
        " bytes of shared memory per block, the device allows ", device.max_smem_optin));
  }
  const int bytes = dtype_size(p.dtype);
  const int64_t keys = p.seqlen_k;  // dk/dv rows are written at every physical row
  const std::string misaligned[] = {
      detail::misalignment("dout", bp.dout, bp.dout_strides, bp.dout_strides.seq, p.batch,
                           p.heads_q, p.seqlen_q, bytes),
      detail::misalignment("dq", bp.dq, bp.dq_strides, bp.dq_strides.seq, p.batch, p.heads_q,
                           p.seqlen_q, bytes),
      detail::misalignment("dk", bp.dk, bp.dk_strides, bp.dk_strides.seq, p.batch, p.heads_kv, keys,
                           bytes),
      detail::misalignment("dv", bp.dv, bp.dv_strides, bp.dv_strides.seq, p.batch, p.heads_kv, keys,
                           bytes)};
  for (const std::string& why : misaligned) {
    if (!why.empty()) return unsupported(why);
  }
  return Status::success();
}

namespace {

template <DType kDType>
void dispatch_head_dim(const detail::BackwardKernelParams& params, cudaStream_t stream) {
  switch (params.fwd.head_dim) {
    case 32:
      return launch_backward<kDType, 32>(params, stream);
    case 64:
      return launch_backward<kDType, 64>(params, stream);
    case 96:
      return launch_backward<kDType, 96>(params, stream);
    case 128:
      return launch_backward<kDType, 128>(params, stream);
    case 192:
      return launch_backward<kDType, 192>(params, stream);
    case 256:
      return launch_backward<kDType, 256>(params, stream);
  }
  SAMATTN_CHECK(false, "backend tensor_core does not support the backward with head_dim ",
                params.fwd.head_dim, " (supported: ", detail::comma_list(kBackwardHeadDims), ")");
}

}  // namespace

void dispatch_backward(DType dtype, const detail::BackwardKernelParams& params,
                       cudaStream_t stream) {
  switch (dtype) {
    case DType::kFloat16:
      return dispatch_head_dim<DType::kFloat16>(params, stream);
    case DType::kBFloat16:
      return dispatch_head_dim<DType::kBFloat16>(params, stream);
    default:
      break;
  }
  SAMATTN_CHECK(false, "backend tensor_core does not support the backward in dtype ",
                dtype_name(dtype), " (supported: float16, bfloat16)");
}

}  // namespace samattn::tensor_core
