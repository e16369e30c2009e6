// Internal: the body of launch_forward, included only by the generated instantiation files.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "attention/tensor_core/forward_kernel.cuh"
#include "attention/tensor_core/forward_launch.h"
#include "common/check.h"
#include "common/cuda_check.h"
#include "common/device.h"
#include "common/element_of.cuh"

namespace samattn::tensor_core {

template <DType kDType, int kHeadDim>
void launch_forward(const detail::ForwardKernelParams& params, cudaStream_t stream) {
  using Element = typename detail::ElementOf<kDType>::type;
  using Cfg = ForwardConfig<kHeadDim, int(sizeof(Element))>;
  const unsigned blocks = detail::query_block_grid(params, Cfg::kBlockM);
  const auto kernel = forward_kernel<Element, kHeadDim>;
  // Beyond 48 KiB a block must opt in; supports() has checked the device's limit.
  detail::allow_dynamic_smem(reinterpret_cast<const void*>(kernel), Cfg::kSmemBytes);
  kernel<<<blocks, Cfg::kThreads, Cfg::kSmemBytes, stream>>>(params);
  SAMATTN_CHECK_LAUNCH();
}

}  // namespace samattn::tensor_core
