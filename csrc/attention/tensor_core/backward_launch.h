// Internal: launchers of the tensor-core backward (fp16/bf16), one instantiation per (dtype,
// head dim), defined in generated files so each compiles in its own translation unit; and the
// host-side query of whether a call can take this path.
#pragma once

#include <cuda_runtime_api.h>

#include "attention/backward_kernel_params.h"
#include "samattn/attention.h"
#include "samattn/types.h"

namespace samattn::tensor_core {

// dK/dV (and, with params.dq_accum set, dQ through fp32 atomics plus a conversion kernel;
// otherwise the deterministic dQ kernel). D must already be in params.delta.
template <DType kDType, int kHeadDim>
void launch_backward(const detail::BackwardKernelParams& params, cudaStream_t stream);

// The dQ part of launch_backward alone, after a dK/dV kernel that ran elsewhere (the Hopper
// backward): with params.dq_accum set (and filled), the kernel that scales and rounds it into
// dq; otherwise the deterministic dQ kernel. D must already be in params.delta.
template <DType kDType, int kHeadDim>
void launch_backward_dq(const detail::BackwardKernelParams& params, cudaStream_t stream);

// Whether the dtype and head dims have an instantiation (no device query): decides whether the
// workspace holds the fp32 dQ accumulator.
bool backward_has_kernel(const AttentionParams& params);

// Whether the tensor-core backward can run `params` (already validated) on the current device;
// otherwise the message says why. Checks everything the forward's supports() does, the head
// dims of the backward, its shared memory and the 16-byte alignment of dout, dq, dk and dv.
Status backward_supports(const AttentionBackwardParams& params);

// Picks the instantiation for (dtype, head dim) and launches it. The caller has checked
// backward_supports() and run the D preprocess.
void dispatch_backward(DType dtype, const detail::BackwardKernelParams& params,
                       cudaStream_t stream);

}  // namespace samattn::tensor_core
