// Internal: the sm80 tensor-core GEMM (mma.sync), fp16/bf16 with fp32 accumulation and TF32.
//
// A block of 8 warps computes a 128 x 128 tile of C; warp (wm, wn) of the 2 x 4 grid owns a
// 64 x 32 piece: 4 x 4 mma tiles of 16 x 8, 64 fp32 accumulators per lane. K advances in
// slices of 64 bytes per row (32 fp16/bf16 or 16 fp32 elements) through a kStages-deep ring
// of shared-memory stages filled by cp.async (operand_tile.cuh): each iteration waits for
// the oldest stage, issues the loads of the stage kStages - 1 ahead into the slot freed by the
// previous iteration (one barrier per slice), then runs the slice's two mma k steps from
// ldmatrix fragments. Both operands may be k-major or mn-major (a run-time choice per
// operand, so one kernel per dtype covers every layout); tails in m, n and k are zero-filled
// by the loads and masked in the epilogue. Output tiles are visited in groups of
// kRasterGroup tile rows so that concurrently running blocks share A rows and B columns in L2.
#pragma once

#include <cstdint>
#include <type_traits>

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "attention/tensor_core/mma.cuh"
#include "gemm/sm80/gemm_sm80.h"
#include "gemm/sm80/operand_tile.cuh"

