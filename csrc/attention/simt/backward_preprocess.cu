// The backward's preprocess kernel (D = rowsum(dout * out)) for every dtype: small, so one
// translation unit holds all four.
#include <limits>

#include "attention/simt/backward_launch.h"
#include "attention/simt/backward_preprocess.cuh"
#include "attention/simt/forward_launch.cuh"
#include "common/check.h"
#include "common/cuda_check.h"

namespace samattn::simt {

template <DType kDType>
void launch_backward_preprocess(const detail::BackwardKernelParams& params, cudaStream_t stream) {
  using Element = typename detail::ElementOf<kDType>::type;
  const int64_t rows = preprocess_rows(params.fwd);
  const int64_t blocks = (rows + kPreprocessRowsPerBlock - 1) / kPreprocessRowsPerBlock;
  SAMATTN_CHECK(blocks <= std::numeric_limits<int>::max(), "batch * heads_q * seqlen_q = ", rows,
                " query rows exceed the preprocess grid limit");
  backward_preprocess_kernel<Element>
      <<<static_cast<unsigned>(blocks), kPreprocessThreads, 0, stream>>>(params);
  SAMATTN_CHECK_LAUNCH();
}

template void launch_backward_preprocess<DType::kFloat64>(const detail::BackwardKernelParams&,
                                                          cudaStream_t);
template void launch_backward_preprocess<DType::kFloat32>(const detail::BackwardKernelParams&,
                                                          cudaStream_t);
template void launch_backward_preprocess<DType::kFloat16>(const detail::BackwardKernelParams&,
                                                          cudaStream_t);
template void launch_backward_preprocess<DType::kBFloat16>(const detail::BackwardKernelParams&,
                                                           cudaStream_t);

}  // namespace samattn::simt
