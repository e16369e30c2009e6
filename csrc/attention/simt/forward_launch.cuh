// Internal: the body of launch_forward, included only by the generated instantiation files.
#pragma once

#include <limits>

#include "attention/simt/forward_kernel.cuh"
#include "attention/simt/forward_launch.h"
#include "common/check.h"
#include "common/cuda_check.h"

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

template <DType kDType, int kHeadDimBucket>
void launch_forward(const detail::ForwardKernelParams& params, cudaStream_t stream) {
  using Element = typename ElementOf<kDType>::type;
  using Cfg = ForwardConfig<typename AccumulatorOf<Element>::type, kHeadDimBucket>;
  const int64_t m_blocks = (params.seqlen_q + Cfg::kBlockM - 1) / Cfg::kBlockM;
  const int64_t blocks = m_blocks * params.batch * params.heads_q;
  SAMATTN_CHECK(blocks <= std::numeric_limits<int>::max(), "batch * heads_q * ceil(seqlen_q / ",
                Cfg::kBlockM, ") = ", blocks, " exceeds the grid limit of ",
                std::numeric_limits<int>::max(), " blocks");
  forward_kernel<Element, kHeadDimBucket>
      <<<static_cast<unsigned>(blocks), Cfg::kThreads, 0, stream>>>(params);
  SAMATTN_CHECK_LAUNCH();
}

}  // namespace samattn::simt
