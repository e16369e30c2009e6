// Internal: the Hopper (sm_90a) attention forward, fp16/bf16, on wgmma and TMA, written with
// CuTe (from the nvidia-cutlass headers) as a library.
//
// One block computes kBlockM = 128 query rows of one (batch, head) with three warpgroups:
//  - warpgroup 0, the producer, gives most of its registers away (setmaxnreg) and one of its
//    threads issues every TMA copy: the Q tile once, then K and V tiles of each key block into a
//    kStages-deep ring of shared-memory stages guarded by mbarrier pipelines (full: the copy
//    engine has landed the bytes; empty: all 256 consumer threads are done with the stage).
//  - warpgroups 1 and 2, the consumers, own 64 query rows each. Per key block:
//      S = Q K^T (wgmma, both operands from shared memory, fp32 accumulators in registers)
//      -> scale by softmax_scale * log2(e), mask, online softmax with exp2 in registers
//      -> O += P V (wgmma, P rounded to the operand type and fed from registers as the A
//         operand: the accumulator fragment of S is already the A fragment layout).
//    K and V have separate pipelines, so Q K^T starts as soon as K lands. Within a warpgroup
//    the softmax of block j overlaps the tensor cores' O += P_{j-1} V_{j-1}: both GEMMs are
//    issued back to back and only S_j is waited for (wgmma.wait_group 1) before the softmax.
//    The two consumer warpgroups run independently (no ping-pong barriers yet).
// Key blocks are walked from the last to the first, as in the sm80 kernel, so the blocks that
// need masking (the end of the keys, the causal diagonal) come first. Rows and keys past the
// tensors' ends are zero-filled by TMA; keys past the end are masked with -inf, rows past the
// end are never stored.
#pragma once

#include <cstdint>

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cutlass/arch/barrier.h>
#include <cutlass/arch/reg_reconfig.h>
#include <cutlass/cutlass.h>
#include <cutlass/numeric_types.h>
#include <cute/tensor.hpp>
#include <cutlass/gemm/collective/builders/sm90_common.inl>
#include <cutlass/pipeline/sm90_pipeline.hpp>

#include "attention/hopper/forward_config.h"
#include "attention/hopper/wgmma_utils.cuh"
#include "attention/kernel_params.h"

namespace samattn::hopper {

// (seqlen, head_dim, heads, batch) extents and element strides of a q/k/v tensor as TMA sees it.
using GmemShape = cute::Shape<int32_t, int32_t, int32_t, int32_t>;
using GmemStride = cute::Stride<int64_t, cute::_1, int64_t, int64_t>;

template <typename Element, int kHeadDim>
struct KernelTraits {
  static constexpr int kBlockN = block_n(kHeadDim);
  static constexpr int kStages = stages(kHeadDim);
  using BlockM = cute::Int<kBlockM>;
  using BlockN = cute::Int<kBlockN>;
  using HeadDim = cute::Int<kHeadDim>;

  // Each consumer warpgroup is one 64-row wgmma atom; the two stack along M.
  using AtomLayout = cute::Layout<cute::Shape<cute::Int<kConsumerWarpgroups>, cute::_1, cute::_1>>;
  using TiledMmaS = decltype(cute::make_tiled_mma(
      cute::GMMA::ss_op_selector<Element, Element, float,
                                 cute::Shape<cute::_64, BlockN, HeadDim>>(),
      AtomLayout{}));
  // O = P V: P from registers (K-major), V^T from shared memory, where V is stored (key, dim)
  // with dim contiguous: an MN-major B operand.
  using TiledMmaO = decltype(cute::make_tiled_mma(
      cute::GMMA::rs_op_selector<Element, Element, float, cute::Shape<cute::_64, HeadDim, BlockN>,
                                 cute::GMMA::Major::K, cute::GMMA::Major::MN>(),
      AtomLayout{}));

