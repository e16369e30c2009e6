// Internal: the per-warp online softmax of the tensor-core forward, on mma accumulator
// fragments. A lane holds two query rows (g = lane / 4 and g + 8 of its warp's 16); a row's
// values are spread over the 4 lanes of a quad, so row reductions are two xor-shuffles.
#pragma once

#include <cstdint>

#include "attention/tensor_core/mma.cuh"

namespace samattn::tensor_core {

inline constexpr float kLog2e = 1.4426950408889634f;

__device__ __forceinline__ float quad_max(float value) {
  value = fmaxf(value, __shfl_xor_sync(0xffffffffu, value, 1));
  return fmaxf(value, __shfl_xor_sync(0xffffffffu, value, 2));
}

__device__ __forceinline__ float quad_sum(float value) {
  value += __shfl_xor_sync(0xffffffffu, value, 1);
  return value + __shfl_xor_sync(0xffffffffu, value, 2);
}

// Scores s[m][t] of the warp's 16-row tile m and key tile t (8 keys) in C-fragment order:
// s[m][t][0..1] are row g of tile m, s[m][t][2..3] row g + 8. The lane's row r = 2m + (e / 2).
// Multiplies by scale * log2(e) and, when `needs_mask`, sets keys at or past row r's limit
// (key_limit[r], relative to the block) to -inf.
template <int kMTiles, int kNTiles>
__device__ __forceinline__ void scale_and_mask(float (&s)[kMTiles][kNTiles][4], float scale_log2,
                                               bool needs_mask, const int (&key_limit)[2 * kMTiles],
                                               int lane) {
#pragma unroll
  for (int m = 0; m < kMTiles; ++m) {
#pragma unroll
    for (int t = 0; t < kNTiles; ++t) {
#pragma unroll
      for (int e = 0; e < 4; ++e) s[m][t][e] *= scale_log2;
    }
  }
  if (!needs_mask) return;
  const int col0 = 2 * (lane % 4);
#pragma unroll
  for (int m = 0; m < kMTiles; ++m) {
#pragma unroll
    for (int t = 0; t < kNTiles; ++t) {
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        if (t * 8 + col0 + (e & 1) >= key_limit[2 * m + e / 2]) s[m][t][e] = -INFINITY;
      }
    }
  }
}

// Running statistics of the lane's 2 * kMTiles rows in the log2 domain. row_sum is this lane's
// partial sum (its quad's other lanes hold the rest); the quad reduction happens once, at the end.
template <int kMTiles>
struct OnlineSoftmax {
  static constexpr int kRows = 2 * kMTiles;
  float row_max[kRows];
  float row_sum[kRows];

  __device__ __forceinline__ OnlineSoftmax() {
#pragma unroll
    for (int r = 0; r < kRows; ++r) {
      row_max[r] = -INFINITY;
      row_sum[r] = 0.f;
    }
  }

  // Turns the scaled scores into unnormalised probabilities exp2(s - max) in place, folds them
  // into the statistics and returns the factor by which earlier output rows must be rescaled.
  template <int kNTiles>
  __device__ __forceinline__ void update(float (&s)[kMTiles][kNTiles][4], float (&rescale)[kRows]) {
#pragma unroll
    for (int r = 0; r < kRows; ++r) {
      const int m = r / 2;
      const int e = 2 * (r % 2);
      float block_max = s[m][0][e];
#pragma unroll
      for (int t = 0; t < kNTiles; ++t) {
        block_max = fmaxf(block_max, fmaxf(s[m][t][e], s[m][t][e + 1]));
      }
      const float new_max = fmaxf(row_max[r], quad_max(block_max));
      // A row that has seen no visible key keeps max -inf; subtracting 0 then keeps masked
      // probabilities at exactly 0 instead of NaN, while NaN scores still poison the row.
      const float shift = new_max == -INFINITY ? 0.f : new_max;
      rescale[r] = fast_exp2(row_max[r] - shift);
      row_max[r] = new_max;
      float block_sum = 0.f;
#pragma unroll
      for (int t = 0; t < kNTiles; ++t) {
        s[m][t][e] = fast_exp2(s[m][t][e] - shift);
        s[m][t][e + 1] = fast_exp2(s[m][t][e + 1] - shift);
        block_sum += s[m][t][e] + s[m][t][e + 1];
      }
      row_sum[r] = row_sum[r] * rescale[r] + block_sum;
    }
  }
};

}  // namespace samattn::tensor_core
