// Internal: the online softmax of the Hopper forward on one consumer warpgroup's S accumulator
// (64 rows x kBlockN keys). wgmma's accumulator order gives each thread two rows (row half
// r = (i / 2) % 2 of value i) and a quarter of their columns; a quad of lanes holds whole rows.
#pragma once

#include <cute/tensor.hpp>

#include "attention/hopper/wgmma_utils.cuh"

namespace samattn::hopper {

struct RowSoftmax {
  float row_max[2];  // running max of the scaled scores (log2 domain); -inf before any key
  float row_sum[2];  // this thread's part of sum exp2(score - row_max); the quad holds the rest

  __device__ __forceinline__ void reset() {
    row_max[0] = row_max[1] = -INFINITY;
    row_sum[0] = row_sum[1] = 0.f;
  }

  // Takes one key block: s holds scores that become log2-domain logits when multiplied by
  // `scale` (softmax_scale * log2 e for raw Q K^T, or 1 when the caller scaled and masked them
  // already). s becomes exp2(s * scale - max): one FFMA and one MUFU per score. rescale[r] is
  // the factor that brings row r's earlier output to the new max.
  template <typename Fragment>
  __device__ __forceinline__ void update(Fragment& s, float scale, float (&rescale)[2]) {
    // Two partial maxima and sums per row shorten the dependent chains.
    float block_max[2][2] = {{-INFINITY, -INFINITY}, {-INFINITY, -INFINITY}};
    CUTE_UNROLL
    for (int i = 0; i < cute::size(s); ++i) {
      block_max[(i / 2) % 2][i % 2] = fmaxf(block_max[(i / 2) % 2][i % 2], s(i));
    }
    float shift[2];
    CUTE_UNROLL
    for (int r = 0; r < 2; ++r) {
      // The max of the raw scores times scale > 0 is the max of the scaled ones (rounding is
      // monotonic). A row that has seen no visible key keeps max -inf; shifting by 0 keeps its
      // masked probabilities at exactly 0 instead of NaN, while NaN scores still poison it.
      const float new_max =
          fmaxf(row_max[r], quad_max(fmaxf(block_max[r][0], block_max[r][1])) * scale);
      shift[r] = new_max == -INFINITY ? 0.f : new_max;
      rescale[r] = fast_exp2(row_max[r] - shift[r]);
      row_max[r] = new_max;
    }
    float sums[2][2] = {{0.f, 0.f}, {0.f, 0.f}};
    CUTE_UNROLL
    for (int i = 0; i < cute::size(s); ++i) {
      const int r = (i / 2) % 2;
      const float x = fmaf(s(i), scale, -shift[r]);
      s(i) = fast_exp2(x);
      sums[r][i % 2] += s(i);
    }
    CUTE_UNROLL
    for (int r = 0; r < 2; ++r) row_sum[r] = row_sum[r] * rescale[r] + (sums[r][0] + sums[r][1]);
  }
};

}  // namespace samattn::hopper
