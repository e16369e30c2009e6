// Internal: launch_sgemm<Cfg>, included by the library's instantiation (sgemm.cu) and by the
// benchmark that measures the other tile configurations.
#pragma once

#include "common/check.h"
#include "common/cuda_check.h"
#include "common/device.h"
#include "gemm/simt/sgemm_args.h"
#include "gemm/simt/sgemm_kernel.cuh"

namespace samattn::detail::simt {

template <typename Cfg>
void launch_sgemm(const GemmParams& params, cudaStream_t stream) {
  if constexpr (Cfg::kStages > 0) {
    const DeviceInfo& device = current_device_info();
    SAMATTN_CHECK(device.major >= 8,
                  "the cp.async SGEMM needs compute capability 8.0 or newer, "
                  "device ",
                  device.index, " is ", device.major, ".", device.minor);
  }
  const SgemmArgs args = make_sgemm_args(params);
  const dim3 grid(static_cast<unsigned>((args.n + Cfg::kBlockN - 1) / Cfg::kBlockN),
                  static_cast<unsigned>((args.m + Cfg::kBlockM - 1) / Cfg::kBlockM),
                  static_cast<unsigned>(params.batch));
  SAMATTN_CHECK(grid.y <= 65535 && grid.z <= 65535, "m (", args.m, ") and batch (", params.batch,
                ") must give at most 65535 row tiles and batches");
  const auto kernel = sgemm_kernel<Cfg>;
  allow_dynamic_smem(reinterpret_cast<const void*>(kernel), Cfg::kSmemBytes);
  kernel<<<grid, Cfg::kThreads, Cfg::kSmemBytes, stream>>>(args);
  SAMATTN_CHECK_LAUNCH();
}

}  // namespace samattn::detail::simt
