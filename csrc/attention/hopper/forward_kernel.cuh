// Internal: the Hopper (sm_90a) attention forward, fp16/bf16, on wgmma and TMA, written with
// CuTe (from the nvidia-cutlass headers) as a library.
//
// A persistent kernel: at most one block per SM, each taking query tiles (kBlockM rows of one
// (batch, head)) in the order of forward_scheduler.h until none is left. Warpgroup 0 is the
// producer (forward_producer.cuh): it gives most of its registers away (setmaxnreg), one of
// its threads issues every TMA copy, another takes the block's next work unit and, in
// block-sparse calls, a third warp reads the block map (forward_key_blocks.cuh). The other
// warpgroups are the consumers (forward_consumer.cuh): 64 query rows each, wgmma for S = Q K^T and
// O += P V, the online softmax in registers, ping-pong turns between them, and the output staged in
// shared memory and stored by TMA (or stored from registers when a Q buffer cannot be spared). Key
// blocks are walked from the last to the first, as in the sm80 kernel, so the blocks that need
// masking (the end of the keys, the causal diagonal) come first; a consumer warpgroup passes on,
// without a GEMM, the highest blocks that none of its own rows see (past their causal diagonals
// or window ends, or every block when its rows lie past the sequence's end). With a sliding window
// a tile walks only the blocks its rows' windows reach, and the block where they start is masked
// too (forward_traits.cuh's window helpers). A varlen sequence is a dense problem at an offset of
// the packed tensors (tiles past its end are skipped; its last key block is read past its end and
// masked; its output leaves from registers). Rows and keys past the tensors' ends are zero-filled
// by TMA; keys past the end are masked with -inf, rows past the end are never stored (the TMA store
// clips them).
#pragma once

#include <cutlass/arch/barrier.h>
#include <cutlass/arch/reg_reconfig.h>
#include <cute/tensor.hpp>

#include "attention/hopper/forward_consumer.cuh"
#include "attention/hopper/forward_producer.cuh"
#include "attention/hopper/forward_traits.cuh"

namespace samattn::hopper {

// __launch_bounds__(threads, 1) caps registers at entry so setmaxnreg can move them from the
// producer warpgroup to the consumers.
template <typename Element, int kHeadDim, int kVariant>
__global__ void __launch_bounds__(KernelTraits<Element, kHeadDim, kVariant>::kThreads, 1)
    forward_kernel(
        const __grid_constant__ HopperForwardParams<Element, kHeadDim, kVariant> params) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900 && defined(__CUDA_ARCH_FEAT_SM90_ALL)
  using namespace cute;
  using Traits = KernelTraits<Element, kHeadDim, kVariant>;
  extern __shared__ __align__(1024) unsigned char shared_bytes[];
  auto& shared = *reinterpret_cast<typename Traits::SharedStorage*>(shared_bytes);

  const int warpgroup = static_cast<int>(threadIdx.x) / 128;
  if (threadIdx.x == 0) {
    prefetch_tma_descriptor(params.tma_q.get_tma_descriptor());
    prefetch_tma_descriptor(params.tma_k.get_tma_descriptor());
    prefetch_tma_descriptor(params.tma_v.get_tma_descriptor());
    prefetch_tma_descriptor(params.tma_o.get_tma_descriptor());
    for (int i = 0; i < Traits::kQBuffers; ++i) {
      shared.barrier_q_full[i].init(1);
      shared.barrier_q_empty[i].init(Traits::kConsumerThreads);
    }
    shared.barrier_unit_full.init(1);
    shared.barrier_unit_empty.init(1);
    shared.barrier_list_full.init(1);
    shared.barrier_list_empty.init(32);  // every lane of the list warp
    for (int i = 0; i < Traits::kQBuffers; ++i) shared.barrier_masks_full[i].init(32);
  }
  typename Traits::Pipeline::Params pipeline_params;
  pipeline_params.transaction_bytes = Traits::kKVBytes;
  pipeline_params.role = warpgroup == 0 ? Traits::Pipeline::ThreadCategory::Producer
                                        : Traits::Pipeline::ThreadCategory::Consumer;
  pipeline_params.is_leader = threadIdx.x == 0;
  pipeline_params.num_consumers = Traits::kConsumerThreads;
  // The constructors initialise the barriers from warp 0; the block barrier below publishes them.
  typename Traits::Pipeline pipeline_k(shared.pipeline_k, pipeline_params, Shape<_1, _1, _1>{});
  typename Traits::Pipeline pipeline_v(shared.pipeline_v, pipeline_params, Shape<_1, _1, _1>{});
  cutlass::arch::fence_barrier_init();
  __syncthreads();

  if (warpgroup == 0) {
    cutlass::arch::warpgroup_reg_dealloc<Traits::kTile.producer_registers>();
    if (threadIdx.x == 0) {
      producer_loop<Element, kHeadDim, kVariant>(params, shared, pipeline_k, pipeline_v);
    } else if (threadIdx.x == 32) {
      scheduler_loop<Traits::kBlockM, Traits::kBlockN>(params.schedule, params.geometry, shared);
    } else if (threadIdx.x / 32 == 2 && params.p.block_map != nullptr) {
      key_block_list_loop<Traits::kBlockM, Traits::kBlockN, Traits::kConsumerWarpgroups>(params,
                                                                                         shared);
    }
  } else {
    cutlass::arch::warpgroup_reg_alloc<Traits::kTile.consumer_registers()>();
    consumer_loop<Element, kHeadDim, kVariant>(params, shared, pipeline_k, pipeline_v);
  }
#else
  __trap();  // compiled for sm_90a only; the host never launches it elsewhere
#endif
}

}  // namespace samattn::hopper
