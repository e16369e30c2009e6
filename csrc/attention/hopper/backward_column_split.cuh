// Internal: the consumers of the Hopper backward above head dim 128 (backward_config.h,
// backward_splits_columns). Both consumer warpgroups own the block's 64 keys. Warpgroup w
//  - computes the whole S^T = K Q^T and dP^T = V dO^T of a step, P^T and dS^T (as consume() does
//    for its own 64 keys), and stores its own copy of dS in its two dS buffers;
//  - keeps columns [w D / 2, (w + 1) D / 2) of dK and dV in registers (64 registers each at 256):
//    dV += P^T dO[:, half] and dK += dS^T Q[:, half];
//  - computes the same columns of dQ = dS K[:, half] (64 registers) and adds them from registers
//    into the fp32 accumulator with 16-byte atomics, in the chunk's order (Traits::dq_chunk_float,
//    so the conversion kernel is the same): a staging tile for bulk reductions would not fit
//    beside K, V and two Q / dO stages (226 KiB at 256).
// At head dim 192 the halves are 96 columns and the tiles take 64-byte swizzle atoms
// (backward_kernel.cuh, SmemAtomKV).
// The warpgroups share only the Q / dO stages (both arrive on `empty`) and meet twice: warpgroup 1
// starts once warpgroup 0 has finished its first softmax (so that one's softmax runs under the
// other's GEMMs from then on), and both meet before dK and dV are staged in V's tile, which both
// read until their last step.
//
// Ordering, beyond consume()'s:
//  - dS buffer 2 w + (step & 1): written by warpgroup w's stmatrix, fenced to the async proxy,
//    then warpgroup w syncs on its own named barrier (128 threads) before it issues the dQ wgmma
//    that reads it. It is written again two steps later, after each of w's warps passed the
//    barrier of the step between, which it reaches only after its wgmma.wait_group 0 of the step
//    that read the buffer.
//  - The dQ accumulator: red.global.add of disjoint or summed floats, read only by the conversion
//    kernel launched after this one on the same stream.
#pragma once

#include "attention/hopper/backward_kernel.cuh"

