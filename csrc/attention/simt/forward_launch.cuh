// Internal: the body of launch_forward, included only by the generated instantiation files.
#pragma once

#include <limits>

#include "attention/simt/forward_kernel.cuh"
#include "attention/simt/forward_kernel_resident.cuh"
#include "attention/simt/forward_launch.h"
#include "common/check.h"
#include "common/cuda_check.h"
#include "common/device.h"

namespace samattn::simt {

template <DType kDType>
struct ElementOf;
template <>
struct ElementOf<DType::kFloat64> {
  using type = double;
};
template <>
struct ElementOf<DType::kFloat32> {
  using type = float;
};
template <>
struct ElementOf<DType::kFloat16> {
  using type = __half;
};
template <>
struct ElementOf<DType::kBFloat16> {
  using type = __nv_bfloat16;
};

// Grid size for query blocks of kBlockM rows, checked against the launch limit.
template <int kBlockM>
unsigned grid_blocks(const detail::ForwardKernelParams& params) {
  const int64_t m_blocks = (params.seqlen_q + kBlockM - 1) / kBlockM;
  const int64_t blocks = m_blocks * params.batch * params.heads_q;
  SAMATTN_CHECK(blocks <= std::numeric_limits<int>::max(), "batch * heads_q * ceil(seqlen_q / ",
                kBlockM, ") = ", blocks, " exceeds the grid limit of ",
                std::numeric_limits<int>::max(), " blocks");
  return static_cast<unsigned>(blocks);
}

template <DType kDType, int kHeadDimBucket>
void launch_forward(const detail::ForwardKernelParams& params, cudaStream_t stream) {
  using Element = typename ElementOf<kDType>::type;
  using Acc = typename AccumulatorOf<Element>::type;
  using Resident = ResidentForwardConfig<Acc, kHeadDimBucket>;
  if constexpr (Resident::kApplies) {
    const auto kernel = resident_forward_kernel<Element, kHeadDimBucket>;
    detail::allow_dynamic_smem(reinterpret_cast<const void*>(kernel), Resident::kSmemBytes);
    kernel<<<grid_blocks<Resident::kBlockM>(params), Resident::kThreads, Resident::kSmemBytes,
             stream>>>(params);
  } else {
    using Chunked = ForwardConfig<Acc, kHeadDimBucket>;
    chunked_forward_kernel<Element, kHeadDimBucket>
        <<<grid_blocks<Chunked::kBlockM>(params), Chunked::kThreads, 0, stream>>>(params);
  }
  SAMATTN_CHECK_LAUNCH();
}

}  // namespace samattn::simt
