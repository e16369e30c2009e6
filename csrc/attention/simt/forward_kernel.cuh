// Internal: the fused SIMT attention forward (flash-attention style online softmax on CUDA
// cores). One block computes kBlockM query rows of one (batch, head); it walks the visible key
// blocks once, keeping the running max, sum and output in registers, so no Sq x Sk matrix is
// ever stored. Works for every dtype, head dimension 1..256 and arbitrary strides.
#pragma once

#include <cstdint>

#include "attention/kernel_params.h"
#include "attention/simt/forward_config.h"
#include "attention/simt/numeric.cuh"

namespace samattn::simt {

// Copies rows [0, rows) x columns [dim_begin, dim_begin + kChunk) of a row-major global tile into
// tile[column][row] (transposed, so compute loops read consecutive rows as one vector).
// Rows past `rows` and columns past `dim` are zero-filled.
template <int kRows, int kChunk, int kStride, int kThreads, typename Element, typename Acc>
__device__ __forceinline__ void load_transposed_chunk(Acc (*tile)[kStride], const Element* src,
                                                      int64_t row_stride, int rows, int dim_begin,
                                                      int dim) {
#pragma unroll
  for (int e = threadIdx.x; e < kRows * kChunk; e += kThreads) {
    const int row = e / kChunk;
    const int col = e % kChunk;
    Acc value = 0;
    if (row < rows && dim_begin + col < dim) value = widen(src[row * row_stride + dim_begin + col]);
    tile[col][row] = value;
  }
}

// Copies rows [0, rows) x columns [0, kCols) of a row-major global tile into tile[row][col],
// zero-filling rows past `rows` and columns past `dim`.
template <int kRows, int kCols, int kThreads, typename Element, typename Acc>
__device__ __forceinline__ void load_rows(Acc (*tile)[kCols], const Element* src,
                                          int64_t row_stride, int rows, int dim) {
#pragma unroll 4
  for (int e = threadIdx.x; e < kRows * kCols; e += kThreads) {
    const int row = e / kCols;
    const int col = e % kCols;
    Acc value = 0;
    if (row < rows && col < dim) value = widen(src[row * row_stride + col]);
    tile[row][col] = value;
  }
}

// Number of logical keys any row of the query block [m_begin, m_begin + rows) can see.
__device__ __forceinline__ int64_t visible_key_end(const detail::ForwardKernelParams& p,
                                                   int64_t m_begin, int rows) {
  if (!p.causal) return p.kept_keys;
  const int64_t last_query = m_begin + rows - 1;
  const int64_t last_visible = last_query / p.kv_stride;
  return last_visible + 1 < p.kept_keys ? last_visible + 1 : p.kept_keys;
}

template <typename Element, int kHeadDimBucket>
__global__ void __launch_bounds__(
    ForwardConfig<typename AccumulatorOf<Element>::type, kHeadDimBucket>::kThreads)
    forward_kernel(const detail::ForwardKernelParams p) {
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

  __shared__ __align__(16) Acc q_tile[kDimChunk][Cfg::kStrideM];  // (dim, query)
  __shared__ __align__(16) Acc k_tile[kDimChunk][Cfg::kStrideN];  // (dim, key)
  __shared__ __align__(16) Acc p_tile[kBlockN][Cfg::kStrideM];    // (key, query)
  __shared__ __align__(16) Acc v_tile[kValueRows][kHeadDimBucket];  // (key, dim)

  // Blocks of the same (batch, head) are adjacent; the last query blocks (the most keys when
  // causal) are scheduled first so the tail of the grid is short.
  const int64_t num_m_blocks = (p.seqlen_q + kBlockM - 1) / kBlockM;
  const int64_t block = blockIdx.x;
  const int64_t m_block = num_m_blocks - 1 - block % num_m_blocks;
  const int64_t batch_head = block / num_m_blocks;
  const int64_t b = batch_head / p.heads_q;
  const int64_t h = batch_head % p.heads_q;
  const int64_t h_kv = h / p.group_size;
  const int64_t m_begin = m_block * kBlockM;
  const int rows = static_cast<int>(min(static_cast<int64_t>(kBlockM), p.seqlen_q - m_begin));

  const Element* q = static_cast<const Element*>(p.q) + b * p.q_batch_stride +
                     h * p.q_head_stride + m_begin * p.q_row_stride;
  const Element* k =
      static_cast<const Element*>(p.k) + b * p.k_batch_stride + h_kv * p.k_head_stride;
  const Element* v =
      static_cast<const Element*>(p.v) + b * p.v_batch_stride + h_kv * p.v_head_stride;

  const int row_group = threadIdx.x / Cfg::kThreadsPerRow;
  const int lane_in_row = threadIdx.x % Cfg::kThreadsPerRow;
  const int row0 = row_group * kTM;      // first query row (in the block) of this thread
  const int key0 = lane_in_row * kTN;    // first key (in the key block) of its score tile
  const int col0 = lane_in_row * kTO;    // first output column it owns
  const Acc scale_log2 = static_cast<Acc>(p.scale_log2);
  const Acc neg_inf = negative_infinity<Acc>();

  Acc out[kTM][kTO];
  Acc row_max[kTM];
  Acc row_sum[kTM];  // this thread's partial sum over its keys; reduced at the end
#pragma unroll
  for (int i = 0; i < kTM; ++i) {
    row_max[i] = neg_inf;
    row_sum[i] = 0;
#pragma unroll
    for (int c = 0; c < kTO; ++c) out[i][c] = 0;
  }

  const int64_t key_end = visible_key_end(p, m_begin, rows);
  for (int64_t n_begin = 0; n_begin < key_end; n_begin += kBlockN) {
    const int keys = static_cast<int>(min(static_cast<int64_t>(kBlockN), key_end - n_begin));
    const Element* k_block = k + n_begin * p.k_row_stride;

    // Scores S = Q K^T for this key block, accumulated over the head dimension in chunks.
    Acc score[kTM][kTN];
#pragma unroll
    for (int i = 0; i < kTM; ++i)
#pragma unroll
      for (int j = 0; j < kTN; ++j) score[i][j] = 0;

    for (int dim_begin = 0; dim_begin < p.head_dim; dim_begin += kDimChunk) {
      __syncthreads();  // the previous chunk's readers are done with q_tile and k_tile
      load_transposed_chunk<kBlockM, kDimChunk, Cfg::kStrideM, kThreads>(
          q_tile, q, p.q_row_stride, rows, dim_begin, p.head_dim);
      load_transposed_chunk<kBlockN, kDimChunk, Cfg::kStrideN, kThreads>(
          k_tile, k_block, p.k_row_stride, keys, dim_begin, p.head_dim);
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

    // Mask (only blocks that straddle the causal diagonal or the end of the keys pay for it),
    // then the online softmax update in the log2 domain.
    const bool needs_mask =
        n_begin + kBlockN > key_end ||
        (p.causal && (n_begin + kBlockN - 1) * p.kv_stride > m_begin);
#pragma unroll
    for (int i = 0; i < kTM; ++i) {
      const int64_t query = m_begin + row0 + i;
#pragma unroll
      for (int j = 0; j < kTN; ++j) {
        score[i][j] *= scale_log2;
        if (needs_mask) {
          const int64_t key = n_begin + key0 + j;
          const bool hidden = key >= key_end || (p.causal && key * p.kv_stride > query);
          if (hidden) score[i][j] = neg_inf;
        }
      }
    }
#pragma unroll
    for (int i = 0; i < kTM; ++i) {
      Acc block_max = score[i][0];
#pragma unroll
      for (int j = 1; j < kTN; ++j) block_max = max(block_max, score[i][j]);
      const Acc new_max = max(row_max[i], half_warp_max(block_max));
      // A row that has seen no visible key yet keeps max -inf; subtracting 0 then keeps the
      // masked probabilities at exactly 0 instead of NaN (and still lets NaN scores through).
      const Acc shift = new_max == neg_inf ? Acc(0) : new_max;
      const Acc rescale = exp2_acc(row_max[i] - shift);
      row_max[i] = new_max;
      Acc block_sum = 0;
#pragma unroll
      for (int j = 0; j < kTN; ++j) {
        score[i][j] = exp2_acc(score[i][j] - shift);
        block_sum += score[i][j];
      }
      row_sum[i] = row_sum[i] * rescale + block_sum;
#pragma unroll
      for (int c = 0; c < kTO; ++c) out[i][c] *= rescale;
    }
#pragma unroll
    for (int j = 0; j < kTN; ++j)
#pragma unroll
      for (int i = 0; i < kTM; ++i) p_tile[key0 + j][row0 + i] = score[i][j];

    // out += P V, with V staged kValueRows keys at a time.
#pragma unroll 1
    for (int value_begin = 0; value_begin < kBlockN; value_begin += kValueRows) {
      if (value_begin >= keys) break;
      __syncthreads();  // p_tile is written; the previous readers of v_tile are done
      load_rows<kValueRows, kHeadDimBucket, kThreads>(
          v_tile, v + (n_begin + value_begin) * p.v_row_stride, p.v_row_stride,
          keys - value_begin, p.head_dim_v);
      __syncthreads();
#pragma unroll 8
      for (int n = 0; n < kValueRows; ++n) {
        Acc p_frag[kTM];
        Acc v_frag[kTO];
        load_vector(p_frag, &p_tile[value_begin + n][row0]);
        load_vector(v_frag, &v_tile[n][col0]);
#pragma unroll
        for (int i = 0; i < kTM; ++i)
#pragma unroll
          for (int c = 0; c < kTO; ++c) out[i][c] += p_frag[i] * v_frag[c];
      }
    }
  }

  // Normalise and write. A row that saw no key (sum 0) gets zeros and lse = -inf; a NaN sum
  // stays NaN.
  Element* o = static_cast<Element*>(p.out) + b * p.o_batch_stride + h * p.o_head_stride;
  constexpr double kLn2 = 0.6931471805599453;
#pragma unroll
  for (int i = 0; i < kTM; ++i) {
    const Acc total = half_warp_sum(row_sum[i]);
    const int64_t query = m_begin + row0 + i;
    if (query >= p.seqlen_q) continue;
    const Acc inverse = total == Acc(0) ? Acc(0) : Acc(1) / total;
    Element* o_row = o + query * p.o_row_stride;
#pragma unroll
    for (int c = 0; c < kTO; ++c) {
      if (col0 + c < p.head_dim_v) o_row[col0 + c] = narrow<Element>(out[i][c] * inverse);
    }
    if (p.lse != nullptr && lane_in_row == 0) {
      const Acc lse = total == Acc(0) ? neg_inf
                                      : (row_max[i] + log2_acc(total)) * static_cast<Acc>(kLn2);
      static_cast<Acc*>(p.lse)[(b * p.heads_q + h) * p.seqlen_q + query] = lse;
    }
  }
}

}  // namespace samattn::simt
