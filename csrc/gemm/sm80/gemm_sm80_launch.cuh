// Internal: the body of sm80::launch, included only by the generated instantiation files.
#pragma once

#include "common/check.h"
#include "common/cuda_check.h"
#include "common/device.h"
#include "common/element_of.cuh"
#include "gemm/sm80/gemm_sm80_kernel.cuh"

namespace samattn::detail::sm80 {

template <DType kDType>
void launch(const GemmArgs& args, int64_t batch, cudaStream_t stream) {
  using Element = typename ElementOf<kDType>::type;
  using Shape = KernelShape<Element>;
  const auto kernel = gemm_kernel<Element>;
  // 64 KiB of stages: above the 48 KiB default, so the kernel opts in.
  allow_dynamic_smem(reinterpret_cast<const void*>(kernel), Shape::kSmemBytes);
  const dim3 grid(static_cast<unsigned>(int64_t{args.tiles_m} * args.tiles_n),
                  static_cast<unsigned>(batch));
  kernel<<<grid, Shape::kThreads, Shape::kSmemBytes, stream>>>(args);
  SAMATTN_CHECK_LAUNCH();
}

}  // namespace samattn::detail::sm80
