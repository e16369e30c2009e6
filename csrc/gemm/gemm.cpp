// gemm() and softmax(): validation, then the kernel choice. kAuto runs the sm_90a wgmma/TMA
// kernels on Hopper when the dtype and layout suit them, else the sm80 mma.sync kernel on
// compute capability 8.0+ for the tensor-core dtypes (float16/bfloat16, float32 with
// allow_tf32), else the CUDA-core kernels, which handle every dtype and stride (float32
// therefore stays IEEE unless the caller opts in to TF32).
#include "samattn/gemm.h"
#include "common/check.h"
#include "common/device.h"
#include "gemm/gemm_internal.h"

namespace samattn {
namespace {

enum class GemmKernel { kSm90, kSm80, kSimt, kSimtFp64 };

const char* kernel_name(GemmKernel kernel) {
  switch (kernel) {
    case GemmKernel::kSm90:
      return "sm90_wgmma";
    case GemmKernel::kSm80:
      return "sm80_mma";
    case GemmKernel::kSimt:
      return "simt";
    case GemmKernel::kSimtFp64:
      return "simt_fp64";
  }
  return "unknown";
}

bool sm90_available(const GemmParams& p, const detail::DeviceInfo& info) {
#ifdef SAMATTN_HAVE_SM90
  return info.major == 9 && info.minor == 0 && detail::sm90_gemm_supports(p);
#else
  (void)p;
  (void)info;
  return false;
#endif
}

bool sm80_available(const GemmParams& p, const detail::DeviceInfo& info) {
  return info.major >= 8 && detail::sm80_gemm_supports(p);
}

// The kernel for `p` on the current device; a forced backend that cannot run throws.
GemmKernel resolve_kernel(const GemmParams& p) {
  const GemmKernel simt = p.dtype == DType::kFloat64 ? GemmKernel::kSimtFp64 : GemmKernel::kSimt;
  switch (p.backend) {
    case GemmBackend::kSimt:
      return simt;
    case GemmBackend::kSm80:
    case GemmBackend::kSm90: {
      const Status status = detail::forced_gemm_backend_status(p);
      if (!status.ok()) throw Error(status.message());
      return p.backend == GemmBackend::kSm80 ? GemmKernel::kSm80 : GemmKernel::kSm90;
    }
    case GemmBackend::kAuto:
      break;
  }
  const detail::DeviceInfo& info = detail::current_device_info();
  if (sm90_available(p, info)) return GemmKernel::kSm90;
  if (sm80_available(p, info)) return GemmKernel::kSm80;
  return simt;
}

}  // namespace

namespace detail {

Status forced_gemm_backend_status(const GemmParams& p) {
  if (p.backend != GemmBackend::kSm80 && p.backend != GemmBackend::kSm90) {
    return Status::success();
  }
  const char* name = gemm_backend_name(p.backend);
  auto fail = [&](const std::string& why) {
    return Status::failure(concat("samattn: backend ", name, " cannot run this GEMM: ", why));
  };
  const DeviceInfo* info = nullptr;
  try {
    info = &current_device_info();
  } catch (const Error& error) {
    return fail(concat("it needs a CUDA device (", error.what(), ")"));
  }
  const int major = info->major, minor = info->minor;
  if (p.backend == GemmBackend::kSm80) {
    if (major < 8) {
      return fail(concat("it needs compute capability 8.0 or newer, device ", info->index, " is ",
                         major, ".", minor));
    }
    if (!sm80_gemm_supports(p)) {
      return fail(concat("it needs m, n, k < 2^31 and at most 65535 batches, got m ", p.m, ", n ",
                         p.n, ", k ", p.k, ", batch ", p.batch));
    }
    return Status::success();
  }
#ifdef SAMATTN_HAVE_SM90
  if (major != 9 || minor != 0) {
    return fail(
        concat("it needs compute capability 9.0, device ", info->index, " is ", major, ".", minor));
  }
  if (!sm90_gemm_supports(p)) {
    return fail(
        "it needs a unit stride in each of A, B and C (TF32: A and B k-major), 16-byte aligned "
        "pointers, leading and batch strides (nonzero batch strides when batched), contiguous "
        "extents that are multiples of 16 bytes and sizes below 2^31");
  }
  return Status::success();
#else
  return fail(
      "this build has no sm_90a kernels (configure with CuTe headers, "
      "SAMATTN_ENABLE_SM90=ON)");
#endif
}

}  // namespace detail

const char* gemm_backend_name(GemmBackend backend) {
  switch (backend) {
    case GemmBackend::kAuto:
      return "auto";
    case GemmBackend::kSimt:
      return "simt";
    case GemmBackend::kSm80:
      return "sm80";
    case GemmBackend::kSm90:
      return "sm90";
  }
  return "unknown";
}

const char* selected_gemm_kernel(const GemmParams& params) {
  const Status status = can_implement_gemm(params);
  if (!status.ok()) throw Error(status.message());
  return kernel_name(resolve_kernel(params));
}

void gemm(const GemmParams& params, cudaStream_t stream) {
  const Status status = can_implement_gemm(params);
  if (!status.ok()) throw Error(status.message());
  switch (resolve_kernel(params)) {
    case GemmKernel::kSm90:
#ifdef SAMATTN_HAVE_SM90
      return detail::launch_sm90_gemm(params, stream);
#else
      break;  // resolve_kernel never picks it without the sm_90a kernels
#endif
    case GemmKernel::kSm80:
      return detail::launch_sm80_gemm(params, stream);
    case GemmKernel::kSimt:
    case GemmKernel::kSimtFp64:
      return detail::launch_simt_gemm(params, stream);
  }
}

void softmax(const SoftmaxParams& params, cudaStream_t stream) {
  const Status status = can_implement_softmax(params);
  if (!status.ok()) throw Error(status.message());
  detail::launch_softmax(params, stream);
}

}  // namespace samattn
