// Internal: launchers of the tensor-core forward kernel, one instantiation per (dtype, head dim),
// defined in generated files so each compiles in its own translation unit; and the host-side
// query of whether a call can take this path.
#pragma once

#include <cuda_runtime_api.h>

#include "attention/kernel_params.h"
#include "common/device.h"
#include "samattn/attention.h"
#include "samattn/types.h"

namespace samattn::tensor_core {

template <DType kDType, int kHeadDim>
void launch_forward(const detail::ForwardKernelParams& params, cudaStream_t stream);

// Whether the tensor-core path can run `params` (already validated) on the current device;
// otherwise the message says why ("backend tensor_core does not support ..."). Checks the
// dtype, head dims, compute capability (8.0+), shared memory and 16-byte alignment.
Status supports(const AttentionParams& params);
// The same question for a given device (tests ask it for devices they do not have).
Status supports(const AttentionParams& params, const detail::DeviceInfo& device);

// Picks the instantiation for (dtype, head dim) and launches it. The caller has checked
// supports().
void dispatch_forward(DType dtype, const detail::ForwardKernelParams& params, cudaStream_t stream);

}  // namespace samattn::tensor_core
