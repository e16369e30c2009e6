// Internal: the SIMT backward's dQ kernel. One block computes dQ for kBlockM query rows of one
// (batch, head): for every visible key block it recomputes the scores and dout . v, turns them
// into dS = P * (dout . v - D) in registers, and adds dS K to the dQ tile it keeps in
// registers. Each block owns its rows, so there are no atomics and the sum order is fixed.
#pragma once

#include <cstdint>

#include "attention/backward_kernel_params.h"
#include "attention/simt/backward_common.cuh"
#include "attention/simt/backward_config.h"
#include "attention/simt/forward_common.cuh"

namespace samattn::simt {

// kMasked: windows, patterns and element masks, as in the forward's chunked kernel (block
// classification, skipping, a shared mask tile for partial blocks); a separate instantiation so
// the unmasked kernel keeps its registers.
template <typename Element, int kHeadDimBucket, bool kMasked>
__global__ void __launch_bounds__(
    BackwardDqConfig<typename AccumulatorOf<Element>::type, kHeadDimBucket>::kThreads,
    BackwardDqConfig<typename AccumulatorOf<Element>::type, kHeadDimBucket>::kMinBlocks)
    backward_dq_kernel(const detail::BackwardKernelParams p) {
  using Acc = typename AccumulatorOf<Element>::type;
  using Cfg = BackwardDqConfig<Acc, kHeadDimBucket>;
  constexpr int kBlockM = Cfg::kBlockM;
  constexpr int kBlockN = Cfg::kBlockN;
  constexpr int kTM = Cfg::kRowsPerThread;
  constexpr int kTN = Cfg::kKeysPerThread;
  constexpr int kTO = Cfg::kOutColsPerThread;
  constexpr int kThreads = Cfg::kThreads;
  constexpr int kChunk = Cfg::kDimChunk;

  __shared__ __align__(16) Acc row_tile[kChunk][Cfg::kStrideM];           // (dim, query)
  __shared__ __align__(16) Acc key_tile[kChunk][Cfg::kStrideN];           // (dim, key)
  __shared__ __align__(16) Acc ds_tile[kBlockN][Cfg::kStrideM];           // (key, query)
  __shared__ __align__(16) Acc staged[Cfg::kStagedRows][kHeadDimBucket];  // (key, dim)

  const detail::ForwardKernelParams& f = p.fwd;
  const BlockCoord c = block_coord<kBlockM>(f);
  const Element* q = static_cast<const Element*>(f.q) + c.b * f.q_batch_stride +
                     c.h * f.q_head_stride + c.m_begin * f.q_row_stride;
  const Element* dout = static_cast<const Element*>(p.dout) + c.b * p.do_batch_stride +
                        c.h * p.do_head_stride + c.m_begin * p.do_row_stride;
  const Element* k =
      static_cast<const Element*>(f.k) + c.b * f.k_batch_stride + c.h_kv * f.k_head_stride;
  const Element* v =
      static_cast<const Element*>(f.v) + c.b * f.v_batch_stride + c.h_kv * f.v_head_stride;

  const int row0 = (threadIdx.x / Cfg::kThreadsPerRow) * kTM;  // first query row of the thread
  const int lane_in_row = threadIdx.x % Cfg::kThreadsPerRow;
  const int key0 = lane_in_row * kTN;  // first key of its score tile
  const int col0 = lane_in_row * kTO;  // first dQ column it owns
  const Acc scale_log2 = static_cast<Acc>(f.scale_log2);

  Acc dq[kTM][kTO];
#pragma unroll
  for (int i = 0; i < kTM; ++i)
#pragma unroll
    for (int col = 0; col < kTO; ++col) dq[i][col] = 0;

  const LogicalKeyRange key_range =
      kMasked ? visible_keys(f, c) : LogicalKeyRange{0, visible_key_end(f, c)};
  const int64_t key_end = key_range.end;
  QueryRowStats<Acc> stats[kTM];
  if (key_end > 0) {
#pragma unroll
    for (int i = 0; i < kTM; ++i) stats[i] = load_row_stats<Acc>(p, c.b, c.h, c.m_begin + row0 + i);
  }
  for (int64_t n_begin = key_range.begin; n_begin < key_end; n_begin += kBlockN) {
    bool needs_mask;
    if constexpr (kMasked) {
      const detail::BlockClass block_class =
          classify_key_block(f, f.policy, c.b, c.h, c.m_begin, c.rows, n_begin, kBlockN, key_end);
      if (block_class == detail::BlockClass::kSkip) continue;  // uniform over the block
      needs_mask = block_class != detail::BlockClass::kFull;
      if (needs_mask) {
        // ds_tile holds the block's mask terms until dS replaces them; chunked_dot's barriers
        // publish them.
        __syncthreads();  // the previous block's readers of ds_tile are done
        fill_mask_tile<Acc, kBlockM, kBlockN, 1, Cfg::kStrideM, kThreads>(
            &ds_tile[0][0], f, c.b, c.h, c.m_begin, c.rows, n_begin, key_end);
      }
    } else {
      needs_mask = block_needs_mask(f, c, n_begin, kBlockN, key_end);
    }
    const int keys = static_cast<int>(min(static_cast<int64_t>(kBlockN), key_end - n_begin));
    const Element* k_block = k + n_begin * f.k_row_stride;
    const Element* v_block = v + n_begin * f.v_row_stride;

    Acc score[kTM][kTN];
    Acc ds[kTM][kTN];
#pragma unroll
    for (int i = 0; i < kTM; ++i)
#pragma unroll
      for (int j = 0; j < kTN; ++j) score[i][j] = ds[i][j] = 0;
    chunked_dot<kBlockM, Cfg::kStrideM, kBlockN, Cfg::kStrideN, kChunk, kThreads>(
        score, &row_tile[0][0], &key_tile[0][0], q, f.q_row_stride, c.rows, k_block, f.k_row_stride,
        keys, f.head_dim, row0, key0);
    chunked_dot<kBlockM, Cfg::kStrideM, kBlockN, Cfg::kStrideN, kChunk, kThreads>(
        ds, &row_tile[0][0], &key_tile[0][0], dout, p.do_row_stride, c.rows, v_block,
        f.v_row_stride, keys, f.head_dim_v, row0, key0);

#pragma unroll
    for (int i = 0; i < kTM; ++i) {
#pragma unroll
      for (int j = 0; j < kTN; ++j) {
        score[i][j] *= scale_log2;
        if constexpr (kMasked) {
          // This thread reads exactly the ds_tile elements it overwrites below.
          if (needs_mask) score[i][j] = masked_add(score[i][j], ds_tile[key0 + j][row0 + i]);
        } else if (needs_mask &&
                   causal_hidden(f, c.m_begin + row0 + i, n_begin + key0 + j, key_end)) {
          score[i][j] = negative_infinity<Acc>();
        }
        probability_and_ds(score[i][j], ds[i][j], stats[i]);
        // Safe without a barrier: ds_tile's last readers (the previous block's dS K) finished
        // before the barriers that opened chunked_dot above.
        ds_tile[key0 + j][row0 + i] = ds[i][j];
      }
    }
    accumulate_rows<Cfg::kStagedRows, kHeadDimBucket, Cfg::kStrideM, kThreads>(
        dq, &ds_tile[0][0], row0, &staged[0][0], k_block, f.k_row_stride, keys, f.head_dim, col0);
  }

  const Acc scale = static_cast<Acc>(p.scale);
  Element* out = static_cast<Element*>(p.dq) + c.b * p.dq_batch_stride + c.h * p.dq_head_stride;
#pragma unroll
  for (int i = 0; i < kTM; ++i) {
    const int64_t query = c.m_begin + row0 + i;
    if (query >= f.seqlen_q) continue;
#pragma unroll
    for (int col = 0; col < kTO; ++col) {
      if (col0 + col < f.head_dim) {
        out[query * p.dq_row_stride + col0 + col] = narrow<Element>(dq[i][col] * scale);
      }
    }
  }
}

}  // namespace samattn::simt
