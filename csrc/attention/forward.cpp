// attention_forward: validate, derive the kernel parameters once, pick a backend, launch.
#include <cstdlib>
#include <cstring>

#include "attention/hopper/forward_launch.h"
#include "attention/kernel_params.h"
#include "attention/simt/forward_launch.h"
#include "attention/tensor_core/forward_launch.h"
#include "attention/validate.h"
#include "attention/varlen.h"
#include "common/check.h"
#include "samattn/attention.h"

namespace samattn {
namespace {

// Read on every call, so tests and users can flip it at run time.
bool simt_forced_by_environment() {
  const char* value = std::getenv("SAMATTN_FORCE_SIMT");
  return value != nullptr && std::strcmp(value, "1") == 0;
}

}  // namespace

Backend select_backend(const AttentionParams& params) {
  if (params.backend == Backend::kSimt || simt_forced_by_environment()) return Backend::kSimt;
  // Mask options (attn_mask, window, patterns, block-sparse) are implemented by the SIMT kernels
  // alone so far: they go there whatever backend was asked for.
  if (params.mask.any()) return Backend::kSimt;
  if (params.backend == Backend::kHopper) {
    const Status hopper = hopper::supports(params);
    SAMATTN_CHECK(hopper.ok(), hopper.message());
    return Backend::kHopper;
  }
  if (params.backend == Backend::kAuto && hopper::supports(params).ok()) return Backend::kHopper;
  const Status tensor_core = tensor_core::supports(params);
  if (params.backend == Backend::kTensorCore) {
    SAMATTN_CHECK(tensor_core.ok(), tensor_core.message());
    return Backend::kTensorCore;
  }
  return tensor_core.ok() ? Backend::kTensorCore : Backend::kSimt;
}

namespace {

void launch_forward(const AttentionParams& params, const detail::ForwardKernelParams& kernel_params,
                    cudaStream_t stream) {
  const Backend backend = select_backend(params);
  if (backend == Backend::kHopper) {
    hopper::dispatch_forward(params.dtype, kernel_params, stream);
  } else if (backend == Backend::kTensorCore) {
    tensor_core::dispatch_forward(params.dtype, kernel_params, stream);
  } else {
    simt::dispatch_forward(params.dtype, kernel_params, stream);
  }
}

}  // namespace

void attention_forward(const AttentionParams& params, cudaStream_t stream) {
  detail::validate_forward_params(params);
  if (detail::output_rows(params) == 0) return;
  if (!params.mask.is_varlen()) {
    launch_forward(params, detail::make_forward_kernel_params(params), stream);
    return;
  }
  for (const detail::VarlenSequence& s : detail::read_varlen_sequences(params, stream)) {
    if (s.seqlen_q == 0) continue;
    const AttentionParams sub = detail::sequence_params(params, s);
    detail::ForwardKernelParams kernel_params = detail::make_forward_kernel_params(sub);
    kernel_params.lse_batch_stride = 0;
    kernel_params.lse_head_stride = params.mask.total_q;  // lse is (Hq, total_q)
    launch_forward(sub, kernel_params, stream);
  }
}

}  // namespace samattn
