// Internal: the body of the tensor-core launch_backward, included only by the generated
// instantiation files.
#pragma once

#include <algorithm>
#include <limits>

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "attention/tensor_core/backward_kernel.cuh"
#include "attention/tensor_core/backward_launch.h"
#include "common/check.h"
#include "common/cuda_check.h"
#include "common/device.h"
#include "common/element_of.cuh"

namespace samattn::tensor_core {

template <DType kDType, int kHeadDim>
void launch_backward_dq(const detail::BackwardKernelParams& params, cudaStream_t stream) {
  using Element = typename detail::ElementOf<kDType>::type;
  using Cfg = BackwardConfig<kHeadDim>;
  const detail::ForwardKernelParams& f = params.fwd;
  const bool atomic_dq = params.dq_accum != nullptr;
  const int64_t dq_elements = f.batch * f.heads_q * f.seqlen_q * kHeadDim;
  if (f.seqlen_q == 0) return;
  if (atomic_dq) {
    const int64_t wanted = (dq_elements + kConvertThreads - 1) / kConvertThreads;
    // A grid-stride loop: enough blocks to fill the device several times over.
    const int64_t cap = int64_t{32} * detail::current_device_info().multiprocessors;
    backward_dq_convert_kernel<Element>
        <<<static_cast<unsigned>(std::max<int64_t>(1, std::min(wanted, cap))), kConvertThreads, 0,
           stream>>>(params);
    SAMATTN_CHECK_LAUNCH();
  } else {
    const auto kernel = backward_dq_kernel<Element, kHeadDim>;
    detail::allow_dynamic_smem(reinterpret_cast<const void*>(kernel), Cfg::kSmemBytes);
    kernel<<<detail::query_block_grid(f, Cfg::kBlockM), Cfg::kThreads, Cfg::kSmemBytes, stream>>>(
        params);
    SAMATTN_CHECK_LAUNCH();
  }
}

template <DType kDType, int kHeadDim>
void launch_backward(const detail::BackwardKernelParams& params, cudaStream_t stream) {
  using Element = typename detail::ElementOf<kDType>::type;
  using Cfg = BackwardConfig<kHeadDim>;
  const detail::ForwardKernelParams& f = params.fwd;
  const bool atomic_dq = params.dq_accum != nullptr;
  const int64_t dq_elements = f.batch * f.heads_q * f.seqlen_q * kHeadDim;
  if (atomic_dq && dq_elements > 0) {
    SAMATTN_CUDA_CHECK(cudaMemsetAsync(params.dq_accum, 0, dq_elements * sizeof(float), stream));
  }
  if (f.kept_keys > 0) {
    const int64_t n_blocks = (f.kept_keys + Cfg::kBlockN - 1) / Cfg::kBlockN;
    const int64_t blocks = n_blocks * f.batch * params.heads_kv;
    SAMATTN_CHECK(blocks <= std::numeric_limits<int>::max(), "batch * heads_kv * ceil(kept keys / ",
                  Cfg::kBlockN, ") = ", blocks, " exceeds the grid limit of ",
                  std::numeric_limits<int>::max(), " blocks");
    const auto kernel = atomic_dq ? backward_dkdv_kernel<Element, kHeadDim, true>
                                  : backward_dkdv_kernel<Element, kHeadDim, false>;
    // Beyond 48 KiB a block must opt in; backward_supports() has checked the device's limit.
    detail::allow_dynamic_smem(reinterpret_cast<const void*>(kernel), Cfg::kSmemBytes);
    kernel<<<static_cast<unsigned>(blocks), Cfg::kThreads, Cfg::kSmemBytes, stream>>>(params);
    SAMATTN_CHECK_LAUNCH();
  }
  launch_backward_dq<kDType, kHeadDim>(params, stream);
}

}  // namespace samattn::tensor_core
