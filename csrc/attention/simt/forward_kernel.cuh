// Internal: the SIMT attention forward for wide heads (flash-attention style online softmax on
// CUDA cores). One block computes kBlockM query rows of one (batch, head) and walks the visible
// key blocks once, keeping the running max, sum and output in registers, so no Sq x Sk matrix is
// stored. q.k is accumulated kDimChunk head dimensions at a time and V is staged kValueRows keys
// at a time, so shared memory stays within 48 KiB for any head dimension up to 256.
#pragma once

#include <cstdint>

#include "attention/kernel_params.h"
#include "attention/simt/forward_common.cuh"
#include "attention/simt/forward_config.h"
#include "attention/simt/tile_io.cuh"

namespace samattn::simt {

// kMasked: windows, patterns and element masks (uses_mask_tile): key blocks are classified by
// the mask policy, skipped when no pair is visible, and partial blocks take their mask terms
// from a shared tile. A separate instantiation because the classification alone costs the
// unmasked kernel ~45 registers (measured with ptxas); causal and kv_stride run kMasked = false.
template <typename Element, int kHeadDimBucket, bool kMasked>
__global__ void __launch_bounds__(
    ForwardConfig<typename AccumulatorOf<Element>::type, kHeadDimBucket>::kThreads)
    chunked_forward_kernel(const detail::ForwardKernelParams p) {
  using Acc = typename AccumulatorOf<Element>::type;
  using Cfg = ForwardConfig<Acc, kHeadDimBucket>;
  constexpr int kBlockM = Cfg::kBlockM;
  constexpr int kBlockN = Cfg::kBlockN;
  constexpr int kTM = Cfg::kRowsPerThread;
  constexpr int kTN = Cfg::kKeysPerThread;
  constexpr int kTO = Cfg::kOutColsPerThread;
  constexpr int kThreads = Cfg::kThreads;
  constexpr int kDimChunk = Cfg::kDimChunk;
  constexpr int kValueRows = Cfg::kValueRows;

  __shared__ __align__(16) Acc q_tile[kDimChunk][Cfg::kStrideM];    // (dim, query)
  __shared__ __align__(16) Acc k_tile[kDimChunk][Cfg::kStrideN];    // (dim, key)
  __shared__ __align__(16) Acc p_tile[kBlockN][Cfg::kStrideM];      // (key, query)
  __shared__ __align__(16) Acc v_tile[kValueRows][kHeadDimBucket];  // (key, dim)

  const BlockCoord c = block_coord<kBlockM>(p);
  const Element* q = static_cast<const Element*>(p.q) + c.b * p.q_batch_stride +
                     c.h * p.q_head_stride + c.m_begin * p.q_row_stride;
  const Element* k =
      static_cast<const Element*>(p.k) + c.b * p.k_batch_stride + c.h_kv * p.k_head_stride;
  const Element* v =
      static_cast<const Element*>(p.v) + c.b * p.v_batch_stride + c.h_kv * p.v_head_stride;

  const int row0 = (threadIdx.x / Cfg::kThreadsPerRow) * kTM;  // first query row of the thread
  const int lane_in_row = threadIdx.x % Cfg::kThreadsPerRow;
  const int key0 = lane_in_row * kTN;  // first key of its score tile
  const int col0 = lane_in_row * kTO;  // first output column it owns
  const Acc scale_log2 = static_cast<Acc>(p.scale_log2);

  OnlineSoftmax<Acc, kTM, kTN, kTO> state;
  state.init();
  const LogicalKeyRange key_range =
      kMasked ? visible_keys(p, c) : LogicalKeyRange{0, visible_key_end(p, c)};
  const int64_t key_end = key_range.end;
  for (int64_t n_begin = key_range.begin; n_begin < key_end; n_begin += kBlockN) {
    [[maybe_unused]] bool mask_tile = false;
    if constexpr (kMasked) {
      // Uniform over the block: a key block nobody in it sees costs nothing.
      const detail::BlockClass block_class =
          classify_key_block(p, p.policy, c.b, c.h, c.m_begin, c.rows, n_begin, kBlockN, key_end);
      if (block_class == detail::BlockClass::kSkip) continue;
      mask_tile = block_class != detail::BlockClass::kFull;
      if (mask_tile) {
        // p_tile holds the block's mask terms until the scores are final; the q.k loop's
        // barriers publish them.
        __syncthreads();  // the previous block's readers of p_tile are done
        fill_mask_tile<Acc, kBlockM, kBlockN, 1, Cfg::kStrideM, kThreads>(
            &p_tile[0][0], p, c.b, c.h, c.m_begin, c.rows, n_begin, key_end);
      }
    }
    const int keys = static_cast<int>(min(static_cast<int64_t>(kBlockN), key_end - n_begin));
    const Element* k_block = k + n_begin * p.k_row_stride;

    Acc score[kTM][kTN];
#pragma unroll
    for (int i = 0; i < kTM; ++i)
#pragma unroll
      for (int j = 0; j < kTN; ++j) score[i][j] = 0;
    for (int dim_begin = 0; dim_begin < p.head_dim; dim_begin += kDimChunk) {
      __syncthreads();  // the previous chunk's readers are done with q_tile and k_tile
      load_transposed<kBlockM, kDimChunk, Cfg::kStrideM, kThreads>(&q_tile[0][0], q, p.q_row_stride,
                                                                   c.rows, dim_begin, p.head_dim);
      load_transposed<kBlockN, kDimChunk, Cfg::kStrideN, kThreads>(
          &k_tile[0][0], k_block, p.k_row_stride, keys, dim_begin, p.head_dim);
      __syncthreads();
#pragma unroll
      for (int d = 0; d < kDimChunk; ++d) {
        Acc q_frag[kTM];
        Acc k_frag[kTN];
        load_vector(q_frag, &q_tile[d][row0]);
        load_vector(k_frag, &k_tile[d][key0]);
#pragma unroll
        for (int i = 0; i < kTM; ++i)
#pragma unroll
          for (int j = 0; j < kTN; ++j) score[i][j] += q_frag[i] * k_frag[j];
      }
    }
#pragma unroll
    for (int i = 0; i < kTM; ++i)
#pragma unroll
      for (int j = 0; j < kTN; ++j) score[i][j] *= scale_log2;
    if constexpr (kMasked) {
      if (mask_tile) {
        // Each thread reads exactly the p_tile elements it overwrites below.
        state.template add_mask_tile<Cfg::kStrideM>(score, &p_tile[0][0], row0, key0);
      }
    } else if (block_needs_mask(p, c, n_begin, kBlockN, key_end)) {
      state.mask(score, p, c.m_begin + row0, n_begin + key0, key_end);
    }
    state.update(score);
#pragma unroll
    for (int j = 0; j < kTN; ++j)
#pragma unroll
      for (int i = 0; i < kTM; ++i) p_tile[key0 + j][row0 + i] = score[i][j];

#pragma unroll 1
    for (int value_begin = 0; value_begin < keys; value_begin += kValueRows) {
      __syncthreads();  // p_tile is written; the previous readers of v_tile are done
      load_rows<kValueRows, kHeadDimBucket, kThreads>(
          &v_tile[0][0], v + (n_begin + value_begin) * p.v_row_stride, p.v_row_stride,
          keys - value_begin, p.head_dim_v);
      __syncthreads();
#pragma unroll 8
      for (int n = 0; n < kValueRows; ++n) {
        Acc p_frag[kTM];
        Acc v_frag[kTO];
        load_vector(p_frag, &p_tile[value_begin + n][row0]);
        load_vector(v_frag, &v_tile[n][col0]);
        state.accumulate(p_frag, v_frag);
      }
    }
  }
  state.template store<Element>(p, c, row0, col0, lane_in_row == 0);
}

}  // namespace samattn::simt