  // The widest swizzle a row of head_dim elements allows (128 B for every supported head dim).
  using SmemAtomQ =
      decltype(cutlass::gemm::collective::detail::ss_smem_selector<cute::GMMA::Major::K, Element,
                                                                   BlockM, HeadDim>());
  using SmemAtomKV =
      decltype(cutlass::gemm::collective::detail::ss_smem_selector<cute::GMMA::Major::K, Element,
                                                                   BlockN, HeadDim>());
  using SmemLayoutQ = decltype(cute::tile_to_shape(SmemAtomQ{}, cute::Shape<BlockM, HeadDim>{}));
  using SmemLayoutKV = decltype(cute::tile_to_shape(
      SmemAtomKV{}, cute::Shape<BlockN, HeadDim, cute::Int<kStages>>{}));
  // The same bytes as SmemLayoutKV seen as (dim, key, stage): V^T for the second wgmma.
  using SmemLayoutVt = decltype(cute::composition(
      SmemLayoutKV{}, cute::make_ordered_layout(cute::Shape<HeadDim, BlockN, cute::Int<kStages>>{},
                                                cute::Step<cute::_2, cute::_1, cute::_3>{})));

  using Pipeline = cutlass::PipelineTmaAsync<kStages>;
  using PipelineState = typename Pipeline::PipelineState;

  struct SharedStorage {
    cute::array_aligned<Element, cute::cosize_v<SmemLayoutQ>, 1024> q;
    cute::array_aligned<Element, cute::cosize_v<SmemLayoutKV>, 1024> k;
    cute::array_aligned<Element, cute::cosize_v<SmemLayoutKV>, 1024> v;
    typename Pipeline::SharedStorage pipeline_k;
    typename Pipeline::SharedStorage pipeline_v;
    cutlass::arch::ClusterTransactionBarrier barrier_q;
  };
  static constexpr int kSmemBytes = static_cast<int>(sizeof(SharedStorage));
  static_assert(kSmemBytes <= forward_smem_bytes(kHeadDim, sizeof(Element)),
                "forward_config.h must bound the kernel's shared memory");

  static constexpr uint32_t kQBytes = kBlockM * kHeadDim * sizeof(Element);
  static constexpr uint32_t kKVBytes = kBlockN * kHeadDim * sizeof(Element);

