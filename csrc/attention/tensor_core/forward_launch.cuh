// Internal: the body of launch_forward, included only by the generated instantiation files.
#pragma once

#include <limits>

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "attention/tensor_core/forward_kernel.cuh"
#include "attention/tensor_core/forward_launch.h"
#include "common/check.h"
#include "common/cuda_check.h"
#include "common/device.h"

namespace samattn::tensor_core {

template <DType kDType>
struct ElementOf;
template <>
struct ElementOf<DType::kFloat32> {
  using type = float;  // computed in TF32
};
template <>
struct ElementOf<DType::kFloat16> {
  using type = __half;
};
template <>
struct ElementOf<DType::kBFloat16> {
  using type = __nv_bfloat16;
};

template <DType kDType, int kHeadDim>
void launch_forward(const detail::ForwardKernelParams& params, cudaStream_t stream) {
  using Element = typename ElementOf<kDType>::type;
  using Cfg = ForwardConfig<kHeadDim, int(sizeof(Element))>;
  const int64_t m_blocks = (params.seqlen_q + Cfg::kBlockM - 1) / Cfg::kBlockM;
  const int64_t blocks = m_blocks * params.batch * params.heads_q;
  SAMATTN_CHECK(blocks <= std::numeric_limits<int>::max(), "batch * heads_q * ceil(seqlen_q / ",
                Cfg::kBlockM, ") = ", blocks, " exceeds the grid limit of ",
                std::numeric_limits<int>::max(), " blocks");
  const auto kernel = forward_kernel<Element, kHeadDim>;
  // Beyond 48 KiB a block must opt in; supports() has checked the device's limit.
  detail::allow_dynamic_smem(reinterpret_cast<const void*>(kernel), Cfg::kSmemBytes);
  kernel<<<static_cast<unsigned>(blocks), Cfg::kThreads, Cfg::kSmemBytes, stream>>>(params);
  SAMATTN_CHECK_LAUNCH();
}

}  // namespace samattn::tensor_core
