// Internal: the tensor-core attention forward (FlashAttention-2 design on mma.sync, sm80+) for
// fp16, bf16, and float computed in TF32. One block computes kBlockM query rows of one
// (batch, head); each of its warps owns 16 or 32 of those rows for the whole kernel, so the
// online softmax needs no shared memory. Per key block:
//   S = Q K^T (mma, f32)  ->  scale, mask, online softmax in registers  ->  O += P V (mma, P
//   rounded to the operand type and fed straight from the S accumulators as A fragments).
// K and V stream through shared memory with cp.async: V of this block loads while Q K^T runs, K
// of the next block while P V runs. Key blocks are walked from the last to the first, so the
// blocks that need masking (the end of the keys, the causal diagonal) come first and the rest run
// the unmasked path.
#pragma once

#include <cstdint>

#include "attention/kernel_params.h"
#include "attention/tensor_core/forward_config.h"
#include "attention/tensor_core/mma.cuh"
#include "attention/tensor_core/online_softmax.cuh"
#include "attention/tensor_core/tile_io.cuh"
#include "attention/tensor_core/warp_gemm.cuh"

namespace samattn::tensor_core {

// One past the last logical key any row of the query block [m_begin, m_begin + rows) can see.
__device__ __forceinline__ int64_t block_key_end(const detail::ForwardKernelParams& p,
                                                 int64_t m_begin, int rows) {
  if (!p.causal) return p.kept_keys;
  const int64_t last_visible = (m_begin + rows - 1) / p.kv_stride;
  return min(last_visible + 1, p.kept_keys);
}

// One past the last logical key query row `query` can see: key n is visible iff
// n * kv_stride <= query (causal) and n < kept_keys.
__device__ __forceinline__ int64_t row_key_end(const detail::ForwardKernelParams& p,
                                               int64_t query) {
  if (!p.causal) return p.kept_keys;
  return min(query / p.kv_stride + 1, p.kept_keys);
}

template <typename Element, int kHeadDim>
__device__ __forceinline__ void forward_block(const detail::ForwardKernelParams& p) {
  using Cfg = ForwardConfig<kHeadDim, int(sizeof(Element))>;
  constexpr int kBlockM = Cfg::kBlockM;
  constexpr int kBlockN = Cfg::kBlockN;
  constexpr int kThreads = Cfg::kThreads;
  constexpr int kStride = Cfg::kRowStride;
  constexpr int kMTiles = Cfg::kMTiles;  // 16-row tiles per warp
  constexpr int kRows = 2 * kMTiles;     // query rows per lane
  constexpr int kNTiles = kBlockN / 8;   // S accumulator tiles per 16-row tile (16 x 8 each)
  constexpr int kDTiles = kHeadDim / 8;  // O accumulator tiles per 16-row tile
  constexpr int kKSteps = kHeadDim * int(sizeof(Element)) / 32;  // 32-byte mma k-steps

  extern __shared__ __align__(16) unsigned char shared_bytes[];
  Element* q_tile = reinterpret_cast<Element*>(shared_bytes);  // (kBlockM, kStride)
  Element* k_tile = q_tile + Cfg::kQTileElems;                 // (kBlockN, kStride)
  Element* v_tile = k_tile + Cfg::kKVTileElems;                // (kBlockN, kStride)

  // The blocks of one (batch, head) are adjacent, so the K/V they all stream stays in L2; within
  // a head the last query blocks (the most keys when causal) run first to shorten the tail.
  const int64_t num_m_blocks = (p.seqlen_q + kBlockM - 1) / kBlockM;
  const int64_t block = blockIdx.x;
  const int64_t m_block = num_m_blocks - 1 - block % num_m_blocks;
  const int64_t batch_head = block / num_m_blocks;
  const int64_t b = batch_head / p.heads_q;
  const int64_t h = batch_head % p.heads_q;
  const int64_t h_kv = h / p.group_size;
  const int64_t m_begin = m_block * kBlockM;
  const int rows = static_cast<int>(min(static_cast<int64_t>(kBlockM), p.seqlen_q - m_begin));
  const int64_t key_end = block_key_end(p, m_begin, rows);
  const int64_t n_blocks = (key_end + kBlockN - 1) / kBlockN;

  const Element* q = static_cast<const Element*>(p.q) + b * p.q_batch_stride + h * p.q_head_stride +
                     m_begin * p.q_row_stride;
  const Element* k =
      static_cast<const Element*>(p.k) + b * p.k_batch_stride + h_kv * p.k_head_stride;
  const Element* v =
      static_cast<const Element*>(p.v) + b * p.v_batch_stride + h_kv * p.v_head_stride;
  Element* out = static_cast<Element*>(p.out) + b * p.o_batch_stride + h * p.o_head_stride +
                 m_begin * p.o_row_stride;

  const int warp = static_cast<int>(threadIdx.x) / 32;
  const int lane = static_cast<int>(threadIdx.x) % 32;

  load_tile_async<kBlockM, kHeadDim, kStride, kThreads>(q_tile, q, p.q_row_stride, rows);
  cp_async_commit();
  if (n_blocks > 0) {
    const int64_t n_begin = (n_blocks - 1) * kBlockN;
    load_tile_async<kBlockN, kHeadDim, kStride, kThreads>(
        k_tile, k + n_begin * p.k_row_stride, p.k_row_stride,
        static_cast<int>(min(static_cast<int64_t>(kBlockN), key_end - n_begin)));
  }
  cp_async_commit();

  const int warp_row0 = warp * Cfg::kWarpRows;
  const uint32_t q_lane =
      shared_address(q_tile + warp_row0 * kStride + q_lane_offset<Element, kStride>(lane));
  const uint32_t k_lane = shared_address(k_tile + k_lane_offset<Element, kStride>(lane));
  const Element* v_lane = v_tile + v_lane_offset<Element, kStride>(lane);

  // Lane row r is query row warp_row0 + 16 * (r / 2) + 8 * (r % 2) + lane / 4 of the block. It
  // sees keys up to key_end - key_gap[r]; |gap| <= kBlockM, so it fits in an int (it is negative
  // only for padding rows past seqlen_q, whose results are never stored). Kept in registers:
  // computing the limits only in masked iterations measured 1-5% slower.
  int key_gap[kRows];
#pragma unroll
  for (int r = 0; r < kRows; ++r) {
    key_gap[r] = static_cast<int>(key_end - row_key_end(p, m_begin + warp_row0 + 8 * r + lane / 4));
  }
  const float scale_log2 = static_cast<float>(p.scale_log2);

  float o[kMTiles][kDTiles][4];
#pragma unroll
  for (int m = 0; m < kMTiles; ++m) {
#pragma unroll
    for (int t = 0; t < kDTiles; ++t) {
#pragma unroll
      for (int e = 0; e < 4; ++e) o[m][t][e] = 0.f;
    }
  }
  OnlineSoftmax<kMTiles> softmax;

  for (int64_t n_block = n_blocks - 1; n_block >= 0; --n_block) {
    const int64_t n_begin = n_block * kBlockN;
    const int keys = static_cast<int>(min(static_cast<int64_t>(kBlockN), key_end - n_begin));
    cp_async_wait<0>();  // K of this block (and Q) has landed ...
    __syncthreads();     // ... for every thread, and nobody still reads the V tile
    load_tile_async<kBlockN, kHeadDim, kStride, kThreads>(v_tile, v + n_begin * p.v_row_stride,
                                                          p.v_row_stride, keys);
    cp_async_commit();

    float s[kMTiles][kNTiles][4];
    warp_qk<Element, kMTiles, kNTiles, kKSteps, kStride>(s, q_lane, k_lane);

    // Only blocks that cross the end of the keys or the causal diagonal pay for the mask.
    const bool needs_mask = n_begin + kBlockN > p.kept_keys ||
                            (p.causal && (n_begin + kBlockN - 1) * p.kv_stride > m_begin);
    // Keys of this block visible to the block's last row: below kBlockM + kBlockN in masked
    // blocks (the first few iterations); the clamp only keeps later ones in int range.
    const int block_keys = static_cast<int>(min(key_end - n_begin, int64_t{kBlockM + kBlockN}));
    int key_limit[kRows];
#pragma unroll
    for (int r = 0; r < kRows; ++r) key_limit[r] = block_keys - key_gap[r];
    scale_and_mask(s, scale_log2, needs_mask, key_limit, lane);
    float rescale[kRows];
    softmax.update(s, rescale);
#pragma unroll
    for (int m = 0; m < kMTiles; ++m) {
#pragma unroll
      for (int t = 0; t < kDTiles; ++t) {
#pragma unroll
        for (int e = 0; e < 4; ++e) o[m][t][e] *= rescale[2 * m + e / 2];
      }
    }

    cp_async_wait<0>();  // V of this block has landed ...
    __syncthreads();     // ... for every thread, and nobody still reads the K tile
    if (n_block > 0) {
      load_tile_async<kBlockN, kHeadDim, kStride, kThreads>(
          k_tile, k + (n_begin - kBlockN) * p.k_row_stride, p.k_row_stride, kBlockN);
    }
    cp_async_commit();

    warp_pv<Element, kMTiles, kNTiles, kDTiles, kStride>(o, s, v_lane);
  }

  if (n_blocks == 0) {  // no loop ran: the Q copies must land before the tile is reused
    cp_async_wait<0>();
    __syncthreads();
  }

  // Normalise, stage the warp's rows in its own (no longer read) rows of the Q tile and store
  // them as 16-byte vectors. A row that saw no key (sum 0) gets zeros and lse = -inf; a NaN sum
  // stays NaN.
  float total[kRows];
  float inverse[kRows];
#pragma unroll
  for (int r = 0; r < kRows; ++r) {
    total[r] = quad_sum(softmax.row_sum[r]);
    inverse[r] = total[r] == 0.f ? 0.f : 1.f / total[r];
  }
  Element* staged = q_tile + warp_row0 * kStride;
  __syncwarp();  // every lane has finished its ldmatrix reads of these rows
#pragma unroll
  for (int m = 0; m < kMTiles; ++m) {
#pragma unroll
    for (int t = 0; t < kDTiles; ++t) {
#pragma unroll
      for (int half = 0; half < 2; ++half) {
        const int r = 2 * m + half;
        const int row = 16 * m + 8 * half + lane / 4;
        const int col = t * 8 + 2 * (lane % 4);
        store_pair(staged + row * kStride + col, o[m][t][2 * half] * inverse[r],
                   o[m][t][2 * half + 1] * inverse[r]);
      }
    }
  }
  __syncwarp();
  // The block has `rows` real query rows; the warp stores those among its own.
  const int warp_rows = max(0, min(Cfg::kWarpRows, rows - warp_row0));
  store_warp_rows<Cfg::kWarpRows, kHeadDim, kStride>(out + warp_row0 * p.o_row_stride,
                                                     p.o_row_stride, staged, warp_rows, lane);

  if (p.lse != nullptr && lane % 4 == 0) {
    constexpr float kLn2 = 0.6931471805599453f;
    // Row m_begin of (b, h) in the lse (contiguous (B, Hq, Sq), or a varlen slice).
    float* lse =
        static_cast<float*>(p.lse) + b * p.lse_batch_stride + h * p.lse_head_stride + m_begin;
#pragma unroll
    for (int r = 0; r < kRows; ++r) {
      const int row = warp_row0 + 8 * r + lane / 4;
      if (row < rows) {
        lse[row] = total[r] == 0.f ? -INFINITY : (softmax.row_max[r] + log2f(total[r])) * kLn2;
      }
    }
  }
}

// The kernel body exists only for sm80+ (cp.async, bf16 mma); the host never launches it on
// older devices, and an sm75 build traps instead of silently writing nothing.
template <typename Element, int kHeadDim>
__global__ void __launch_bounds__(ForwardConfig<kHeadDim, int(sizeof(Element))>::kThreads,
                                  ForwardConfig<kHeadDim, int(sizeof(Element))>::kMinBlocksPerSm)
    forward_kernel(const __grid_constant__ detail::ForwardKernelParams p) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  forward_block<Element, kHeadDim>(p);
#else
  __trap();
#endif
}

}  // namespace samattn::tensor_core