namespace samattn::hopper::bwd {

// Named barriers of the column split (user ids, as kDsReadyBarrier's): one per warpgroup for its
// own dS, one where warpgroup 1 waits for warpgroup 0's first softmax, one before the epilogue.
inline constexpr uint32_t kOwnDsBarrier = kDsReadyBarrier;  // + warpgroup
inline constexpr uint32_t kStaggerBarrier = kDsReadyBarrier + 2;
inline constexpr uint32_t kEpilogueBarrier = kDsReadyBarrier + 3;

template <typename T>
__device__ __forceinline__ void consume_column_split(
    const KernelParams<T>& params, typename T::SharedStorage& shared,
    const BlockWork<T::kBlockM, T::kBlockN>& work) {
  using namespace cute;
  using Element = typename T::Element;
  constexpr int kBlockM = T::kBlockM;
  constexpr int kWarpgroupThreads = BackwardConfig::kConsumerThreads / 2;
  static_assert(T::kColumnSplit && !T::kAlternateDq, "the column split's traits");
  const detail::BackwardKernelParams& p = params.p;
  const detail::ForwardKernelParams& f = p.fwd;
  const int tid = static_cast<int>(threadIdx.x) - 128;  // 0..255 over the consumer warpgroups
  // Uniform over the warp through a shuffle, as in consume(): branches on it do not diverge.
  const int warpgroup = __shfl_sync(0xffffffffu, tid / kWarpgroupThreads, 0);
  const int own_tid = tid % kWarpgroupThreads;

  typename T::TiledMmaSdP mma_sdp;  // one warpgroup's tile: each computes all of S^T and dP^T
  typename T::TiledMmaDKV mma_dkv;  // the warpgroups along the columns
  typename T::TiledMmaDQ mma_dq;    // the same
  auto thr_sdp = mma_sdp.get_thread_slice(own_tid);
  auto thr_dkv = mma_dkv.get_thread_slice(tid);
  auto thr_dq = mma_dq.get_thread_slice(tid);

  Tensor sV = make_tensor(make_smem_ptr(shared.v.data()), typename T::SmemLayoutKV{});
  Tensor sdSt = make_tensor(make_smem_ptr(shared.ds.data()), typename T::SmemLayoutDst{});
  auto [tSrK, tSrV, tSrQ, tSrdO, tdVrdO, tdKrQ, tdQrdS, tdQrKt] =
      operand_descriptors<T>(shared, thr_sdp, thr_dkv, thr_dq);
  auto ds_store = make_tiled_copy_C(Copy_Atom<SM90_U32x4_STSM_N, Element>{}, mma_sdp);
  auto thread_ds_store = ds_store.get_thread_slice(own_tid);
  Tensor tDSsdSt = thread_ds_store.partition_D(sdSt);  // (CPY, CPY_M, CPY_N, buffer)

  const auto sdp_tile = Shape<typename T::BlockN, typename T::BlockM>{};
  const auto dkv_tile = Shape<typename T::BlockN, typename T::HeadDim>{};
  const auto dq_tile = Shape<typename T::BlockM, typename T::HeadDim>{};
  Tensor tdVrdV = partition_fragment_C(mma_dkv, dkv_tile);
  Tensor tdKrdK = partition_fragment_C(mma_dkv, dkv_tile);
  Tensor tScS = thr_sdp.partition_C(make_identity_tensor(sdp_tile));  // (key, query)
  const int local_key[2] = {get<0>(tScS(0)), get<0>(tScS(2))};        // consume()'s row-half rule

  const float scale_log2 = static_cast<float>(f.scale_log2);
  const bool accumulate_dq = p.dq_accum != nullptr;  // deterministic: another kernel does dQ
  float* dq_accum = static_cast<float*>(p.dq_accum);
  const int64_t dq_rows_per_head = backward_dq_accum_rows(f.seqlen_q, T::kHeadDim);
  clear(tdVrdV);
  clear(tdKrdK);
  if (work.steps > 0) shared.barrier_kv.wait(0);
  if (warpgroup == 1 && work.steps > 0) {
    cutlass::arch::NamedBarrier::sync(BackwardConfig::kConsumerThreads, kStaggerBarrier);
  }

  auto cursor = work.first_step(p);
  for (int64_t step = 0; step < work.steps; ++step) {
    const int stage = static_cast<int>(step % T::kStages);
    const uint32_t phase = static_cast<uint32_t>(step / T::kStages) & 1u;
    const int buffer = 2 * warpgroup + static_cast<int>(step & 1);
    const int64_t h = cursor.h;
    const int64_t m_begin = int64_t{cursor.m_block} * kBlockM;
    cursor.next(work);

    // Declared inside the step, as in consume(): an accumulator outliving the step stays live.
    Tensor tSrS = partition_fragment_C(mma_sdp, sdp_tile);   // S^T, then P^T (fp32)
    Tensor tSrdP = partition_fragment_C(mma_sdp, sdp_tile);  // dP^T, then dS^T (fp32)
    Tensor tdVrP = make_tensor<Element>(accumulator_as_a_operand(tSrS.layout()));
    Tensor tdKrdS = make_tensor<Element>(accumulator_as_a_operand(tSrdP.layout()));

    shared.full[stage].wait(phase);
    softmax_gradients<T>(mma_sdp, tSrK, tSrV, tSrQ(_, _, _, stage), tSrdO(_, _, _, stage), tSrS,
                         tSrdP, tScS, local_key, work.n_begin, m_begin, work.n_begin, f, scale_log2,
                         shared.lse_log2[stage], shared.delta[stage]);
    convert_pairs<Element>(tSrS, tdVrP);
    convert_pairs<Element>(tSrdP, tdKrdS);
    if (accumulate_dq) {
      Tensor tSrdS = make_tensor(tdKrdS.data(), tSrdP.layout());
      copy(ds_store, thread_ds_store.retile_S(tSrdS), tDSsdSt(_, _, _, buffer));
    }
    if (warpgroup == 0 && step == 0) {
      cutlass::arch::NamedBarrier::arrive(BackwardConfig::kConsumerThreads, kStaggerBarrier);
    }
    issue_gemm</*kZeroInit=*/false, /*kAInRegisters=*/true>(mma_dkv, tdVrP, tdVrdO(_, _, _, stage),
                                                            tdVrdV);
    issue_gemm</*kZeroInit=*/false, /*kAInRegisters=*/true>(mma_dkv, tdKrdS, tdKrQ(_, _, _, stage),
                                                            tdKrdK);
    if (accumulate_dq) {
      cutlass::arch::fence_view_async_shared();  // dS stores -> visible to the async proxy
      cutlass::arch::NamedBarrier::sync(kWarpgroupThreads, kOwnDsBarrier + warpgroup);
    }
    // dV has landed: P^T's registers are free before dQ's accumulator takes 64 more.
    warpgroup_wait<1>();
    warpgroup_fence_operand(tdVrdV);
    warpgroup_fence_operand(tdVrP);
    Tensor tdQrdQ = partition_fragment_C(mma_dq, dq_tile);
    if (accumulate_dq) {
      issue_gemm</*kZeroInit=*/true, /*kAInRegisters=*/false>(mma_dq, tdQrdS(_, _, _, buffer),
                                                              tdQrKt, tdQrdQ);
      warpgroup_wait<1>();  // dK has landed
    } else {
      warpgroup_wait<0>();
    }
    warpgroup_fence_operand(tdKrdK);
    warpgroup_fence_operand(tdKrdS);
    shared.empty[stage].arrive();  // the tensor cores are done with Q, dO, lse and D
    if (accumulate_dq) {
      warpgroup_wait<0>();
      warpgroup_fence_operand(tdQrdQ);
      float* chunk =
          dq_accum + ((work.b * f.heads_q + h) * dq_rows_per_head + m_begin) * T::kHeadDim;
      CUTE_UNROLL
      for (int i = 0; i < size(tdQrdQ); i += 4) {
        atomicAdd(reinterpret_cast<float4*>(chunk + T::dq_chunk_float(tid, i)),
                  make_float4(tdQrdQ(i), tdQrdQ(i + 1), tdQrdQ(i + 2), tdQrdQ(i + 3)));
      }
    }
  }
  // Both warpgroups read all of V's tile (dP^T) until their last step.
  cutlass::arch::NamedBarrier::sync(BackwardConfig::kConsumerThreads, kEpilogueBarrier);
  store_gradients_by_tma(params, sV, mma_dkv, tdKrdK, tdVrdV, static_cast<float>(p.scale), work,
                         tid);
  zero_rows_between_kept_keys<T>(p, work, tid, tid % 32);
}

}  // namespace samattn::hopper::bwd
