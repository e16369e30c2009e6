#include <cstdint>
#include <string>

#include "attention/tensor_core/forward_config.h"
#include "attention/tensor_core/forward_launch.h"
#include "attention/validate.h"
#include "common/check.h"
#include "common/device.h"

namespace samattn::tensor_core {
namespace {

std::string supported_head_dims() {
  std::string list;
  for (int d : kSupportedHeadDims) list += (list.empty() ? "" : ", ") + std::to_string(d);
  return list;
}

// The kernel moves 16-byte vectors: a base pointer and every stride it steps along (those of
// dimensions longer than 1) must be multiples of 16 bytes. Returns "" or what is misaligned.
std::string misalignment(const char* name, const void* pointer, const Strides& strides,
                         int64_t row_stride, int64_t batch, int64_t heads, int64_t rows,
                         int element_bytes) {
  constexpr int64_t kAlign = 16;
  if (reinterpret_cast<uintptr_t>(pointer) % kAlign != 0) {
    return detail::concat(name, " pointer ", pointer, " is not 16-byte aligned");
  }
  const struct {
    const char* what;
    int64_t stride;
    int64_t extent;
  } steps[] = {
      {"batch", strides.batch, batch}, {"head", strides.head, heads}, {"row", row_stride, rows}};
  for (const auto& step : steps) {
    if (step.extent > 1 && step.stride * element_bytes % kAlign != 0) {
      return detail::concat(name, " ", step.what, " stride ", step.stride,
                            " elements is not a multiple of 16 bytes");
    }
  }
  return "";
}

Status unsupported(const std::string& why) {
  return Status::failure("backend tensor_core does not support " + why);
}

// What the call alone decides (dtype, head dims, mask options), before any device is queried: a
// call this path cannot take never touches the CUDA runtime (it may run where no GPU is present).
Status supports_call(const AttentionParams& p) {
  // Varlen reaches this kernel one dense sequence at a time (forward.cpp); the other mask
  // options run on the SIMT kernels until the tensor-core forward has the mask policy.
  if (p.mask.any()) {
    return unsupported(
        "attn_mask, block-sparse maps, window, sparse patterns and varlen (they run on the SIMT "
        "kernels)");
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
    return unsupported(
        detail::concat("head_dim ", p.head_dim, " (supported: ", supported_head_dims(), ")"));
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
  const int smem = forward_smem_bytes(p.head_dim, bytes);
  if (smem > device.max_smem_optin) {
    return unsupported(detail::concat("head_dim ", p.head_dim, " on this device: it needs ", smem,
                                      " bytes of shared memory per block, the device allows ",
                                      device.max_smem_optin));
  }
  const int64_t keys = detail::strided_key_count(p);
  const std::string misaligned[] = {
      misalignment("q", p.q, p.q_strides, p.q_strides.seq, p.batch, p.heads_q, p.seqlen_q, bytes),
      misalignment("k", p.k, p.k_strides, p.k_strides.seq * p.kv_stride, p.batch, p.heads_kv, keys,
                   bytes),
      misalignment("v", p.v, p.v_strides, p.v_strides.seq * p.kv_stride, p.batch, p.heads_kv, keys,
                   bytes),
      misalignment("out", p.out, p.out_strides, p.out_strides.seq, p.batch, p.heads_q, p.seqlen_q,
                   bytes)};
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
                " (supported: ", supported_head_dims(), ")");
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