  // TMA copy atoms (their descriptors travel in the kernel parameters).
  template <typename SmemLayout, typename Tile>
  using Tma = decltype(cute::make_tma_copy(
      cute::SM90_TMA_LOAD{},
      cute::make_tensor(cute::make_gmem_ptr(static_cast<const Element*>(nullptr)), GmemShape{},
                        GmemStride{}),
      SmemLayout{}, Tile{}, cute::_1{}));
  using TmaQ = Tma<SmemLayoutQ, cute::Shape<BlockM, HeadDim>>;
  using TmaKV = Tma<decltype(cute::take<0, 2>(SmemLayoutKV{})), cute::Shape<BlockN, HeadDim>>;
};

template <typename Element, int kHeadDim>
struct HopperForwardParams {
  using Traits = KernelTraits<Element, kHeadDim>;
  detail::ForwardKernelParams p;
  GmemShape shape_q, shape_k, shape_v;
  typename Traits::TmaQ tma_q;
  typename Traits::TmaKV tma_k;
  typename Traits::TmaKV tma_v;
};

// One past the last logical key any row of the query block [m_begin, m_begin + rows) can see.
__device__ __forceinline__ int64_t block_key_end(const detail::ForwardKernelParams& p,
                                                 int64_t m_begin, int rows) {
  if (!p.causal) return p.kept_keys;
  const int64_t last_visible = (m_begin + rows - 1) / p.kv_stride;
  return min(last_visible + 1, p.kept_keys);
}

// One past the last logical key query row `query` sees: key n is visible iff
// n * kv_stride <= query (causal) and n < kept_keys.
__device__ __forceinline__ int64_t row_key_end(const detail::ForwardKernelParams& p,
                                               int64_t query) {
  if (!p.causal) return p.kept_keys;
  return min(query / p.kv_stride + 1, p.kept_keys);
}

template <typename Element, int kHeadDim>
__device__ __forceinline__ void producer(
    const HopperForwardParams<Element, kHeadDim>& params,
    typename KernelTraits<Element, kHeadDim>::SharedStorage& shared,
    typename KernelTraits<Element, kHeadDim>::Pipeline& pipeline_k,
    typename KernelTraits<Element, kHeadDim>::Pipeline& pipeline_v, int64_t b, int64_t h,
    int64_t h_kv, int m_block, int n_blocks) {
  using namespace cute;
  using Traits = KernelTraits<Element, kHeadDim>;
  Tensor mQ = params.tma_q.get_tma_tensor(params.shape_q);
  Tensor mK = params.tma_k.get_tma_tensor(params.shape_k);
  Tensor mV = params.tma_v.get_tma_tensor(params.shape_v);
  Tensor gQ = local_tile(mQ(_, _, h, b), Shape<typename Traits::BlockM, typename Traits::HeadDim>{},
                         make_coord(m_block, _0{}));
  Tensor gK =
      local_tile(mK(_, _, h_kv, b), Shape<typename Traits::BlockN, typename Traits::HeadDim>{},
                 make_coord(_, _0{}));
  Tensor gV =
      local_tile(mV(_, _, h_kv, b), Shape<typename Traits::BlockN, typename Traits::HeadDim>{},
                 make_coord(_, _0{}));
  Tensor sQ = make_tensor(make_smem_ptr(shared.q.data()), typename Traits::SmemLayoutQ{});
  Tensor sK = make_tensor(make_smem_ptr(shared.k.data()), typename Traits::SmemLayoutKV{});
  Tensor sV = make_tensor(make_smem_ptr(shared.v.data()), typename Traits::SmemLayoutKV{});
  auto [tQgQ, tQsQ] =
      tma_partition(params.tma_q, _0{}, Layout<_1>{}, group_modes<0, 2>(sQ), group_modes<0, 2>(gQ));
  auto [tKgK, tKsK] =
      tma_partition(params.tma_k, _0{}, Layout<_1>{}, group_modes<0, 2>(sK), group_modes<0, 2>(gK));
  auto [tVgV, tVsV] =
      tma_partition(params.tma_v, _0{}, Layout<_1>{}, group_modes<0, 2>(sV), group_modes<0, 2>(gV));

  using BarrierType = cutlass::arch::ClusterTransactionBarrier::ValueType;
  shared.barrier_q.arrive_and_expect_tx(Traits::kQBytes);
  copy(params.tma_q.with(reinterpret_cast<BarrierType&>(shared.barrier_q), 0), tQgQ, tQsQ);

  auto state = cutlass::make_producer_start_state<typename Traits::Pipeline>();
  for (int n_block = n_blocks - 1; n_block >= 0; --n_block) {
    pipeline_k.producer_acquire(state);
    copy(params.tma_k.with(*pipeline_k.producer_get_barrier(state), 0), tKgK(_, n_block),
         tKsK(_, state.index()));
    pipeline_v.producer_acquire(state);
    copy(params.tma_v.with(*pipeline_v.producer_get_barrier(state), 0), tVgV(_, n_block),
         tVsV(_, state.index()));
    ++state;
  }
}

template <typename Element, int kHeadDim>
__device__ __forceinline__ void consumer(
    const HopperForwardParams<Element, kHeadDim>& params,
    typename KernelTraits<Element, kHeadDim>::SharedStorage& shared,
    typename KernelTraits<Element, kHeadDim>::Pipeline& pipeline_k,
    typename KernelTraits<Element, kHeadDim>::Pipeline& pipeline_v, int64_t b, int64_t h,
    int64_t m_begin, int rows, int n_blocks) {
  using namespace cute;
  using Traits = KernelTraits<Element, kHeadDim>;
  constexpr int kBlockN = Traits::kBlockN;
  const detail::ForwardKernelParams& p = params.p;
  const int tid = static_cast<int>(threadIdx.x) - 128;  // 0..255 over the consumer warpgroups
  const int lane = tid % 32;

  typename Traits::TiledMmaS mma_s;
  typename Traits::TiledMmaO mma_o;
  auto thr_s = mma_s.get_thread_slice(tid);
  auto thr_o = mma_o.get_thread_slice(tid);
  Tensor sQ = make_tensor(make_smem_ptr(shared.q.data()), typename Traits::SmemLayoutQ{});
  Tensor sK = make_tensor(make_smem_ptr(shared.k.data()), typename Traits::SmemLayoutKV{});
  Tensor sVt = make_tensor(make_smem_ptr(shared.v.data()), typename Traits::SmemLayoutVt{});
  Tensor tSrQ = thr_s.partition_fragment_A(sQ);    // (MMA, 1, K) descriptors
  Tensor tSrK = thr_s.partition_fragment_B(sK);    // (MMA, 1, K, stage)
  Tensor tOrVt = thr_o.partition_fragment_B(sVt);  // (MMA, 1, N/16, stage)
  Tensor tSrS =
      partition_fragment_C(mma_s, Shape<typename Traits::BlockM, typename Traits::BlockN>{});
  Tensor tOrO =
      partition_fragment_C(mma_o, Shape<typename Traits::BlockM, typename Traits::HeadDim>{});
  Tensor tOrP = make_tensor<Element>(accumulator_as_a_operand(tSrS.layout()));
  static_assert(size(tOrP) == size(tSrS), "P reuses the S fragment's order");
  static_assert(size<2>(tOrP) == kBlockN / 16, "one P k-block per 16 keys");
  // (row, column) of every accumulator element within the block's tile.
  Tensor tScS = thr_s.partition_C(
      make_identity_tensor(Shape<typename Traits::BlockM, typename Traits::BlockN>{}));
  Tensor tOcO = thr_o.partition_C(
      make_identity_tensor(Shape<typename Traits::BlockM, typename Traits::HeadDim>{}));
  // A thread holds two rows of its warp's 16: element i of an accumulator is in row half
  // (i / 2) % 2 (wgmma's fragment order: column pair, row half, 8-column group).
  int local_row[2];
  local_row[0] = get<0>(tScS(0));
  local_row[1] = get<0>(tScS(2));

  const float scale_log2 = static_cast<float>(p.scale_log2);
  float row_max[2] = {-INFINITY, -INFINITY};
  float row_sum[2] = {0.f, 0.f};  // this thread's part; the quad holds the rest
  clear(tOrO);

  // Scales the scores of key block n_block (in tSrS) to the log2 domain and masks the keys its
  // rows must not see (only blocks that cross the end of the keys or the causal diagonal).
  auto scale_and_mask = [&](int n_block) {
    const int64_t n_begin = int64_t{n_block} * kBlockN;
    CUTE_UNROLL
    for (int i = 0; i < size(tSrS); ++i) tSrS(i) *= scale_log2;
    const bool needs_mask = n_begin + kBlockN > p.kept_keys ||
                            (p.causal && (n_begin + kBlockN - 1) * p.kv_stride > m_begin);
    if (needs_mask) {
      int limit[2];
      CUTE_UNROLL
      for (int r = 0; r < 2; ++r) {
        const int64_t end = row_key_end(p, m_begin + local_row[r]) - n_begin;
        limit[r] = static_cast<int>(max(int64_t{0}, min(end, int64_t{kBlockN})));
      }
      CUTE_UNROLL
      for (int i = 0; i < size(tSrS); ++i) {
        if (get<1>(tScS(i)) >= limit[(i / 2) % 2]) tSrS(i) = -INFINITY;
      }
    }
  };
  // Online softmax in the log2 domain: tSrS becomes exp2(s - max), the statistics take the
  // block in, and rescale[r] is the factor for row r's earlier output.
  auto softmax = [&](float(&rescale)[2]) {
    CUTE_UNROLL
    for (int r = 0; r < 2; ++r) {
      float block_max = -INFINITY;
      CUTE_UNROLL
      for (int i = 0; i < size(tSrS); ++i) {
        if ((i / 2) % 2 == r) block_max = fmaxf(block_max, tSrS(i));
      }
      const float new_max = fmaxf(row_max[r], quad_max(block_max));
      // A row that has seen no visible key keeps max -inf; subtracting 0 keeps its masked
      // probabilities at exactly 0 instead of NaN, while NaN scores still poison the row.
      const float shift = new_max == -INFINITY ? 0.f : new_max;
      rescale[r] = fast_exp2(row_max[r] - shift);
      row_max[r] = new_max;
      row_sum[r] *= rescale[r];
    }
    CUTE_UNROLL
    for (int i = 0; i < size(tSrS); ++i) {
      const int r = (i / 2) % 2;
      const float shift = row_max[r] == -INFINITY ? 0.f : row_max[r];
      tSrS(i) = fast_exp2(tSrS(i) - shift);
      row_sum[r] += tSrS(i);
    }
  };
  uint32_t* p_pairs = reinterpret_cast<uint32_t*>(raw_pointer_cast(tOrP.data()));
  auto convert_p = [&]() {
    CUTE_UNROLL
    for (int i = 0; i < size(tSrS) / 2; ++i) {
      p_pairs[i] = pack_pair<Element>(tSrS(2 * i), tSrS(2 * i + 1));
    }
  };

  shared.barrier_q.wait(0);
  typename Traits::PipelineState state;
  if (n_blocks > 0) {
    // The first (last in key order) block: S, softmax, P; O is still zero.
    int n_block = n_blocks - 1;
    pipeline_k.consumer_wait(state);
    warpgroup_gemm</*kAInRegisters=*/false, /*kWait=*/true>(
        mma_s, tSrQ, tSrK(_, _, _, state.index()), tSrS, /*zero_init=*/true);
    pipeline_k.consumer_release(state);
    scale_and_mask(n_block);
    float rescale[2];
    softmax(rescale);
    convert_p();
    // Each further block: issue S_j = Q K_j^T, then O += P_{j-1} V_{j-1}; the softmax of S_j
    // runs while the tensor cores still work on the second GEMM.
    for (--n_block; n_block >= 0; --n_block) {
      typename Traits::PipelineState next = state;
      ++next;
      pipeline_k.consumer_wait(next);
      warpgroup_gemm</*kAInRegisters=*/false, /*kWait=*/false>(
          mma_s, tSrQ, tSrK(_, _, _, next.index()), tSrS, /*zero_init=*/true);
      pipeline_v.consumer_wait(state);
      warpgroup_gemm</*kAInRegisters=*/true, /*kWait=*/false>(
          mma_o, tOrP, tOrVt(_, _, _, state.index()), tOrO, /*zero_init=*/false);
      warpgroup_wait<1>();  // S_j has landed (wgmma groups complete in order)
      warpgroup_fence_operand(tSrS);
      pipeline_k.consumer_release(next);
      scale_and_mask(n_block);
      softmax(rescale);
      warpgroup_wait<0>();  // O += P_{j-1} V_{j-1} has landed
      warpgroup_fence_operand(tOrO);
      warpgroup_fence_operand(tOrP);
      pipeline_v.consumer_release(state);
      CUTE_UNROLL
      for (int i = 0; i < size(tOrO); ++i) tOrO(i) *= rescale[(i / 2) % 2];
      convert_p();
      state = next;
    }
    pipeline_v.consumer_wait(state);
    warpgroup_gemm</*kAInRegisters=*/true, /*kWait=*/true>(
        mma_o, tOrP, tOrVt(_, _, _, state.index()), tOrO, /*zero_init=*/false);
    pipeline_v.consumer_release(state);
  }

  // Normalise and store. A row that saw no key (sum 0) gets zeros and lse = -inf; a NaN sum
  // stays NaN.
  float total[2], inverse[2];
  CUTE_UNROLL
  for (int r = 0; r < 2; ++r) {
    total[r] = quad_sum(row_sum[r]);
    inverse[r] = total[r] == 0.f ? 0.f : 1.f / total[r];
  }
  Element* out = static_cast<Element*>(p.out) + b * p.o_batch_stride + h * p.o_head_stride +
                 m_begin * p.o_row_stride;
  CUTE_UNROLL
  for (int i = 0; i < size(tOrO); i += 2) {
    const int r = (i / 2) % 2;
    const int row = get<0>(tOcO(i));
    if (row < rows) {
      const int col = get<1>(tOcO(i));
      *reinterpret_cast<uint32_t*>(out + row * p.o_row_stride + col) =
          pack_pair<Element>(tOrO(i) * inverse[r], tOrO(i + 1) * inverse[r]);
    }
  }
  if (p.lse != nullptr && lane % 4 == 0) {
    constexpr float kLn2 = 0.6931471805599453f;
    float* lse =
        static_cast<float*>(p.lse) + b * p.lse_batch_stride + h * p.lse_head_stride + m_begin;
    CUTE_UNROLL
    for (int r = 0; r < 2; ++r) {
      if (local_row[r] < rows) {
        lse[local_row[r]] = total[r] == 0.f ? -INFINITY : (row_max[r] + log2f(total[r])) * kLn2;
      }
    }
  }
}

// __launch_bounds__(threads, 1) caps registers at entry so setmaxnreg can move them from the
// producer warpgroup to the consumers.
template <typename Element, int kHeadDim>
__global__ void __launch_bounds__(kThreads, 1)
    forward_kernel(const __grid_constant__ HopperForwardParams<Element, kHeadDim> params) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900 && defined(__CUDA_ARCH_FEAT_SM90_ALL)
  using namespace cute;
  using Traits = KernelTraits<Element, kHeadDim>;
  extern __shared__ __align__(1024) unsigned char shared_bytes[];
  auto& shared = *reinterpret_cast<typename Traits::SharedStorage*>(shared_bytes);
  const detail::ForwardKernelParams& p = params.p;

