// Internal: the body of launch_forward, included only by the generated instantiation files.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "attention/tensor_core/forward_kernel.cuh"
#include "attention/tensor_core/forward_launch.h"
#include "attention/tensor_core/forward_masked_kernel.cuh"
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
  if (detail::needs_masked_kernel(params)) {
    // The masked kernel is instantiated for fp16 and bf16 (supports() keeps float32 away).
    if constexpr (kDType == DType::kFloat16 || kDType == DType::kBFloat16) {
      const auto kernel = masked_forward_kernel<Element, kHeadDim>;
      const int smem = forward_masked_smem_bytes(kHeadDim, int(sizeof(Element)),
                                                 detail::forward_needs_mask_tile(params));
      // The opt-in is set once per device (allow_dynamic_smem caches it): to the size with the
      // mask tile where the device has it, else without (supports() sent no tile call then).
      const int with_tile = forward_masked_smem_bytes(kHeadDim, int(sizeof(Element)), true);
      detail::allow_dynamic_smem(
          reinterpret_cast<const void*>(kernel),
          with_tile <= detail::current_device_info().max_smem_optin ? with_tile : smem);
      kernel<<<blocks, Cfg::kThreads, smem, stream>>>(params);
      SAMATTN_CHECK_LAUNCH();
    } else {
      SAMATTN_CHECK(false,
                    "backend tensor_core runs masks, varlen and sparse patterns in float16 "
                    "and bfloat16 only, got dtype ",
                    dtype_name(kDType));
    }
    return;
  }
  const auto kernel = forward_kernel<Element, kHeadDim>;
  // Beyond 48 KiB a block must opt in; supports() has checked the device's limit.
  detail::allow_dynamic_smem(reinterpret_cast<const void*>(kernel), Cfg::kSmemBytes);
  kernel<<<blocks, Cfg::kThreads, Cfg::kSmemBytes, stream>>>(params);
  SAMATTN_CHECK_LAUNCH();
}

}  // namespace samattn::tensor_core
