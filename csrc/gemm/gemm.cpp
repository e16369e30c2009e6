// gemm() and softmax(): validation, then the kernel choice. fp16/bf16 (and float32 with
// allow_tf32) run the sm_90a wgmma/TMA kernels on Hopper when the layout suits TMA; every
// other call runs the CUDA-core kernel, which handles any strides (float32 therefore stays
// IEEE unless the caller opts in to TF32).
#include "samattn/gemm.h"
#include "common/check.h"
#include "common/device.h"
#include "gemm/gemm_internal.h"

namespace samattn {
namespace {

bool use_sm90(const GemmParams& p) {
#ifdef SAMATTN_HAVE_SM90
  const detail::DeviceInfo& info = detail::current_device_info();
  return info.major == 9 && info.minor == 0 && detail::sm90_gemm_supports(p);
#else
  (void)p;
  return false;
#endif
}

}  // namespace

const char* selected_gemm_kernel(const GemmParams& params) {
  const Status status = can_implement_gemm(params);
  if (!status.ok()) throw Error(status.message());
  if (use_sm90(params)) return "sm90_wgmma";
  return params.dtype == DType::kFloat64 ? "simt_fp64" : "simt";
}

void gemm(const GemmParams& params, cudaStream_t stream) {
  const Status status = can_implement_gemm(params);
  if (!status.ok()) throw Error(status.message());
#ifdef SAMATTN_HAVE_SM90
  if (use_sm90(params)) return detail::launch_sm90_gemm(params, stream);
#endif
  detail::launch_simt_gemm(params, stream);
}

void softmax(const SoftmaxParams& params, cudaStream_t stream) {
  const Status status = can_implement_softmax(params);
  if (!status.ok()) throw Error(status.message());
  detail::launch_softmax(params, stream);
}

}  // namespace samattn