  // The blocks of one (batch, head) are adjacent, so the K/V they all stream stays in L2; within
  // a head the last query blocks (the most keys when causal) run first to shorten the tail.
  const int64_t num_m_blocks = (p.seqlen_q + kBlockM - 1) / kBlockM;
  const int64_t block = blockIdx.x;
  const int m_block = static_cast<int>(num_m_blocks - 1 - block % num_m_blocks);
  const int64_t batch_head = block / num_m_blocks;
  const int64_t b = batch_head / p.heads_q;
  const int64_t h = batch_head % p.heads_q;
  const int64_t h_kv = h / p.group_size;
  const int64_t m_begin = int64_t{m_block} * kBlockM;
  const int rows = static_cast<int>(min(int64_t{kBlockM}, p.seqlen_q - m_begin));
  const int64_t key_end = block_key_end(p, m_begin, rows);
  const int n_blocks = static_cast<int>((key_end + Traits::kBlockN - 1) / Traits::kBlockN);

  const int warp = static_cast<int>(threadIdx.x) / 32;
  const int warpgroup = warp / 4;
  if (threadIdx.x == 0) {
    prefetch_tma_descriptor(params.tma_q.get_tma_descriptor());
    prefetch_tma_descriptor(params.tma_k.get_tma_descriptor());
    prefetch_tma_descriptor(params.tma_v.get_tma_descriptor());
    shared.barrier_q.init(1);
  }
  typename Traits::Pipeline::Params pipeline_params;
  pipeline_params.transaction_bytes = Traits::kKVBytes;
  pipeline_params.role = warpgroup == 0 ? Traits::Pipeline::ThreadCategory::Producer
                                        : Traits::Pipeline::ThreadCategory::Consumer;
  pipeline_params.is_leader = threadIdx.x == 0;
  pipeline_params.num_consumers = 128 * kConsumerWarpgroups;
  // The constructors initialise the barriers from warp 0; the block barrier below publishes them.
  typename Traits::Pipeline pipeline_k(shared.pipeline_k, pipeline_params, Shape<_1, _1, _1>{});
  typename Traits::Pipeline pipeline_v(shared.pipeline_v, pipeline_params, Shape<_1, _1, _1>{});
  cutlass::arch::fence_barrier_init();
  __syncthreads();

  if (warpgroup == 0) {
    cutlass::arch::warpgroup_reg_dealloc<24>();
    if (threadIdx.x == 0) {
      producer<Element, kHeadDim>(params, shared, pipeline_k, pipeline_v, b, h, h_kv, m_block,
                                  n_blocks);
    }
  } else {
    cutlass::arch::warpgroup_reg_alloc<240>();
    consumer<Element, kHeadDim>(params, shared, pipeline_k, pipeline_v, b, h, m_begin, rows,
                                n_blocks);
  }
#else
  __trap();  // compiled for sm_90a only; the host never launches it elsewhere
#endif
}

}  // namespace samattn::hopper
