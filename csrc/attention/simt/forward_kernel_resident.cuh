// Internal: the SIMT attention forward for narrow heads (head dimension bucket x element size
// <= 256 bytes: fp32/fp16/bf16 up to 64, fp64 up to 32). Same algorithm as the chunked kernel,
// but Q stays in shared memory for the whole block, K and V arrive as whole tiles prefetched
// into registers one key block ahead, and a key block costs four barriers. Causal and kv_stride
// only: calls with a window, pattern or element mask run on the chunked kernel (launcher).
#pragma once

#include <cstdint>

#include "attention/kernel_params.h"
#include "attention/simt/forward_common.cuh"
#include "attention/simt/forward_config.h"
#include "attention/simt/tile_io.cuh"

namespace samattn::simt {

template <typename Element, int kHeadDimBucket>
__global__ void __launch_bounds__(
    ResidentForwardConfig<typename AccumulatorOf<Element>::type, kHeadDimBucket>::kThreads,
    ResidentForwardConfig<typename AccumulatorOf<Element>::type, kHeadDimBucket>::kMinBlocks)
    resident_forward_kernel(const detail::ForwardKernelParams p) {
  using Acc = typename AccumulatorOf<Element>::type;
  using Cfg = ResidentForwardConfig<Acc, kHeadDimBucket>;
  constexpr int kBlockM = Cfg::kBlockM;
  constexpr int kBlockN = Cfg::kBlockN;
  constexpr int kTM = Cfg::kRowsPerThread;
  constexpr int kTN = Cfg::kKeysPerThread;
  constexpr int kTO = Cfg::kOutColsPerThread;
  constexpr int kThreads = Cfg::kThreads;

  extern __shared__ __align__(16) unsigned char smem[];
  Acc* q_tile = reinterpret_cast<Acc*>(smem);       // (dim, query), pre-scaled
  Acc* kp_tile = q_tile + Cfg::kQTileElems;         // K as (dim, key), then P as (key, query)
  Acc* v_tile = kp_tile + Cfg::kKPTileElems;        // (key, dim)

  const BlockCoord c = block_coord<kBlockM>(p);
  const Element* q = static_cast<const Element*>(p.q) + c.b * p.q_batch_stride +
                     c.h * p.q_head_stride + c.m_begin * p.q_row_stride;
  const Element* k =
      static_cast<const Element*>(p.k) + c.b * p.k_batch_stride + c.h_kv * p.k_head_stride;
  const Element* v =
      static_cast<const Element*>(p.v) + c.b * p.v_batch_stride + c.h_kv * p.v_head_stride;

  const int row0 = (threadIdx.x / Cfg::kThreadsPerRow) * kTM;
  const int lane_in_row = threadIdx.x % Cfg::kThreadsPerRow;
  const int key0 = lane_in_row * kTN;
  const int col0 = lane_in_row * kTO;

  // Scores come out of the q.k loop already in the log2 domain.
  load_transposed<kBlockM, kHeadDimBucket, Cfg::kStrideM, kThreads>(
      q_tile, q, p.q_row_stride, c.rows, 0, p.head_dim, static_cast<Acc>(p.scale_log2));

  const int64_t key_end = visible_key_end(p, c);
  PrefetchedTile<kBlockN, kHeadDimBucket, kThreads, Acc> k_next, v_next;
  auto prefetch = [&](int64_t n_begin) {
    const int keys = static_cast<int>(min(static_cast<int64_t>(kBlockN), key_end - n_begin));
    k_next.load(k + n_begin * p.k_row_stride, p.k_row_stride, keys, p.head_dim);
    v_next.load(v + n_begin * p.v_row_stride, p.v_row_stride, keys, p.head_dim_v);
  };
  if (key_end > 0) prefetch(0);

  OnlineSoftmax<Acc, kTM, kTN, kTO> state;
  state.init();
  for (int64_t n_begin = 0; n_begin < key_end; n_begin += kBlockN) {
    const int keys = static_cast<int>(min(static_cast<int64_t>(kBlockN), key_end - n_begin));
    __syncthreads();  // the previous block's readers of P (in kp_tile) and V are done
    k_next.template store_transposed<Cfg::kStrideN>(kp_tile);
    v_next.template store_rows<kHeadDimBucket>(v_tile);
    __syncthreads();
    if (n_begin + kBlockN < key_end) prefetch(n_begin + kBlockN);

    Acc score[kTM][kTN];
#pragma unroll
    for (int i = 0; i < kTM; ++i)
#pragma unroll
      for (int j = 0; j < kTN; ++j) score[i][j] = 0;
    // Columns past head_dim are zero in both tiles, so stepping 4 at a time is exact.
#pragma unroll 1
    for (int d4 = 0; d4 < p.head_dim; d4 += 4) {
#pragma unroll
      for (int d = d4; d < d4 + 4; ++d) {
        Acc q_frag[kTM];
        Acc k_frag[kTN];
        load_vector(q_frag, q_tile + d * Cfg::kStrideM + row0);
        load_vector(k_frag, kp_tile + d * Cfg::kStrideN + key0);
#pragma unroll
        for (int i = 0; i < kTM; ++i)
#pragma unroll
          for (int j = 0; j < kTN; ++j) score[i][j] += q_frag[i] * k_frag[j];
      }
    }
    if (block_needs_mask(p, c, n_begin, kBlockN, key_end)) {
      state.mask(score, p, c.m_begin + row0, n_begin + key0, key_end);
    }
    state.update(score);
    __syncthreads();  // every thread has read K; P may overwrite it
#pragma unroll
    for (int j = 0; j < kTN; ++j)
#pragma unroll
      for (int i = 0; i < kTM; ++i) kp_tile[(key0 + j) * Cfg::kStrideM + row0 + i] = score[i][j];
    __syncthreads();
#pragma unroll 8
    for (int n = 0; n < keys; ++n) {
      Acc p_frag[kTM];
      Acc v_frag[kTO];
      load_vector(p_frag, kp_tile + n * Cfg::kStrideM + row0);
      load_vector(v_frag, v_tile + n * kHeadDimBucket + col0);
      state.accumulate(p_frag, v_frag);
    }
  }
  state.template store<Element>(p, c, row0, col0, lane_in_row == 0);
}

}  // namespace samattn::simt
