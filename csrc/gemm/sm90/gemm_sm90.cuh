// sm_90a GEMM built from CUTLASS 3.x collectives (used as a library, the field's standard
// building blocks for Hopper): a persistent, warp-specialised kernel in which one producer warp
// streams A and B tiles with TMA through a multistage shared-memory pipeline (as many stages as
// fit beside the epilogue) and two consumer warpgroups ("cooperative": both work on one
// 128 x 256 tile) issue wgmma with fp32 accumulators; the epilogue applies alpha/beta and
// stores through TMA. A 2 x 1 cluster multicasts each B tile to both CTAs of the pair.
//
// Problems reach this file normalised by sm90_dispatch.cu: C row-major (unit column stride),
// A and B each with one unit stride; kAKMajor / kBKMajor say which.
#pragma once

#include <cstdint>

// clang-format off
#include <cute/tensor.hpp>
#include <cutlass/cutlass.h>
#include <cutlass/epilogue/collective/collective_builder.hpp>
#include <cutlass/gemm/collective/collective_builder.hpp>
#include <cutlass/gemm/device/gemm_universal_adapter.h>
#include <cutlass/gemm/kernel/gemm_universal.hpp>
// clang-format on

#include "common/check.h"
#include "common/cuda_check.h"
#include "common/device.h"
#include "gemm/sm90/gemm_sm90.h"
#include "samattn/gemm.h"

namespace samattn::detail::sm90 {

template <class Element>
struct TileFor {
  // 16-bit inputs: 128 x 256 x 64 (the wide tile halves B traffic per FLOP).
  using Shape = cute::Shape<cute::_128, cute::_256, cute::_64>;
};
template <>
struct TileFor<float> {
  // TF32: 4-byte elements, so half the K depth keeps a stage the same size.
  using Shape = cute::Shape<cute::_128, cute::_256, cute::_32>;
};

template <class Element, bool kAKMajor, bool kBKMajor>
struct Sm90Gemm {
  using LayoutA =
      std::conditional_t<kAKMajor, cutlass::layout::RowMajor, cutlass::layout::ColumnMajor>;
  using LayoutB =
      std::conditional_t<kBKMajor, cutlass::layout::ColumnMajor, cutlass::layout::RowMajor>;
  using LayoutC = cutlass::layout::RowMajor;
  static constexpr int kAlignment = 16 / static_cast<int>(sizeof(Element));
  using TileShape = typename TileFor<Element>::Shape;
  using ClusterShape = cute::Shape<cute::_2, cute::_1, cute::_1>;

  using CollectiveEpilogue = typename cutlass::epilogue::collective::CollectiveBuilder<
      cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, TileShape, ClusterShape,
      cutlass::epilogue::collective::EpilogueTileAuto, float, float, Element, LayoutC, kAlignment,
      Element, LayoutC, kAlignment, cutlass::epilogue::TmaWarpSpecializedCooperative>::CollectiveOp;

  using CollectiveMainloop = typename cutlass::gemm::collective::CollectiveBuilder<
      cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, Element, LayoutA, kAlignment, Element,
      LayoutB, kAlignment, float, TileShape, ClusterShape,
      cutlass::gemm::collective::StageCountAutoCarveout<static_cast<int>(
          sizeof(typename CollectiveEpilogue::SharedStorage))>,
      cutlass::gemm::KernelTmaWarpSpecializedCooperative>::CollectiveOp;

  using Kernel = cutlass::gemm::kernel::GemmUniversal<cute::Shape<int, int, int, int>,
                                                      CollectiveMainloop, CollectiveEpilogue>;
  using Device = cutlass::gemm::device::GemmUniversalAdapter<Kernel>;

  // Fills a CuTe stride whose modes are (outer, inner, batch); static (unit) modes stay.
  template <class Stride>
  static Stride make_stride3(int64_t s0, int64_t s1, int64_t s2) {
    Stride s{};
    if constexpr (!cute::is_static_v<std::decay_t<decltype(cute::get<0>(s))>>) cute::get<0>(s) = s0;
    if constexpr (!cute::is_static_v<std::decay_t<decltype(cute::get<1>(s))>>) cute::get<1>(s) = s1;
    if constexpr (!cute::is_static_v<std::decay_t<decltype(cute::get<2>(s))>>) cute::get<2>(s) = s2;
    return s;
  }

  static typename Device::Arguments arguments(const GemmParams& p) {
    using StrideA = typename Kernel::StrideA;
    using StrideB = typename Kernel::StrideB;
    using StrideC = typename Kernel::StrideC;
    using StrideD = typename Kernel::StrideD;
    cutlass::KernelHardwareInfo hw;
    hw.device_id = current_device_info().index;
    hw.sm_count = current_device_info().multiprocessors;
    typename Device::Arguments args{
        cutlass::gemm::GemmUniversalMode::kGemm,
        {static_cast<int>(p.m), static_cast<int>(p.n), static_cast<int>(p.k),
         static_cast<int>(p.batch)},
        {static_cast<const Element*>(p.a),
         make_stride3<StrideA>(p.a_row_stride, p.a_col_stride, p.a_batch_stride),
         static_cast<const Element*>(p.b),
         // CUTLASS addresses B as (N, K, batch).
         make_stride3<StrideB>(p.b_col_stride, p.b_row_stride, p.b_batch_stride)},
        {{},
         // beta == 0: the epilogue skips loading C, so C's pointer is only a valid address.
         static_cast<const Element*>(p.c),
         make_stride3<StrideC>(p.c_row_stride, p.c_col_stride, p.c_batch_stride),
         static_cast<Element*>(p.c),
         make_stride3<StrideD>(p.c_row_stride, p.c_col_stride, p.c_batch_stride)},
        hw};
    args.epilogue.thread.alpha = static_cast<float>(p.alpha);
    args.epilogue.thread.beta = static_cast<float>(p.beta);
    return args;
  }

  static bool can_run(const GemmParams& p) {
    return Device::can_implement(arguments(p)) == cutlass::Status::kSuccess;
  }

  static void run(const GemmParams& p, cudaStream_t stream) {
    const typename Device::Arguments args = arguments(p);
    Device op;
    const size_t workspace_bytes = Device::get_workspace_size(args);
    void* workspace = nullptr;
    if (workspace_bytes > 0) {
      SAMATTN_CUDA_CHECK(cudaMallocAsync(&workspace, workspace_bytes, stream));
    }
    cutlass::Status status = op.initialize(args, workspace, stream);
    if (status == cutlass::Status::kSuccess) status = op.run(stream);
    if (workspace) SAMATTN_CUDA_CHECK(cudaFreeAsync(workspace, stream));
    SAMATTN_CHECK(status == cutlass::Status::kSuccess,
                  "sm90 GEMM failed: ", cutlass::cutlassGetStatusString(status));
    SAMATTN_CHECK_LAUNCH();
  }
};

template <DType kDType>
struct Sm90Element;
template <>
struct Sm90Element<DType::kFloat16> {
  using type = cutlass::half_t;
};
template <>
struct Sm90Element<DType::kBFloat16> {
  using type = cutlass::bfloat16_t;
};
template <>
struct Sm90Element<DType::kFloat32> {  // runs in TF32
  using type = float;
};

}  // namespace samattn::detail::sm90
