// Internal: the fp32 SGEMM's kernel arguments and tile configurations (host and device).
#pragma once

#include <cstdint>

#include <cuda_runtime_api.h>

#include "common/host_device.h"
#include "samattn/gemm.h"

namespace samattn::detail::simt {

// The problem as the kernel sees it: C row-major-like (the smaller of C's strides is the
// column stride; a column-major C runs as C^T = B^T A^T) and m, n, k below 2^31.
struct SgemmArgs {
  const float* a;
  const float* b;
  float* c;
  int m, n, k;
  int64_t a_rs, a_cs, a_bs, b_rs, b_cs, b_bs, c_rs, c_cs, c_bs;
  float alpha, beta;
  bool a_m_fast;  // A walked along m (column-major A), else along k
  bool b_k_fast;  // B walked along k (column-major B), else along n
  bool a_vec;     // A's fast stride is 1 and 16-byte vectors along it are aligned
  bool b_vec;
  bool c_vec;  // C's column stride is 1 and 16-byte vectors along n are aligned
};

// True when the SGEMM kernels take `params` (float32, m, n, k < 2^31, at most 65535 row tiles
// of the largest block height and 65535 batches); other float32 calls run the generic kernel.
bool sgemm_supports(const GemmParams& params);

// Normalises a float32 GemmParams that sgemm_supports accepted.
SgemmArgs make_sgemm_args(const GemmParams& params);

// A block tile of kBlockM x kBlockN x kBlockK, warps of kWarpM x kWarpN, lanes of kThreadM x
// kThreadN accumulators (4 x 4 sub-tiles); kMinBlocksPerSm bounds the registers. With
// kPrefetchAcrossSlices a lane loads the next slice's first fragments right after the slice
// barrier and before the current slice's last FMAs (sgemm_kernel.cuh), else after the barrier.
// kStages = 0: slices go through registers into two shared buffers; kStages >= 2: cp.async
// copies them straight into a ring of kStages buffers, kStages - 1 slices ahead (the prefetch
// across slices is then always on). kSplitBarrier (register staging with the prefetch across
// slices): the slice barrier is an mbarrier; a thread stores the next slice and arrives before
// k step kStoreStep, and waits halfway through the last k step's FMAs, so a warp waits only for
// warps more than that far behind it.
template <int kBlockM_, int kBlockN_, int kBlockK_, int kWarpM_, int kWarpN_, int kThreadM_,
          int kThreadN_, int kMinBlocksPerSm_, bool kPrefetchAcrossSlices_ = false,
          int kStages_ = 0, bool kSplitBarrier_ = false, int kStoreStep_ = kBlockK_ - 1>
struct SgemmConfig {
  static constexpr int kBlockM = kBlockM_, kBlockN = kBlockN_, kBlockK = kBlockK_;
  static constexpr int kWarpM = kWarpM_, kWarpN = kWarpN_;
  static constexpr int kThreadM = kThreadM_, kThreadN = kThreadN_;
  static constexpr int kMinBlocksPerSm = kMinBlocksPerSm_;
  static constexpr int kStages = kStages_;
  static constexpr bool kPrefetchAcrossSlices = kPrefetchAcrossSlices_ || kStages > 0;
  static constexpr bool kSplitBarrier = kSplitBarrier_;
  static constexpr int kStoreStep = kStoreStep_;
  // A split barrier with the store before the last k step needs a third buffer: a thread may
  // then store while others still read the previous slice (they have only arrived).
  static constexpr int kBuffers = kStages > 0 ? kStages
                                              : (kSplitBarrier&& kStoreStep < kBlockK - 1 ? 3 : 2);
  static_assert(kStoreStep >= 1 && kStoreStep < kBlockK,
                "the next slice is stored after the first k step's fragment loads");
  static_assert(kStages == 0 || kStages >= 2, "a cp.async ring needs two or more stages");
  static_assert(!kSplitBarrier || (kStages == 0 && kPrefetchAcrossSlices_),
                "the split barrier is a variant of the register-staged prefetch");
  static constexpr int kWarpsM = kBlockM / kWarpM, kWarpsN = kBlockN / kWarpN;
  static constexpr int kThreads = 32 * kWarpsM * kWarpsN;
  static constexpr int kLanesM = kWarpM / kThreadM, kLanesN = kWarpN / kThreadN;
  static constexpr int kSubM = kThreadM / 4, kSubN = kThreadN / 4;  // 4 x 4 sub-tiles
  static constexpr int kSubStrideM = kWarpM / kSubM, kSubStrideN = kWarpN / kSubN;
  static constexpr int kPad = 4;  // floats after each smem row: conflict-free transposed stores
  static constexpr int kLdA = kBlockM + kPad, kLdB = kBlockN + kPad;
  static constexpr int kVecsA = kBlockM * kBlockK / 4 / kThreads;  // float4 per thread and slice
  static constexpr int kVecsB = kBlockN * kBlockK / 4 / kThreads;
  static_assert(kBlockM % kWarpM == 0 && kBlockN % kWarpN == 0, "warps tile the block");
  static_assert(kLanesM * kLanesN == 32, "lanes tile the warp");
  static_assert(kThreadM % 4 == 0 && kThreadN % 4 == 0, "4 x 4 sub-tiles");
  static_assert(kVecsA >= 1 && kVecsA * kThreads * 4 == kBlockM * kBlockK, "A loader split");
  static_assert(kVecsB >= 1 && kVecsB * kThreads * 4 == kBlockN * kBlockK, "B loader split");
  static_assert(kBlockK % 4 == 0, "k-fast operands load float4 along k");
  // cp.async copies of a k-fast operand: element (mn, k) of a slice by thread
  // (mn % kElemRows) * kBlockK + k, kElemsA (kElemsB) elements per thread.
  static constexpr int kElemRows = kThreads / kBlockK;
  static constexpr int kElemsA = kBlockM / kElemRows, kElemsB = kBlockN / kElemRows;
  static_assert(kStages == 0 || (kThreads % kBlockK == 0 && kBlockM % kElemRows == 0 &&
                                 kBlockN % kElemRows == 0),
                "element copies tile the slice");
  // kBuffers slices of A and B (dynamic shared memory; above 48 KiB the launch opts in), then
  // the split barrier's 8-byte mbarrier.
  static constexpr int kSliceBytes =
      kBuffers * kBlockK * (kLdA + kLdB) * static_cast<int>(sizeof(float));
  static constexpr int kSmemBytes = kSliceBytes + (kSplitBarrier ? 8 : 0);
  static_assert(!kPrefetchAcrossSlices || kBlockK % 2 == 0, "fragment buffers alternate per k");
};

// Where a loader vector of a slice goes: four consecutive elements along the operand's fast
// dimension starting at row (A) or column (B) `mn` of the block tile and `k` of the slice.
struct VectorSlot {
  int mn, k;
};

// Vector `index` of a kMN x kK slice walked along k (k_fast) or along mn: consecutive indices
// take consecutive vectors along the fast dimension (coalesced loads).
template <int kMN, int kK>
SAMATTN_HOST_DEVICE VectorSlot vector_slot(int index, bool k_fast) {
  if (k_fast) return {index / (kK / 4), index % (kK / 4) * 4};
  return {index % (kMN / 4) * 4, index / (kMN / 4)};
}

// Element `e` of thread `tid`'s cp.async copies of a k-fast operand's slice (kStages > 0): a
// warp's lanes take kBlockK consecutive k of 32 / kBlockK rows (32-byte segments of global
// memory), landing transposed in banks 4 k + mn, conflict-free for kBlockK = 8.
template <typename Cfg>
SAMATTN_HOST_DEVICE VectorSlot element_slot(int tid, int e) {
  return {tid / Cfg::kBlockK + e * Cfg::kElemRows, tid % Cfg::kBlockK};
}

// The block-tile row and column of thread `tid`'s first 4 x 4 sub-tile; its sub-tile (i, j)
// starts kSubStrideM * i rows and kSubStrideN * j columns further. Warps are laid out
// kWarpsM x kWarpsN (m fastest), lanes kLanesM x kLanesN (m fastest): a quarter-warp's lanes
// read consecutive float4 of A (or of B) or one broadcast float4, never a bank conflict.
struct LaneOrigin {
  int row, col;
};

template <typename Cfg>
SAMATTN_HOST_DEVICE LaneOrigin lane_origin(int tid) {
  const int warp = tid / 32, lane = tid % 32;
  const int wm = warp % Cfg::kWarpsM, wn = warp / Cfg::kWarpsM;
  const int lm = lane % Cfg::kLanesM, ln = lane / Cfg::kLanesM;
  return {wm * Cfg::kWarpM + lm * 4, wn * Cfg::kWarpN + ln * 4};
}

// The tile shapes bench_gemm --sgemm-variants measures against cuBLAS; the library runs
// ShippedSgemm, and FewTilesSgemm for problems with fewer ShippedSgemm tiles than SMs (sgemm.cu).
// Name format: block MxNxK, warp MxN, lane MxN, "_pf" = kPrefetchAcrossSlices, "Stages" = a
// cp.async ring, "Split" = kSplitBarrier ("StoreN": kStoreStep = N).
using Sgemm128x128x8 = SgemmConfig<128, 128, 8, 64, 32, 8, 8, 2>;
using Sgemm128x128x8Lane8x16Pf = SgemmConfig<128, 128, 8, 64, 64, 8, 16, 2, true>;
using Sgemm128x256x8 = SgemmConfig<128, 256, 8, 64, 64, 8, 16, 1>;
using Sgemm128x256x8Pf = SgemmConfig<128, 256, 8, 64, 64, 8, 16, 1, true>;
using Sgemm128x256x16Pf = SgemmConfig<128, 256, 16, 64, 64, 8, 16, 1, true>;
using Sgemm128x256x16Warps16 = SgemmConfig<128, 256, 16, 64, 32, 8, 8, 1>;  // 512 threads
using Sgemm256x128x8Pf = SgemmConfig<256, 128, 8, 64, 64, 8, 16, 1, true>;
using Sgemm128x256x8PfSplit = SgemmConfig<128, 256, 8, 64, 64, 8, 16, 1, true, 0, true>;
using Sgemm128x256x8PfSplitStore5 = SgemmConfig<128, 256, 8, 64, 64, 8, 16, 1, true, 0, true, 5>;
using Sgemm128x256x8PfSplitStore3 = SgemmConfig<128, 256, 8, 64, 64, 8, 16, 1, true, 0, true, 3>;
using Sgemm128x256x16PfSplit = SgemmConfig<128, 256, 16, 64, 64, 8, 16, 1, true, 0, true>;
using Sgemm256x128x8PfSplit = SgemmConfig<256, 128, 8, 64, 64, 8, 16, 1, true, 0, true>;
using Sgemm128x256x8Stages4 = SgemmConfig<128, 256, 8, 64, 64, 8, 16, 1, true, 4>;
using Sgemm128x256x16Stages3 = SgemmConfig<128, 256, 16, 64, 64, 8, 16, 1, true, 3>;
using Sgemm128x128x8Stages4 = SgemmConfig<128, 128, 8, 64, 32, 8, 8, 2, true, 4>;
using Sgemm128x128x16Stages3 = SgemmConfig<128, 128, 16, 64, 32, 8, 8, 2, true, 3>;
using Sgemm128x128x8Lane8x16Stages4 = SgemmConfig<128, 128, 8, 64, 64, 8, 16, 2, true, 4>;
// H200, bench_gemm --sgemm-variants: 128x256x8 with the cross-slice prefetch measured 0.89-0.905x
// cuBLAS at 4096^3 and 8192^3 over five runs; the cp.async rings (`Stages`) 0.84-0.88 (commit
// 9cfc856). Its split-barrier form with the next slice stored before k step 5 (three buffers)
// measured 0.909 / 0.916 in the same run as 0.895 / 0.900 for the plain one (commit 8d4d5b7;
// benchmarks/NOTES.md).
using ShippedSgemm = Sgemm128x256x8PfSplitStore5;
using FewTilesSgemm = Sgemm128x128x8;

// The largest block height of the configurations above (for sgemm_supports' grid limit).
inline constexpr int kSgemmMaxBlockM = 128;

// Runs a call sgemm_supports accepted with configuration Cfg (defined in sgemm_launch.cuh).
template <typename Cfg>
void launch_sgemm(const GemmParams& params, cudaStream_t stream);

}  // namespace samattn::detail::simt
