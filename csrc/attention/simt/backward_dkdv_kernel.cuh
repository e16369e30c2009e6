// Internal: the SIMT backward's dK/dV kernel. One block owns kBlockN keys of one (batch, key
// head) and keeps their dK and dV in registers while it walks every query head of the group and
// every query block that sees those keys (causal skips the rest): it recomputes P^T and
// (dout . v)^T for the pair, adds P^T dout to dV and dS^T Q to dK. Each block owns its rows, so
// there are no atomics and the sum order is fixed. It also writes the zero rows of keys that
// kv_stride skips.
#pragma once

#include <cstdint>

#include "attention/backward_kernel_params.h"
#include "attention/simt/backward_common.cuh"
#include "attention/simt/backward_config.h"

namespace samattn::simt {

// Which (batch, key head, key block) a thread block computes. Key blocks of one head are
// adjacent, first blocks first: under a causal mask they see the most queries.
struct KeyBlockCoord {
  int64_t b, h_kv, n_begin;
  int keys;  // valid logical keys in this block
};

template <int kBlockN>
__device__ __forceinline__ KeyBlockCoord key_block_coord(const detail::BackwardKernelParams& p) {
  const int64_t num_n_blocks = (p.fwd.kept_keys + kBlockN - 1) / kBlockN;
  const int64_t block = blockIdx.x;
  const int64_t batch_head = block / num_n_blocks;
  KeyBlockCoord c;
  c.b = batch_head / p.heads_kv;
  c.h_kv = batch_head % p.heads_kv;
  c.n_begin = (block % num_n_blocks) * kBlockN;
  c.keys = static_cast<int>(min(static_cast<int64_t>(kBlockN), p.fwd.kept_keys - c.n_begin));
  return c;
}

// Stores a thread's dK (times the softmax scale) or dV rows, and zeros in the physical rows
// [first_row, end_row) of the block that kv_stride skips.
template <typename Element, typename Acc, int kTN, int kTO, int kThreads>
__device__ __forceinline__ void store_key_rows(Element* dst, int64_t row_stride,
                                               const Acc (&acc)[kTN][kTO], Acc scale,
                                               const detail::BackwardKernelParams& p,
                                               int64_t first_key, int col0, int cols,
                                               int64_t first_row, int64_t end_row) {
  const int64_t stride = p.fwd.kv_stride;
#pragma unroll
  for (int i = 0; i < kTN; ++i) {
    const int64_t key = first_key + i;
    if (key >= p.fwd.kept_keys) continue;
    Element* row = dst + key * stride * row_stride;
#pragma unroll
    for (int col = 0; col < kTO; ++col) {
      if (col0 + col < cols) row[col0 + col] = narrow<Element>(acc[i][col] * scale);
    }
  }
  if (stride == 1) return;
  const int64_t elements = (end_row - first_row) * cols;
  for (int64_t e = threadIdx.x; e < elements; e += kThreads) {
    const int64_t row = first_row + e / cols;
    if (row % stride != 0) dst[row * row_stride + e % cols] = narrow<Element>(Acc(0));
  }
}

// The query rows [begin, end) that can see some logical key of [n_begin, n_begin + keys) by
// causal and the window (patterns and the element mask only thin them out).
struct QueryRange {
  int64_t begin, end;
};

__device__ __forceinline__ QueryRange visible_queries(const detail::ForwardKernelParams& f,
                                                      int64_t n_begin, int keys) {
  if (keys <= 0) return {0, 0};
  // Both ends of a key's query span grow with the key: the first key's begin, the last's end.
  const int64_t begin =
      detail::visible_query_span(f.policy, n_begin, f.seqlen_q, f.kv_stride).begin;
  int64_t end =
      detail::visible_query_span(f.policy, n_begin + keys - 1, f.seqlen_q, f.kv_stride).end;
  if (end < begin) end = begin;
  return {begin, end};
}

// kMasked: windows, patterns and element masks, as in the forward's chunked kernel (query
// blocks classified by the mask policy and skipped when they see none of the keys, a shared mask
// tile for partial blocks); a separate instantiation so the unmasked kernel keeps its registers.
template <typename Element, int kHeadDimBucket, bool kMasked>
__global__ void __launch_bounds__(
    BackwardDkDvConfig<typename AccumulatorOf<Element>::type, kHeadDimBucket>::kThreads,
    BackwardDkDvConfig<typename AccumulatorOf<Element>::type, kHeadDimBucket>::kMinBlocks)
    backward_dkdv_kernel(const detail::BackwardKernelParams p) {
  using Acc = typename AccumulatorOf<Element>::type;
  using Cfg = BackwardDkDvConfig<Acc, kHeadDimBucket>;
  constexpr int kBlockM = Cfg::kBlockM;
  constexpr int kBlockN = Cfg::kBlockN;
  constexpr int kTN = Cfg::kKeysPerThread;
  constexpr int kTM = Cfg::kQueriesPerThread;
  constexpr int kTO = Cfg::kOutColsPerThread;
  constexpr int kThreads = Cfg::kThreads;
  constexpr int kChunk = Cfg::kDimChunk;

  __shared__ __align__(16) Acc key_tile[kChunk][Cfg::kStrideN];           // (dim, key)
  __shared__ __align__(16) Acc query_tile[kChunk][Cfg::kStrideM];         // (dim, query)
  __shared__ __align__(16) Acc p_tile[kBlockM][Cfg::kStrideN];            // (query, key)
  __shared__ __align__(16) Acc ds_tile[kBlockM][Cfg::kStrideN];           // (query, key)
  __shared__ __align__(16) Acc staged[Cfg::kStagedRows][kHeadDimBucket];  // (query, dim)

  const detail::ForwardKernelParams& f = p.fwd;
  const KeyBlockCoord c = key_block_coord<kBlockN>(p);
  const Element* k = static_cast<const Element*>(f.k) + c.b * f.k_batch_stride +
                     c.h_kv * f.k_head_stride + c.n_begin * f.k_row_stride;
  const Element* v = static_cast<const Element*>(f.v) + c.b * f.v_batch_stride +
                     c.h_kv * f.v_head_stride + c.n_begin * f.v_row_stride;

  const int key0 = (threadIdx.x / Cfg::kThreadsPerRow) * kTN;  // first key row of the thread
  const int lane_in_row = threadIdx.x % Cfg::kThreadsPerRow;
  const int query0 = lane_in_row * kTM;  // first query of its score tile
  const int col0 = lane_in_row * kTO;    // first dK/dV column it owns
  const Acc scale_log2 = static_cast<Acc>(f.scale_log2);

  Acc dk[kTN][kTO];
  Acc dv[kTN][kTO];
#pragma unroll
  for (int i = 0; i < kTN; ++i)
#pragma unroll
    for (int col = 0; col < kTO; ++col) dk[i][col] = dv[i][col] = 0;

  // The query rows that can see some key of the block (causal, window); query blocks outside
  // them see none of its keys.
  const QueryRange query_range =
      kMasked ? visible_queries(f, c.n_begin, c.keys)
              : QueryRange{f.causal ? c.n_begin * f.kv_stride : 0, f.seqlen_q};
  const int64_t m_first = query_range.begin / kBlockM * kBlockM;
  const int64_t last_key_position = (c.n_begin + kBlockN - 1) * f.kv_stride;
  const bool partial_keys = c.n_begin + kBlockN > f.kept_keys;
  for (int64_t h = c.h_kv * f.group_size; h < (c.h_kv + 1) * f.group_size; ++h) {
    const Element* q_head =
        static_cast<const Element*>(f.q) + c.b * f.q_batch_stride + h * f.q_head_stride;
    const Element* do_head =
        static_cast<const Element*>(p.dout) + c.b * p.do_batch_stride + h * p.do_head_stride;
    for (int64_t m_begin = m_first; m_begin < query_range.end; m_begin += kBlockM) {
      const int rows = static_cast<int>(min(static_cast<int64_t>(kBlockM), f.seqlen_q - m_begin));
      bool needs_mask;
      if constexpr (kMasked) {
        // Uniform over the block: a query block that sees none of these keys costs nothing.
        const detail::BlockClass block_class =
            classify_key_block(f, f.policy, c.b, h, m_begin, rows, c.n_begin, kBlockN, f.kept_keys);
        if (block_class == detail::BlockClass::kSkip) continue;
        needs_mask = block_class != detail::BlockClass::kFull;
        if (needs_mask) {
          // p_tile (query, key) holds the mask terms until P replaces them; chunked_dot's
          // barriers publish them.
          __syncthreads();  // the previous query block's readers of p_tile are done
          fill_mask_tile<Acc, kBlockM, kBlockN, Cfg::kStrideN, 1, kThreads>(
              &p_tile[0][0], f, c.b, h, m_begin, rows, c.n_begin, f.kept_keys);
        }
      } else {
        needs_mask = partial_keys || (f.causal && last_key_position > m_begin);
      }
      const Element* q = q_head + m_begin * f.q_row_stride;
      const Element* dout = do_head + m_begin * p.do_row_stride;

      Acc score[kTN][kTM];  // transposed: (key, query)
      Acc ds[kTN][kTM];
#pragma unroll
      for (int i = 0; i < kTN; ++i)
#pragma unroll
        for (int j = 0; j < kTM; ++j) score[i][j] = ds[i][j] = 0;
      chunked_dot<kBlockN, Cfg::kStrideN, kBlockM, Cfg::kStrideM, kChunk, kThreads>(
          score, &key_tile[0][0], &query_tile[0][0], k, f.k_row_stride, c.keys, q, f.q_row_stride,
          rows, f.head_dim, key0, query0);
      chunked_dot<kBlockN, Cfg::kStrideN, kBlockM, Cfg::kStrideM, kChunk, kThreads>(
          ds, &key_tile[0][0], &query_tile[0][0], v, f.v_row_stride, c.keys, dout, p.do_row_stride,
          rows, f.head_dim_v, key0, query0);

#pragma unroll
      for (int j = 0; j < kTM; ++j) {
        const int64_t query = m_begin + query0 + j;
        const QueryRowStats<Acc> stats = load_row_stats<Acc>(p, c.b, h, query);
#pragma unroll
        for (int i = 0; i < kTN; ++i) {
          score[i][j] *= scale_log2;
          if constexpr (kMasked) {
            // This thread reads exactly the p_tile elements it overwrites below.
            if (needs_mask) score[i][j] = masked_add(score[i][j], p_tile[query0 + j][key0 + i]);
          } else if (needs_mask && causal_hidden(f, query, c.n_begin + key0 + i, f.kept_keys)) {
            score[i][j] = negative_infinity<Acc>();
          }
          probability_and_ds(score[i][j], ds[i][j], stats);
          // Safe without a barrier: the last readers of p_tile and ds_tile (the previous
          // query block's products) finished before the barriers that opened chunked_dot.
          p_tile[query0 + j][key0 + i] = score[i][j];
          ds_tile[query0 + j][key0 + i] = ds[i][j];
        }
      }
      accumulate_rows<Cfg::kStagedRows, kHeadDimBucket, Cfg::kStrideN, kThreads>(
          dv, &p_tile[0][0], key0, &staged[0][0], dout, p.do_row_stride, rows, f.head_dim_v, col0);
      accumulate_rows<Cfg::kStagedRows, kHeadDimBucket, Cfg::kStrideN, kThreads>(
          dk, &ds_tile[0][0], key0, &staged[0][0], q, f.q_row_stride, rows, f.head_dim, col0);
    }
  }

  const int64_t first_row = c.n_begin * f.kv_stride;
  const int64_t end_row = min((c.n_begin + kBlockN) * f.kv_stride, p.seqlen_k);
  store_key_rows<Element, Acc, kTN, kTO, kThreads>(
      static_cast<Element*>(p.dk) + c.b * p.dk_batch_stride + c.h_kv * p.dk_head_stride,
      p.dk_row_stride, dk, static_cast<Acc>(p.scale), p, c.n_begin + key0, col0, f.head_dim,
      first_row, end_row);
  store_key_rows<Element, Acc, kTN, kTO, kThreads>(
      static_cast<Element*>(p.dv) + c.b * p.dv_batch_stride + c.h_kv * p.dv_head_stride,
      p.dv_row_stride, dv, Acc(1), p, c.n_begin + key0, col0, f.head_dim_v, first_row, end_row);
}

}  // namespace samattn::simt
