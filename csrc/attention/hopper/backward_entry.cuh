// Internal: the Hopper backward's kernel: barriers, then the producer warpgroup (TMA and
// statistics) and the consumer warpgroups (backward_kernel.cuh's consume, or the column split's).
#pragma once

#include <cutlass/arch/reg_reconfig.h>

#include "attention/hopper/backward_column_split.cuh"
#include "attention/hopper/backward_kernel.cuh"

namespace samattn::hopper::bwd {

// __launch_bounds__(threads, 1) caps registers at entry so setmaxnreg can move them from the
// producer warpgroup to the consumers.
template <typename T>
__global__ void __launch_bounds__(BackwardConfig::kThreads, 1)
    backward_kernel(const __grid_constant__ KernelParams<T> params) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900 && defined(__CUDA_ARCH_FEAT_SM90_ALL)
  extern __shared__ __align__(1024) unsigned char shared_bytes[];
  auto& shared = *reinterpret_cast<typename T::SharedStorage*>(shared_bytes);
  const BlockWork<T::kBlockM, T::kBlockN> work(params.p);
  const int warp = static_cast<int>(threadIdx.x) / 32;
  const int lane = static_cast<int>(threadIdx.x) % 32;
  if (threadIdx.x == 0) {
    cute::prefetch_tma_descriptor(params.tma_q.get_tma_descriptor());
    cute::prefetch_tma_descriptor(params.tma_dout.get_tma_descriptor());
    cute::prefetch_tma_descriptor(params.tma_k.get_tma_descriptor());
    cute::prefetch_tma_descriptor(params.tma_v.get_tma_descriptor());
    shared.barrier_kv.init(1);
    for (int s = 0; s < T::kStages; ++s) {
      // The TMA thread's arrive (with the byte count) and the statistics warp's 32 arrivals.
      shared.full[s].init(1 + BackwardConfig::kStatsThreads);
      shared.empty[s].init(BackwardConfig::kConsumerThreads);
    }
  }
  cutlass::arch::fence_barrier_init();
  __syncthreads();

  if (warp < 4) {
    cutlass::arch::warpgroup_reg_dealloc<24>();
    if (warp == 0 && lane == 0) {
      load_tiles<T>(params, shared, work);
    } else if (warp == 1) {
      load_row_statistics<T>(params.p, shared, work, lane);
    }
  } else {
    cutlass::arch::warpgroup_reg_alloc<240>();
    if constexpr (T::kColumnSplit) {
      consume_column_split<T>(params, shared, work);
    } else {
      consume<T>(params, shared, work);
    }
  }
#else
  __trap();  // compiled for sm_90a only; the host never launches it elsewhere
#endif
}

}  // namespace samattn::hopper::bwd
