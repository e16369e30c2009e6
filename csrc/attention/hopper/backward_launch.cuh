// Internal: the body of hopper::launch_backward, included only by the generated instantiation
// files (compiled for sm_90a alone): zeroes the dQ accumulator, builds the TMA descriptors,
// launches the dK/dV(/dQ) kernel, then the kernel that converts the dQ accumulator (or, when
// deterministic, the tensor-core backward's dQ kernel).
#pragma once

#include <cstdint>
#include <limits>

#include "attention/hopper/backward_dq_convert.cuh"
#include "attention/hopper/backward_entry.cuh"
#include "attention/hopper/backward_launch.h"
#include "attention/tensor_core/backward_launch.h"
#include "common/check.h"
#include "common/cuda_check.h"
#include "common/device.h"

namespace samattn::hopper {
namespace bwd {

template <DType kDType>
struct CuteElement;
template <>
struct CuteElement<DType::kFloat16> {
  using type = cutlass::half_t;
};
template <>
struct CuteElement<DType::kBFloat16> {
  using type = cutlass::bfloat16_t;
};

// A (seqlen, head_dim, heads, batch) view of a tensor for its TMA descriptor (Element const for
// the loads). A dimension of extent 1 is never stepped along, so its stride may be anything; TMA
// still wants every stride 16-byte aligned, so such strides become head_dim elements
// (backward_supports() has checked the others).
template <typename Element, typename Pointer>
auto gmem_tensor(Pointer base, int64_t seqlen, int head_dim, int64_t heads, int64_t batch,
                 int64_t row_stride, int64_t head_stride, int64_t batch_stride) {
  using namespace cute;
  const auto usable = [&](int64_t stride, int64_t extent) {
    return extent > 1 ? stride : int64_t{head_dim};
  };
  const GmemShape shape(static_cast<int32_t>(seqlen), head_dim, static_cast<int32_t>(heads),
                        static_cast<int32_t>(batch));
  const GmemStride stride(usable(row_stride, seqlen), _1{}, usable(head_stride, heads),
                          usable(batch_stride, batch));
  return make_tensor(make_gmem_ptr(static_cast<Element*>(base)), make_layout(shape, stride));
}

// Launches the dK/dV(/dQ) kernel of traits T (K / V / Q / dO descriptors, grid, shared memory).
template <typename T>
void launch_backward_kernel(const detail::BackwardKernelParams& p, cudaStream_t stream) {
  using namespace cute;
  using Element = typename T::Element;
  constexpr int kHeadDim = T::kHeadDim;
  const detail::ForwardKernelParams& f = p.fwd;
  const int64_t n_blocks = (f.kept_keys + T::kBlockN - 1) / T::kBlockN;
  const int64_t blocks = n_blocks * f.batch * p.heads_kv;
  SAMATTN_CHECK(blocks <= std::numeric_limits<int>::max(), "batch * heads_kv * ceil(kept keys / ",
                T::kBlockN, ") = ", blocks, " exceeds the grid limit of ",
                std::numeric_limits<int>::max(), " blocks");
  auto k = gmem_tensor<const Element>(f.k, f.kept_keys, kHeadDim, p.heads_kv, f.batch,
                                      f.k_row_stride, f.k_head_stride, f.k_batch_stride);
  auto v = gmem_tensor<const Element>(f.v, f.kept_keys, kHeadDim, p.heads_kv, f.batch,
                                      f.v_row_stride, f.v_head_stride, f.v_batch_stride);
  // With no query rows the kernel loads no Q / dO tile, and q / dout may be empty allocations
  // (null, or zero strides): their descriptors then describe k instead, valid and never read.
  const bool no_queries = f.seqlen_q == 0;
  auto q = no_queries
               ? k
               : gmem_tensor<const Element>(f.q, f.seqlen_q, kHeadDim, f.heads_q, f.batch,
                                            f.q_row_stride, f.q_head_stride, f.q_batch_stride);
  auto dout =
      no_queries ? k
                 : gmem_tensor<const Element>(p.dout, f.seqlen_q, kHeadDim, f.heads_q, f.batch,
                                              p.do_row_stride, p.do_head_stride, p.do_batch_stride);
  // Kept key n of dK / dV is physical row n * kv_stride: their store descriptors step kv_stride
  // rows (backward_supports() has checked those strides against the TMA rule).
  auto dk =
      gmem_tensor<Element>(p.dk, f.kept_keys, kHeadDim, p.heads_kv, f.batch,
                           p.dk_row_stride * f.kv_stride, p.dk_head_stride, p.dk_batch_stride);
  auto dv =
      gmem_tensor<Element>(p.dv, f.kept_keys, kHeadDim, p.heads_kv, f.batch,
                           p.dv_row_stride * f.kv_stride, p.dv_head_stride, p.dv_batch_stride);
  const auto q_smem = take<0, 2>(typename T::SmemLayoutQ{});
  const auto q_tile = Shape<typename T::BlockM, typename T::HeadDim>{};
  const auto kv_tile = Shape<typename T::BlockN, typename T::HeadDim>{};
  const auto store_rows = typename T::StoreTile{};
  const KernelParams<T> params{
      p,
      q.shape(),
      k.shape(),
      make_tma_copy(SM90_TMA_LOAD{}, q, q_smem, q_tile, _1{}),
      make_tma_copy(SM90_TMA_LOAD{}, dout, q_smem, q_tile, _1{}),
      make_tma_copy(SM90_TMA_LOAD{}, k, typename T::SmemLayoutKV{}, kv_tile, _1{}),
      make_tma_copy(SM90_TMA_LOAD{}, v, typename T::SmemLayoutKV{}, kv_tile, _1{}),
      make_tma_copy(SM90_TMA_STORE{}, dk, typename T::SmemLayoutStore{}, store_rows, _1{}),
      make_tma_copy(SM90_TMA_STORE{}, dv, typename T::SmemLayoutStore{}, store_rows, _1{}),
  };
  const auto kernel = backward_kernel<T>;
  // Beyond 48 KiB a block must opt in; backward_supports() has checked the device's limit.
  detail::allow_dynamic_smem(reinterpret_cast<const void*>(kernel), T::kSmemBytes);
  kernel<<<static_cast<unsigned>(blocks), BackwardConfig::kThreads, T::kSmemBytes, stream>>>(
      params);
  SAMATTN_CHECK_LAUNCH();
}

}  // namespace bwd

template <DType kDType, int kHeadDim>
void launch_backward(const detail::BackwardKernelParams& p, BackwardVariant variant,
                     cudaStream_t stream) {
  using Element = typename bwd::CuteElement<kDType>::type;
  const detail::ForwardKernelParams& f = p.fwd;
  // The benchmark-only variants, built for bf16 alone and only in a build with
  // -DSAMATTN_HOPPER_TUNING=ON; backward_variant_from_environment() has refused them anywhere
  // else.
#ifdef SAMATTN_HOPPER_TUNING
  constexpr bool kVariantBuilt = kDType == DType::kBFloat16 && backward_has_variants(kHeadDim);
#else
  constexpr bool kVariantBuilt = false;
#endif
  SAMATTN_CHECK(kVariantBuilt || variant == BackwardVariant::kDefault,
                "the Hopper backward variants are built for bfloat16 at head dims 64 and 128 "
                "only, with -DSAMATTN_HOPPER_TUNING=ON");
  SAMATTN_CHECK(!p.skip_zero && !p.skip_convert,
                "the Hopper backward zeroes and converts its own dQ accumulator (skip_zero and "
                "skip_convert are for the tensor-core backward's strided parts)");
  if (p.dq_accum != nullptr) {
    // The chunk layout pads each head's rows to whole blocks.
    const int64_t rows = backward_dq_accum_rows(f.seqlen_q, kHeadDim);
    const int64_t dq_elements = f.batch * f.heads_q * rows * kHeadDim;
    if (dq_elements > 0) {
      SAMATTN_CUDA_CHECK(cudaMemsetAsync(p.dq_accum, 0, dq_elements * sizeof(float), stream));
    }
  }
  if (f.kept_keys > 0) {
    constexpr bool kDefaultAlternates = backward_alternates_dq(kHeadDim);
    using DefaultTraits = bwd::Traits<Element, kHeadDim, kDefaultAlternates>;
    if constexpr (kVariantBuilt) {
      // Deterministic calls compute no dQ here: both schedules are the same kernel then.
      const bool other_schedule = p.dq_accum != nullptr && variant != BackwardVariant::kDefault &&
                                  (variant == BackwardVariant::kAlternateDq) != kDefaultAlternates;
      if (other_schedule) {
        bwd::launch_backward_kernel<bwd::Traits<Element, kHeadDim, !kDefaultAlternates>>(p, stream);
      } else {
        bwd::launch_backward_kernel<DefaultTraits>(p, stream);
      }
    } else {
      bwd::launch_backward_kernel<DefaultTraits>(p, stream);
    }
  }
  if (p.dq_accum != nullptr) {
    launch_backward_dq_convert<Element, kHeadDim>(p, stream);
  } else {
    tensor_core::launch_backward_dq<kDType, kHeadDim>(p, stream);
  }
}

}  // namespace samattn::hopper
