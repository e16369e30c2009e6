// Internal: the body of launch_forward, included only by the generated instantiation files.
#pragma once

#include "attention/simt/forward_kernel.cuh"
#include "attention/simt/forward_kernel_resident.cuh"
#include "attention/simt/forward_launch.h"
#include "common/check.h"
#include "common/cuda_check.h"
#include "common/device.h"
#include "common/element_of.cuh"

namespace samattn::simt {

template <DType kDType, int kHeadDimBucket>
void launch_forward(const detail::ForwardKernelParams& params, cudaStream_t stream) {
  using Element = typename detail::ElementOf<kDType>::type;
  using Acc = typename AccumulatorOf<Element>::type;
  using Resident = ResidentForwardConfig<Acc, kHeadDimBucket>;
  using Chunked = ForwardConfig<Acc, kHeadDimBucket>;
  // Windows, patterns and element masks run the chunked kernel's kMasked instantiation (it
  // has room for the shared mask tile); causal and kv_stride keep the unmasked kernels.
  if (params.masked) {
    chunked_forward_kernel<Element, kHeadDimBucket, true>
        <<<detail::query_block_grid(params, Chunked::kBlockM), Chunked::kThreads, 0, stream>>>(
            params);
    SAMATTN_CHECK_LAUNCH();
    return;
  }
  if constexpr (Resident::kApplies) {
    const auto kernel = resident_forward_kernel<Element, kHeadDimBucket>;
    detail::allow_dynamic_smem(reinterpret_cast<const void*>(kernel), Resident::kSmemBytes);
    kernel<<<detail::query_block_grid(params, Resident::kBlockM), Resident::kThreads,
             Resident::kSmemBytes, stream>>>(params);
  } else {
    chunked_forward_kernel<Element, kHeadDimBucket, false>
        <<<detail::query_block_grid(params, Chunked::kBlockM), Chunked::kThreads, 0, stream>>>(
            params);
  }
  SAMATTN_CHECK_LAUNCH();
}

}  // namespace samattn::simt
