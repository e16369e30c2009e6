// Host side of the Hopper backward: whether a call can take it, and the (dtype, head dim) switch.
// Compiled into the main library for every build; the launchers exist only with
// SAMATTN_HAVE_SM90.
#include <cstdint>
#include <cstdlib>
#include <string>

#include "attention/alignment.h"
#include "attention/hopper/backward_config.h"
#include "attention/hopper/backward_launch.h"
#include "attention/validate.h"
#include "common/check.h"
#include "common/device.h"

namespace samattn::hopper {
namespace {

Status unsupported(const std::string& why) {
  return Status::failure("backend hopper does not support " + why);
}

}  // namespace

bool backward_has_kernel(const AttentionParams& p) {
#ifdef SAMATTN_HAVE_SM90
  return (p.dtype == DType::kFloat16 || p.dtype == DType::kBFloat16) &&
         p.head_dim == p.head_dim_v && is_backward_head_dim(p.head_dim);
#else
  (void)p;
  return false;
#endif
}

Status backward_supports(const AttentionBackwardParams& bp) {
#ifndef SAMATTN_HAVE_SM90
  (void)bp;
  return unsupported(
      "the backward in this build: the sm_90a kernels were not compiled (no CuTe headers at "
      "configure time)");
#else
  const AttentionParams& p = bp.forward;
  if (p.mask.any()) {
    return unsupported(
        "the backward with attn_mask, block-sparse maps, window, sparse patterns or varlen (they "
        "run on the SIMT kernels)");
  }
  if (p.dtype != DType::kFloat16 && p.dtype != DType::kBFloat16) {
    return unsupported(detail::concat("the backward in dtype ", dtype_name(p.dtype),
                                      " (supported: float16, bfloat16)"));
  }
  if (p.head_dim != p.head_dim_v || !is_backward_head_dim(p.head_dim)) {
    return unsupported(detail::concat("the backward with head_dim ", p.head_dim, " and head_dim_v ",
                                      p.head_dim_v, " (supported: equal, one of ",
                                      detail::comma_list(kBackwardHeadDims), ")"));
  }
  const detail::DeviceInfo& device = detail::current_device_info();
  if (device.major != 9 || device.minor != 0) {
    return unsupported(detail::concat("compute capability ", device.major, ".", device.minor,
                                      " (needs 9.0: wgmma and TMA are sm_90a instructions)"));
  }
  const int bytes = dtype_size(p.dtype);
  const int smem = backward_smem_bytes(p.head_dim, bytes);
  if (smem > device.max_smem_optin) {
    return unsupported(detail::concat(
        "the backward with head_dim ", p.head_dim, " on this device: it needs ", smem,
        " bytes of shared memory per block, the device allows ", device.max_smem_optin));
  }
  // TMA coordinates and extents are 32-bit.
  constexpr int64_t kMaxExtent = (int64_t{1} << 31) - 1;
  if (p.seqlen_q > kMaxExtent || p.seqlen_k > kMaxExtent || p.batch > kMaxExtent ||
      p.heads_q > kMaxExtent) {
    return unsupported(
        detail::concat("extents above ", kMaxExtent, " (TMA coordinates are 32-bit)"));
  }
  // q, k, v and dout are read through TMA descriptors (and, deterministic, by the sm80 dQ
  // kernel's 16-byte copies); the kept keys' rows of dk and dv are written through TMA
  // descriptors too, the rows between them (kv_stride > 1) zeroed with 4-byte stores; dq is
  // written by the conversion or the deterministic kernel with 16-byte stores. With no kept keys
  // nothing of k and v is read, with no query rows nothing of q and dout.
  const int64_t keys = detail::strided_key_count(p);
  const bool rows = p.seqlen_q > 0;
  const std::string misaligned[] = {
      !rows ? ""
            : detail::misalignment("q", p.q, p.q_strides, p.q_strides.seq, p.batch, p.heads_q,
                                   p.seqlen_q, bytes, detail::StrideRule::kTma),
      keys == 0 ? ""
                : detail::misalignment("k", p.k, p.k_strides, p.k_strides.seq * p.kv_stride,
                                       p.batch, p.heads_kv, keys, bytes, detail::StrideRule::kTma),
      keys == 0 ? ""
                : detail::misalignment("v", p.v, p.v_strides, p.v_strides.seq * p.kv_stride,
                                       p.batch, p.heads_kv, keys, bytes, detail::StrideRule::kTma),
      !rows ? ""
            : detail::misalignment("dout", bp.dout, bp.dout_strides, bp.dout_strides.seq, p.batch,
                                   p.heads_q, p.seqlen_q, bytes, detail::StrideRule::kTma),
      !rows ? ""
            : detail::misalignment("dq", bp.dq, bp.dq_strides, bp.dq_strides.seq, p.batch,
                                   p.heads_q, p.seqlen_q, bytes),
      detail::misalignment("dk", bp.dk, bp.dk_strides, bp.dk_strides.seq, p.batch, p.heads_kv,
                           p.seqlen_k, bytes),
      detail::misalignment("dv", bp.dv, bp.dv_strides, bp.dv_strides.seq, p.batch, p.heads_kv,
                           p.seqlen_k, bytes),
      keys == 0 ? ""
                : detail::misalignment("dk", bp.dk, bp.dk_strides, bp.dk_strides.seq * p.kv_stride,
                                       p.batch, p.heads_kv, keys, bytes, detail::StrideRule::kTma),
      keys == 0 ? ""
                : detail::misalignment("dv", bp.dv, bp.dv_strides, bp.dv_strides.seq * p.kv_stride,
                                       p.batch, p.heads_kv, keys, bytes, detail::StrideRule::kTma)};
  for (const std::string& why : misaligned) {
    if (!why.empty()) return unsupported(why);
  }
  return Status::success();
#endif
}

BackwardVariant backward_variant_from_environment(DType dtype, int64_t head_dim) {
  const char* value = std::getenv("SAMATTN_HOPPER_BWD_VARIANT");
  const std::string text = value == nullptr ? "" : value;
  if (text.empty() || text == "default") return BackwardVariant::kDefault;
  SAMATTN_CHECK(
      text == "split_dq" || text == "alternate_dq",
      "SAMATTN_HOPPER_BWD_VARIANT must be unset, default, split_dq or alternate_dq; got '", text,
      "'");
#ifndef SAMATTN_HOPPER_TUNING
  SAMATTN_CHECK(false, "SAMATTN_HOPPER_BWD_VARIANT=", text,
                " needs a build configured with -DSAMATTN_HOPPER_TUNING=ON (this build has only "
                "the default kernel)");
#endif
  SAMATTN_CHECK(dtype == DType::kBFloat16, "SAMATTN_HOPPER_BWD_VARIANT=", text,
                " is built for bfloat16 only; got ", dtype_name(dtype), " head_dim ", head_dim);
  SAMATTN_CHECK(backward_has_variants(head_dim), "SAMATTN_HOPPER_BWD_VARIANT=", text,
                " has no kernel at head_dim ", head_dim,
                ": only head dims 64 and 128 have both dQ schedules (96 takes turns, the column "
                "split above 128 splits dQ)");
  return text == "split_dq" ? BackwardVariant::kSplitDq : BackwardVariant::kAlternateDq;
}

#ifdef SAMATTN_HAVE_SM90
namespace {

template <DType kDType>
void dispatch_head_dim(const detail::BackwardKernelParams& params, cudaStream_t stream) {
  const BackwardVariant variant = backward_variant_from_environment(kDType, params.fwd.head_dim);
  switch (params.fwd.head_dim) {
    case 64:
      return launch_backward<kDType, 64>(params, variant, stream);
    case 96:
      return launch_backward<kDType, 96>(params, variant, stream);
    case 128:
      return launch_backward<kDType, 128>(params, variant, stream);
    case 192:
      return launch_backward<kDType, 192>(params, variant, stream);
    case 256:
      return launch_backward<kDType, 256>(params, variant, stream);
  }
  SAMATTN_CHECK(false, "backend hopper does not support the backward with head_dim ",
                params.fwd.head_dim, " (supported: ", detail::comma_list(kBackwardHeadDims), ")");
}

}  // namespace
#endif

void dispatch_backward(DType dtype, const detail::BackwardKernelParams& params,
                       cudaStream_t stream) {
#ifdef SAMATTN_HAVE_SM90
  switch (dtype) {
    case DType::kFloat16:
      return dispatch_head_dim<DType::kFloat16>(params, stream);
    case DType::kBFloat16:
      return dispatch_head_dim<DType::kBFloat16>(params, stream);
    default:
      break;
  }
  SAMATTN_CHECK(false, "backend hopper does not support the backward in dtype ", dtype_name(dtype),
                " (supported: float16, bfloat16)");
#else
  (void)dtype;
  (void)params;
  (void)stream;
  SAMATTN_CHECK(false, "backend hopper is not available in this build (no sm_90a kernels)");
#endif
}

}  // namespace samattn::hopper
