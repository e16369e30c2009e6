// Internal: the Hopper (sm_90a) attention backward: host-side support query and dispatch. The
// kernels exist only when the library is built with SAMATTN_HAVE_SM90 (CuTe headers found);
// otherwise backward_supports() says so and kAuto never picks this path.
#pragma once

#include <cstdint>

#include <cuda_runtime_api.h>

#include "attention/backward_kernel_params.h"
#include "attention/hopper/backward_config.h"
#include "samattn/attention.h"
#include "samattn/types.h"

namespace samattn::hopper {

// dK and dV with the wgmma/TMA kernel, and dQ: with params.dq_accum set (room for
// backward_dq_accum_rows rows per head), added into it by the same kernel and then scaled and
// rounded by backward_dq_convert.cuh's kernel; otherwise by the tensor-core backward's
// deterministic dQ kernel. D must already be in params.delta. One instantiation per (dtype, head
// dim), in generated files; `variant` other than kDefault only for bf16 (backward_config.h).
template <DType kDType, int kHeadDim>
void launch_backward(const detail::BackwardKernelParams& params, BackwardVariant variant,
                     cudaStream_t stream);

// The variant the environment variable SAMATTN_HOPPER_BWD_VARIANT asks for (benchmark-only):
// unset, empty or "default": kDefault; "split_dq" / "alternate_dq": kSplitDq / kAlternateDq
// (the dQ schedules of backward_config.h, whichever the head dim uses or not), built for bf16
// only and only with -DSAMATTN_HOPPER_TUNING=ON. Any other value, or a variant that is not built
// for the call, is an error naming the variable.
BackwardVariant backward_variant_from_environment(DType dtype, int64_t head_dim);

// Whether the dtype and head dims have an instantiation (no device query).
bool backward_has_kernel(const AttentionParams& params);

// Whether the Hopper backward can run `params` (already validated) on the current device;
// otherwise the message says why ("backend hopper does not support ..."). Checks the build,
// mask options, dtype, head dims, compute capability 9.0, shared memory, the TMA alignment of
// q, k, v and dout and the 16-byte alignment of out, dq, dk and dv.
Status backward_supports(const AttentionBackwardParams& params);

// Picks the instantiation for (dtype, head dim) and launches it. The caller has checked
// backward_supports() and run the D preprocess.
void dispatch_backward(DType dtype, const detail::BackwardKernelParams& params,
                       cudaStream_t stream);

}  // namespace samattn::hopper
