// Internal: the pieces both SIMT forward kernels share: block coordinates, the per-thread online
// softmax state, and the final normalisation and stores.
#pragma once

#include <cstdint>

#include "attention/kernel_params.h"
#include "attention/mask_policy.cuh"
#include "attention/simt/numeric.cuh"

namespace samattn::simt {

// Which (batch, head, query block) a thread block computes. Blocks of the same (batch, head) are
// adjacent; the last query blocks (the most keys when causal) come first so the grid's tail is
// short.
struct BlockCoord {
  int64_t b, h, h_kv, m_begin;
  int rows;  // valid query rows in this block
};

template <int kBlockM>
__device__ __forceinline__ BlockCoord block_coord(const detail::ForwardKernelParams& p) {
  const int64_t num_m_blocks = (p.seqlen_q + kBlockM - 1) / kBlockM;
  const int64_t block = blockIdx.x;
  const int64_t m_block = num_m_blocks - 1 - block % num_m_blocks;
  const int64_t batch_head = block / num_m_blocks;
  BlockCoord c;
  c.b = batch_head / p.heads_q;
  c.h = batch_head % p.heads_q;
  c.h_kv = c.h / p.group_size;
  c.m_begin = m_block * kBlockM;
  c.rows = static_cast<int>(min(static_cast<int64_t>(kBlockM), p.seqlen_q - c.m_begin));
  return c;
}

// Number of logical keys any row of the query block can see under causal alone (the resident
// kernel, which never runs with a window, pattern or element mask).
__device__ __forceinline__ int64_t visible_key_end(const detail::ForwardKernelParams& p,
                                                   const BlockCoord& c) {
  if (!p.causal) return p.kept_keys;
  const int64_t last_visible = (c.m_begin + c.rows - 1) / p.kv_stride;
  return last_visible + 1 < p.kept_keys ? last_visible + 1 : p.kept_keys;
}

// True when some key of [n_begin, n_begin + block_n) is hidden from some row of the block under
// causal alone, so only blocks on the causal diagonal or at the end of the keys pay for masking.
__device__ __forceinline__ bool block_needs_mask(const detail::ForwardKernelParams& p,
                                                 const BlockCoord& c, int64_t n_begin,
                                                 int block_n, int64_t key_end) {
  return n_begin + block_n > key_end ||
         (p.causal && (n_begin + block_n - 1) * p.kv_stride > c.m_begin);
}

// The logical keys any row of the query block can see (causal, window), clipped to the kept
// keys.
__device__ __forceinline__ LogicalKeyRange visible_keys(const detail::ForwardKernelParams& p,
                                                        const BlockCoord& c) {
  return visible_logical_keys(p, c.m_begin, c.rows);
}

// One thread's share of the online softmax: kTM query rows, kTN keys of each key block, kTO
// output columns. Scores arrive in the log2 domain (already multiplied by scale * log2(e)).
template <typename Acc, int kTM, int kTN, int kTO>
struct OnlineSoftmax {
  Acc out[kTM][kTO];
  Acc row_max[kTM];
  Acc row_sum[kTM];  // this thread's partial sum over its keys; reduced in store()

  __device__ __forceinline__ void init() {
#pragma unroll
    for (int i = 0; i < kTM; ++i) {
      row_max[i] = negative_infinity<Acc>();
      row_sum[i] = 0;
#pragma unroll
      for (int c = 0; c < kTO; ++c) out[i][c] = 0;
    }
  }

  // Sets hidden scores to -inf: keys past key_end, and (causal) keys after the query.
  __device__ __forceinline__ void mask(Acc (&score)[kTM][kTN], const detail::ForwardKernelParams& p,
                                       int64_t first_query, int64_t first_key, int64_t key_end) {
#pragma unroll
    for (int i = 0; i < kTM; ++i) {
#pragma unroll
      for (int j = 0; j < kTN; ++j) {
        if (causal_hidden(p, first_query + i, first_key + j, key_end)) {
          score[i][j] = negative_infinity<Acc>();
        }
      }
    }
  }

  // Adds the mask terms of a fill_mask_tile tile laid out (key, query) with row stride
  // kStride: this thread's rows [row0, row0 + kTM) and keys [key0, key0 + kTN).
  template <int kStride>
  __device__ __forceinline__ void add_mask_tile(Acc (&score)[kTM][kTN], const Acc* tile, int row0,
                                                int key0) {
#pragma unroll
    for (int j = 0; j < kTN; ++j) {
      Acc terms[kTM];
      load_vector(terms, tile + (key0 + j) * kStride + row0);
#pragma unroll
      for (int i = 0; i < kTM; ++i) score[i][j] = masked_add(score[i][j], terms[i]);
    }
  }

  // Folds a key block into the running max and sum, rescales the output, and turns the scores
  // into unnormalised probabilities. Row maxima are shared by the 16 lanes of a row group.
  __device__ __forceinline__ void update(Acc (&score)[kTM][kTN]) {
    const Acc neg_inf = negative_infinity<Acc>();
#pragma unroll
    for (int i = 0; i < kTM; ++i) {
      Acc block_max = score[i][0];
#pragma unroll
      for (int j = 1; j < kTN; ++j) block_max = max(block_max, score[i][j]);
      const Acc new_max = max(row_max[i], half_warp_max(block_max));
      // A row that has seen no visible key yet keeps max -inf; subtracting 0 then keeps its
      // probabilities at exactly 0 instead of NaN, while NaN scores still propagate.
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
  }

  // out += P V for one key: p holds P[row][key] of this thread's rows, v its columns of V[key].
  __device__ __forceinline__ void accumulate(const Acc (&p)[kTM], const Acc (&v)[kTO]) {
#pragma unroll
    for (int i = 0; i < kTM; ++i)
#pragma unroll
      for (int c = 0; c < kTO; ++c) out[i][c] += p[i] * v[c];
  }

  // Normalises and writes rows [first_row, first_row + kTM) of the block, columns
  // [first_col, first_col + kTO). A row that saw no key (sum 0) gets zeros and lse -inf; a NaN
  // sum stays NaN.
  template <typename Element>
  __device__ __forceinline__ void store(const detail::ForwardKernelParams& p, const BlockCoord& c,
                                        int first_row, int first_col, bool writes_lse) {
    constexpr double kLn2 = 0.6931471805599453;
    Element* o = static_cast<Element*>(p.out) + c.b * p.o_batch_stride + c.h * p.o_head_stride;
#pragma unroll
    for (int i = 0; i < kTM; ++i) {
      const Acc total = half_warp_sum(row_sum[i]);
      const int64_t query = c.m_begin + first_row + i;
      if (query >= p.seqlen_q) continue;
      const Acc inverse = total == Acc(0) ? Acc(0) : Acc(1) / total;
      Element* o_row = o + query * p.o_row_stride;
#pragma unroll
      for (int col = 0; col < kTO; ++col) {
        if (first_col + col < p.head_dim_v) {
          o_row[first_col + col] = narrow<Element>(out[i][col] * inverse);
        }
      }
      if (p.lse != nullptr && writes_lse) {
        const Acc lse = total == Acc(0)
                            ? negative_infinity<Acc>()
                            : (row_max[i] + log2_acc(total)) * static_cast<Acc>(kLn2);
        static_cast<Acc*>(p.lse)[c.b * p.lse_batch_stride + c.h * p.lse_head_stride + query] = lse;
      }
    }
  }
};

}  // namespace samattn::simt