namespace samattn::detail::sm80 {

template <typename Element>
struct KernelShape {
  static constexpr int kElemBytes = static_cast<int>(sizeof(Element));
  static constexpr int kBlockK = kKBytes / kElemBytes;
  static constexpr int kKSteps = kKBytes / kMmaKBytes;  // mma k steps per slice
  static constexpr int kStages = 4;
  static constexpr int kThreads = kLoaderThreads;
  static constexpr int kWarpsM = 2, kWarpsN = 4;
  static constexpr int kWarpM = kTileMN / kWarpsM, kWarpN = kTileMN / kWarpsN;  // 64 x 32
  static constexpr int kMmaM = kWarpM / 16, kMmaN = kWarpN / 8;  // mma tiles per warp
  static constexpr int kFragsN = kWarpN / 16;                    // x4 loads of B per k step
  static constexpr int kStageBytes = 2 * kTileBytes;             // A then B
  static constexpr int kSmemBytes = kStages * kStageBytes;
  static constexpr int kRasterGroup = 8;
  static_assert(kWarpsM * kWarpsN * 32 == kThreads, "8 warps");
};

template <typename Element>
__device__ __forceinline__ void mma(float (&d)[4], const uint32_t (&a)[4], uint32_t b0,
                                    uint32_t b1) {
  if constexpr (std::is_same_v<Element, float>) {
    tensor_core::mma_m16n8k8_tf32(d, a, b0, b1);
  } else {
    tensor_core::mma_m16n8k16<Element>(d, a, b0, b1);
  }
}

// fp32 bit patterns rounded to TF32 (round to nearest) for the tensor cores; 16-bit
// fragments pass unchanged.
template <typename Element>
__device__ __forceinline__ void prepare_fragment(uint32_t (&r)[4]) {
  if constexpr (std::is_same_v<Element, float>) {
#pragma unroll
    for (int q = 0; q < 4; ++q) r[q] = tensor_core::to_tf32(__uint_as_float(r[q]));
  }
}

__device__ __forceinline__ float to_float(float x) { return x; }
__device__ __forceinline__ float to_float(__half x) { return __half2float(x); }
__device__ __forceinline__ float to_float(__nv_bfloat16 x) { return __bfloat162float(x); }

template <typename Element>
__device__ __forceinline__ Element from_float(float x) {
  if constexpr (std::is_same_v<Element, __half>) {
    return __float2half_rn(x);
  } else if constexpr (std::is_same_v<Element, __nv_bfloat16>) {
    return __float2bfloat16_rn(x);
  } else {
    return x;
  }
}

// Writes alpha * (v0, v1) (+ beta * C) to C(row, col) and C(row, col + 1) where inside.
template <typename Element>
__device__ __forceinline__ void store_pair(const GemmArgs& args, Element* c, int row, int col,
                                           float v0, float v1) {
  if (row >= args.m || col >= args.n) return;
  Element* dst = c + row * args.c_rs + col * args.c_cs;
  v0 *= args.alpha;
  v1 *= args.alpha;
  const bool read_c = args.beta != 0.0f;
  if (args.c_pairs && col + 1 < args.n) {
    if (read_c) {
      v0 = fmaf(args.beta, to_float(dst[0]), v0);
      v1 = fmaf(args.beta, to_float(dst[1]), v1);
    }
    if constexpr (std::is_same_v<Element, float>) {
      *reinterpret_cast<float2*>(dst) = make_float2(v0, v1);
    } else {
      const uint32_t packed = tensor_core::pack<Element>(v0, v1);
      *reinterpret_cast<uint32_t*>(dst) = packed;
    }
    return;
  }
  if (read_c) v0 = fmaf(args.beta, to_float(dst[0]), v0);
  dst[0] = from_float<Element>(v0);
  if (col + 1 < args.n) {
    Element* next = dst + args.c_cs;
    if (read_c) v1 = fmaf(args.beta, to_float(*next), v1);
    *next = from_float<Element>(v1);
  }
}

template <typename Element>
__device__ __forceinline__ void gemm_block(const GemmArgs& args) {
  using Shape = KernelShape<Element>;
  constexpr int kEB = Shape::kElemBytes;
  extern __shared__ __align__(128) uint8_t smem[];
  const uint32_t smem_base = shared_address(smem);

  // Grouped raster: kRasterGroup tile rows at a time, column by column.
  const int id = static_cast<int>(blockIdx.x);
  const int group_tiles = Shape::kRasterGroup * args.tiles_n;
  const int first_m = id / group_tiles * Shape::kRasterGroup;
  const int group_rows = min(args.tiles_m - first_m, Shape::kRasterGroup);
  const int in_group = id % group_tiles;
  const int m0 = (first_m + in_group % group_rows) * kTileMN;
  const int n0 = in_group / group_rows * kTileMN;
  const int64_t batch = blockIdx.y;

  const int tid = static_cast<int>(threadIdx.x);
  OperandLoader<Element> load_a, load_b;
  load_a.init(args.a, batch, m0, args.m, args.k, tid);
  load_b.init(args.b, batch, n0, args.n, args.k, tid);
  const int k_tiles = (args.k + Shape::kBlockK - 1) / Shape::kBlockK;
  auto load_stage = [&](int stage) {
    const uint32_t a_tile = smem_base + stage * Shape::kStageBytes;
    load_a.load(args.a, a_tile);
    load_b.load(args.b, a_tile + kTileBytes);
  };
#pragma unroll
  for (int s = 0; s < Shape::kStages - 1; ++s) {
    if (s < k_tiles) load_stage(s);
    tensor_core::cp_async_commit();
  }

  // This lane's fragment address (byte offset in a stage) of the warp's first mma block per
  // k step; the other blocks are a fixed step away (block_offset).
  const int warp = tid / 32, lane = tid % 32;
  const int wm = warp % Shape::kWarpsM, wn = warp / Shape::kWarpsM;
  uint32_t a_offset[Shape::kKSteps], b_offset[Shape::kKSteps];
#pragma unroll
  for (int kk = 0; kk < Shape::kKSteps; ++kk) {
    a_offset[kk] = fragment_offset<kEB>(args.a.mn_major, wm * Shape::kWarpM, kk, lane);
    b_offset[kk] = kTileBytes + fragment_offset<kEB>(args.b.mn_major, wn * Shape::kWarpN, kk, lane);
  }

  float acc[Shape::kMmaM][Shape::kMmaN][4];
#pragma unroll
  for (int i = 0; i < Shape::kMmaM; ++i)
#pragma unroll
    for (int j = 0; j < Shape::kMmaN; ++j)
#pragma unroll
      for (int q = 0; q < 4; ++q) acc[i][j][q] = 0.0f;

  for (int kt = 0; kt < k_tiles; ++kt) {
    tensor_core::cp_async_wait<Shape::kStages - 2>();
    __syncthreads();
    const int ahead = kt + Shape::kStages - 1;
    if (ahead < k_tiles) load_stage(ahead % Shape::kStages);
    tensor_core::cp_async_commit();

    const uint32_t stage = smem_base + (kt % Shape::kStages) * Shape::kStageBytes;
#pragma unroll
    for (int kk = 0; kk < Shape::kKSteps; ++kk) {
      uint32_t a[Shape::kMmaM][4], b[Shape::kFragsN][4];
#pragma unroll
      for (int i = 0; i < Shape::kMmaM; ++i) {
        load_fragment<kEB>(a[i], stage, block_offset<kEB>(a_offset[kk], args.a.mn_major, i),
                           args.a.mn_major);
        prepare_fragment<Element>(a[i]);
      }
#pragma unroll
      for (int j = 0; j < Shape::kFragsN; ++j) {
        load_fragment<kEB>(b[j], stage, block_offset<kEB>(b_offset[kk], args.b.mn_major, j),
                           args.b.mn_major);
        prepare_fragment<Element>(b[j]);
      }
#pragma unroll
      for (int i = 0; i < Shape::kMmaM; ++i)
#pragma unroll
        for (int j = 0; j < Shape::kMmaN; ++j) {
          const uint32_t(&bj)[4] = b[j / 2];
          mma<Element>(acc[i][j], a[i], bj[j % 2], bj[2 + j % 2]);
        }
    }
  }
  tensor_core::cp_async_wait<0>();

  // Epilogue: lane (g, t) holds rows g and g + 8, columns 2t and 2t + 1 of each mma tile.
  Element* c = static_cast<Element*>(args.c) + batch * args.c_bs;
  const int g = lane / 4, t = lane % 4;
#pragma unroll
  for (int i = 0; i < Shape::kMmaM; ++i) {
    const int row = m0 + wm * Shape::kWarpM + 16 * i + g;
#pragma unroll
    for (int j = 0; j < Shape::kMmaN; ++j) {
      const int col = n0 + wn * Shape::kWarpN + 8 * j + 2 * t;
      store_pair(args, c, row, col, acc[i][j][0], acc[i][j][1]);
      store_pair(args, c, row + 8, col, acc[i][j][2], acc[i][j][3]);
    }
  }
}

// The body exists for sm80+ only (cp.async, ldmatrix, bf16/tf32 mma); the host never launches
// it on older devices, and an older build traps rather than silently writing nothing.
template <typename Element>
__global__ void __launch_bounds__(KernelShape<Element>::kThreads, 2)
    gemm_kernel(const __grid_constant__ GemmArgs args) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  gemm_block<Element>(args);
#else
  __trap();
#endif
}

}  // namespace samattn::detail::sm80
