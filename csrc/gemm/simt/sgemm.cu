// The library's fp32 SGEMM: one instantiation, the tile configuration named ShippedSgemm.
#include "gemm/simt/sgemm_launch.cuh"

namespace samattn::detail::simt {

template void launch_sgemm<ShippedSgemm>(const GemmParams&, cudaStream_t);

}  // namespace samattn::detail::simt

namespace samattn::detail {

void launch_sgemm(const GemmParams& params, cudaStream_t stream) {
  simt::launch_sgemm<simt::ShippedSgemm>(params, stream);
}

}  // namespace samattn::detail
