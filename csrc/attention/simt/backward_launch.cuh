// Internal: the body of launch_backward, included only by the generated instantiation files.
#pragma once

#include <limits>

#include "attention/simt/backward_dkdv_kernel.cuh"
#include "attention/simt/backward_dq_kernel.cuh"
#include "attention/simt/backward_launch.h"
#include "attention/simt/forward_launch.cuh"
#include "common/check.h"
#include "common/cuda_check.h"

namespace samattn::simt {

// Grid size for key blocks of kBlockN logical keys, checked against the launch limit.
template <int kBlockN>
unsigned key_grid_blocks(const detail::BackwardKernelParams& params) {
  const int64_t n_blocks = (params.fwd.kept_keys + kBlockN - 1) / kBlockN;
  const int64_t blocks = n_blocks * params.fwd.batch * params.heads_kv;
  SAMATTN_CHECK(blocks <= std::numeric_limits<int>::max(), "batch * heads_kv * ceil(kept keys / ",
                kBlockN, ") = ", blocks, " exceeds the grid limit of ",
                std::numeric_limits<int>::max(), " blocks");
  return static_cast<unsigned>(blocks);
}

template <DType kDType, int kHeadDimBucket>
void launch_backward(const detail::BackwardKernelParams& params, cudaStream_t stream) {
  using Element = typename detail::ElementOf<kDType>::type;
  using Acc = typename AccumulatorOf<Element>::type;
  using DkDv = BackwardDkDvConfig<Acc, kHeadDimBucket>;
  using Dq = BackwardDqConfig<Acc, kHeadDimBucket>;
  // Windows, patterns and element masks run the kMasked instantiations.
  const bool masked = params.fwd.masked;
  if (params.fwd.kept_keys > 0) {
    const auto kernel = masked ? backward_dkdv_kernel<Element, kHeadDimBucket, true>
                               : backward_dkdv_kernel<Element, kHeadDimBucket, false>;
    kernel<<<key_grid_blocks<DkDv::kBlockN>(params), DkDv::kThreads, 0, stream>>>(params);
    SAMATTN_CHECK_LAUNCH();
  }
  if (params.fwd.seqlen_q > 0) {
    const auto kernel = masked ? backward_dq_kernel<Element, kHeadDimBucket, true>
                               : backward_dq_kernel<Element, kHeadDimBucket, false>;
    kernel<<<detail::query_block_grid(params.fwd, Dq::kBlockM), Dq::kThreads, 0, stream>>>(
        params);
    SAMATTN_CHECK_LAUNCH();
  }
}

}  // namespace samattn::simt
