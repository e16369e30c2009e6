// Internal: launchers of the SIMT forward kernel, one instantiation per (dtype, head-dim bucket),
// defined in generated files so each compiles in its own translation unit.
#pragma once

#include <cuda_runtime_api.h>

#include "attention/kernel_params.h"
#include "samattn/types.h"

namespace samattn::simt {

template <DType kDType, int kHeadDimBucket>
void launch_forward(const detail::ForwardKernelParams& params, cudaStream_t stream);

// Picks the instantiation for (dtype, head dim) and launches it.
void dispatch_forward(DType dtype, const detail::ForwardKernelParams& params,
                      cudaStream_t stream);

}  // namespace samattn::simt
