// The backward's preprocess kernel (D = rowsum(dout * out)) for every dtype: small, so one
// translation unit holds all four.
#include <cstdint>
#include <limits>

#include "attention/simt/backward_launch.h"
#include "attention/simt/backward_preprocess.cuh"
#include "attention/simt/forward_launch.cuh"
#include "common/check.h"
#include "common/cuda_check.h"

namespace samattn::simt {

namespace {

// Whether out and dout rows are whole, 16-byte aligned chunks of columns (the vector kernel).
template <typename Element>
bool rows_are_vectors(const detail::BackwardKernelParams& p) {
  constexpr int64_t kVec = kPreprocessVectorBytes / sizeof(Element);
  const detail::ForwardKernelParams& f = p.fwd;
  const auto aligned = [](const void* pointer) {
    return reinterpret_cast<uintptr_t>(pointer) % kPreprocessVectorBytes == 0;
  };
  const int64_t strides[] = {f.o_batch_stride,  f.o_head_stride,  f.o_row_stride,
                             p.do_batch_stride, p.do_head_stride, p.do_row_stride};
  for (int64_t stride : strides) {
    if (stride % kVec != 0) return false;
  }
  return f.head_dim_v % kVec == 0 && aligned(f.out) && aligned(p.dout);
}

template <typename Element, int kLanesPerRow>
void launch_vector(const detail::BackwardKernelParams& params, int64_t rows, cudaStream_t stream) {
  constexpr int64_t kRowsPerBlock = kPreprocessRowsPerBlock * (32 / kLanesPerRow);
  const int64_t blocks = (rows + kRowsPerBlock - 1) / kRowsPerBlock;
  backward_preprocess_vector_kernel<Element, kLanesPerRow>
      <<<static_cast<unsigned>(blocks), kPreprocessThreads, 0, stream>>>(params);
  SAMATTN_CHECK_LAUNCH();
}

}  // namespace

template <DType kDType>
void launch_backward_preprocess(const detail::BackwardKernelParams& params, cudaStream_t stream) {
  using Element = typename detail::ElementOf<kDType>::type;
  const int64_t rows = preprocess_rows(params.fwd);
  const int64_t blocks = (rows + kPreprocessRowsPerBlock - 1) / kPreprocessRowsPerBlock;
  SAMATTN_CHECK(blocks <= std::numeric_limits<int>::max(), "batch * heads_q * seqlen_q = ", rows,
                " query rows exceed the preprocess grid limit");
  // The vector kernel for 16-bit elements (the tensor-core paths' inputs); fp32 and fp64 keep
  // the general kernel (their SIMT backwards spend their time elsewhere).
  if constexpr (sizeof(Element) == 2) {
    if (rows_are_vectors<Element>(params)) {
      // Lanes per row: the row's 16-byte chunks rounded up to a power of two, 4 to 32.
      const int64_t chunks =
          params.fwd.head_dim_v / (kPreprocessVectorBytes / static_cast<int64_t>(sizeof(Element)));
      if (chunks <= 4) return launch_vector<Element, 4>(params, rows, stream);
      if (chunks <= 8) return launch_vector<Element, 8>(params, rows, stream);
      if (chunks <= 16) return launch_vector<Element, 16>(params, rows, stream);
      return launch_vector<Element, 32>(params, rows, stream);
    }
  }
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
