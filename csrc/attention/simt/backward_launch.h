// Internal: launchers of the SIMT backward. The dK/dV and dQ kernels have one instantiation per
// (dtype, head-dim bucket), defined in generated files so each compiles in its own translation
// unit; the preprocess kernel one per dtype.
#pragma once

#include <cuda_runtime_api.h>

#include "attention/backward_kernel_params.h"
#include "samattn/types.h"

namespace samattn::simt {

// D = rowsum(dout * out) into params.delta.
template <DType kDType>
void launch_backward_preprocess(const detail::BackwardKernelParams& params, cudaStream_t stream);

// dK and dV (every row, zeros included), then dQ.
template <DType kDType, int kHeadDimBucket>
void launch_backward(const detail::BackwardKernelParams& params, cudaStream_t stream);

// Picks the instantiations for (dtype, head dim) and runs the three steps on `stream`.
void dispatch_backward(DType dtype, const detail::BackwardKernelParams& params,
                       cudaStream_t stream);

}  // namespace samattn::simt
