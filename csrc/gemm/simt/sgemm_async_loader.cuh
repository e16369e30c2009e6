// Internal: one operand's cp.async copies into the SGEMM's ring of k-major slice tiles
// (SgemmConfig::kStages >= 2).
//
// A thread's copies of a slice are `kCopies` apart by a fixed step in both memories: k-fast
// operands copy 4-byte elements (element_slot: kElemRows rows apart, landing transposed),
// mn-fast ones 16-byte vectors (vector_slot: kVectorRows k indices apart). So a thread keeps one
// source pointer, one run-time step between its copies and one shared-memory offset, and the
// copies of an interior slice cost an address add and the LDGSTS each. Slices that cross the
// matrix's end in mn or k, and mn-fast operands without aligned unit-stride vectors, take the
// element-wise path: bounds per element, zero-fill (0 source bytes read from the matrix's base)
// outside.
#pragma once

#include <cstdint>

#include "attention/tensor_core/mma.cuh"
#include "gemm/simt/sgemm_args.h"

namespace samattn::detail::simt {

template <typename Cfg, int kMN>
struct AsyncOperandLoader {
  static constexpr int kBlockK = Cfg::kBlockK;
  static constexpr int kLd = kMN + Cfg::kPad;
  static constexpr int kElems = kMN / Cfg::kElemRows;  // k-fast: 4-byte copies per thread
  static constexpr int kVectors = kMN * kBlockK / 4 / Cfg::kThreads;  // mn-fast: 16-byte ones
  static constexpr int kVectorRows = Cfg::kThreads / (kMN / 4);       // k indices between vectors
  static_assert(kVectors >= 1 && Cfg::kThreads % (kMN / 4) == 0, "vectors tile the slice");
  static constexpr int kFloat = static_cast<int>(sizeof(float));
  // Shared-memory bytes between two copies of a thread: k-fast elements, mn-fast vectors.
  static constexpr int kElemStep = Cfg::kElemRows * kFloat;
  static constexpr int kVectorStep = kVectorRows * kLd * kFloat;

  const float* src;    // the thread's first copy, at the next slice
  const float* base;   // zero-fill source: the matrix's first element
  int64_t copy_step;   // elements between two copies of a thread in global memory
  int64_t slice_step;  // elements from one slice to the next
  int64_t mn_stride, k_stride;
  uint32_t dst;  // byte offset of the first copy within a slice tile
  int first_mn, first_k;
  int mn_left;        // rows (A) or columns (B) of the matrix from the tile's first
  bool k_fast, fast;  // fast: whole vectors / elements inside in mn, no per-copy checks

  __device__ __forceinline__ void init(const float* block, const float* matrix, int64_t mn_stride_,
                                       int64_t k_stride_, bool k_fast_, bool vec, int mn_left_,
                                       int tid) {
    mn_stride = mn_stride_;
    k_stride = k_stride_;
    k_fast = k_fast_;
    mn_left = mn_left_;
    base = matrix;
    fast = mn_left >= kMN && (k_fast || vec);
    const VectorSlot first =
        k_fast ? element_slot<Cfg>(tid, 0) : vector_slot<kMN, kBlockK>(tid, false);
    first_mn = first.mn;
    first_k = first.k;
    src = block + first.mn * mn_stride + first.k * k_stride;
    dst = static_cast<uint32_t>((first.k * kLd + first.mn) * kFloat);
    copy_step = k_fast ? Cfg::kElemRows * mn_stride : kVectorRows * k_stride;
    slice_step = kBlockK * k_stride;
  }

  // Issues the copies of the slice starting at k index k0 into the tile at shared address
  // `tile`, then moves on to the next slice.
  __device__ __forceinline__ void copy(uint32_t tile, int64_t k0, int k) {
    using tensor_core::cp_async_16;
    using tensor_core::cp_async_4;
    const bool k_inside = k0 + kBlockK <= k;
    if (fast && k_inside) {
      if (k_fast) {
#pragma unroll
        for (int c = 0; c < kElems; ++c) {
          cp_async_4(tile + dst + c * kElemStep, src + c * copy_step, true);
        }
      } else {
#pragma unroll
        for (int c = 0; c < kVectors; ++c) {
          cp_async_16(tile + dst + c * kVectorStep, src + c * copy_step, true);
        }
      }
    } else {
      copy_elementwise(tile, k0, k);
    }
    src += slice_step;
  }

 private:
  __device__ __forceinline__ void copy_one(uint32_t to, const float* from, bool inside) {
    tensor_core::cp_async_4(to, inside ? from : base, inside);
  }

  __device__ __forceinline__ void copy_elementwise(uint32_t tile, int64_t k0, int k) {
    if (k_fast) {
#pragma unroll
      for (int c = 0; c < kElems; ++c) {
        const bool inside = first_mn + c * Cfg::kElemRows < mn_left && k0 + first_k < k;
        copy_one(tile + dst + c * kElemStep, src + c * copy_step, inside);
      }
      return;
    }
#pragma unroll
    for (int c = 0; c < kVectors; ++c) {
      const bool k_in = k0 + first_k + c * kVectorRows < k;
      const uint32_t to = tile + dst + c * kVectorStep;
      const float* from = src + c * copy_step;
      if (fast && k_in) {
        tensor_core::cp_async_16(to, from, true);
        continue;
      }
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        copy_one(to + e * kFloat, from + e * mn_stride, k_in && first_mn + e < mn_left);
      }
    }
  }
};

}  // namespace samattn::detail::simt
