// The library's fp32 SGEMM: two instantiations of the warp-tiled kernel, picked by how many
// output tiles the problem has.
#include "common/device.h"
#include "gemm/simt/sgemm_launch.cuh"

namespace samattn::detail::simt {

template void launch_sgemm<ShippedSgemm>(const GemmParams&, cudaStream_t);
template void launch_sgemm<FewTilesSgemm>(const GemmParams&, cudaStream_t);

}  // namespace samattn::detail::simt

namespace samattn::detail {

void launch_sgemm(const GemmParams& params, cudaStream_t stream) {
  // ShippedSgemm's 128 x 256 tiles run one block per SM: a problem with fewer of them than the
  // GPU has SMs (skinny or small) keeps more SMs busy with FewTilesSgemm's 128 x 128 tiles, two
  // blocks per SM.
  using Big = simt::ShippedSgemm;
  const int64_t big_tiles = (params.m + Big::kBlockM - 1) / Big::kBlockM *
                            ((params.n + Big::kBlockN - 1) / Big::kBlockN) * params.batch;
  if (big_tiles < current_device_info().multiprocessors) {
    simt::launch_sgemm<simt::FewTilesSgemm>(params, stream);
  } else {
    simt::launch_sgemm<Big>(params, stream);
  }
}

}  // namespace samattn::detail
