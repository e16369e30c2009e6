// Internal: the tensor-core attention backward for fp16/bf16 (FlashAttention-2 design on
// mma.sync, sm80+). D = rowsum(dO * O) comes from the SIMT preprocess kernel.
//
// dK/dV kernel: one block per (batch, kv head, 64 keys). K and V stay in shared memory; for each
// query head of the group and each query block that sees a key of the block (causal blocks above
// the diagonal are skipped) it loads Q, dO, lse and D, and each warp, owning 16 keys, computes
//   S^T = K Q^T, P^T = exp2(S^T * scale * log2 e - lse * log2 e), dV += P^T dO,
//   dP^T = V dO^T, dS^T = P^T * (dP^T - D), dK += dS^T Q
// with keys as the mma rows, so P^T and dS^T feed the next mma as A fragments straight from the
// accumulators. dK and dV are summed over the group's heads in the block: no atomics. Above head
// dim 128 two warps own each 16 keys, each with half of dK's, dV's and dQ's columns
// (BackwardConfig::kColumnSplit).
// dQ, non-deterministic mode: the block writes dS to shared memory and every warp adds
// dS K for 16 query rows into an fp32 workspace with atomicAdd; a small kernel scales and
// rounds it into dq. Deterministic mode: a second kernel per (batch, head, 64 queries)
// recomputes P and dS key block by key block and sums dQ in registers in a fixed order.
// kMasked: the mask policy, varlen in one launch and strided lse views (backward_masks.cuh);
// lse, D and the dQ accumulator share one row layout, the forward's lse layout (B, Hq, Sq)
// or, varlen, (Hq, total_q).
#pragma once

#include <cstdint>

#include "attention/backward_kernel_params.h"
#include "attention/tensor_core/backward_config.h"
#include "attention/tensor_core/backward_masks.cuh"
#include "attention/tensor_core/forward_kernel.cuh"
#include "attention/tensor_core/mma.cuh"
#include "attention/tensor_core/tile_io.cuh"
#include "attention/tensor_core/warp_gemm.cuh"

namespace samattn::tensor_core {

// Shared-memory carve-up of both kernels (BackwardConfig): four 64-row tiles, dS, lse, D, and
// (masked kernels, calls with a pattern, block map or element mask) the mask tile.
template <typename Element, int kHeadDim>
struct BackwardSmem {
  using Cfg = BackwardConfig<kHeadDim>;
  Element* k;
  Element* v;
  Element* q;
  Element* dout;
  Element* ds;  // (kBlockN keys, kDsStride): dS^T of the step, 16-bit
  float* lse;   // lse and D of the step's query rows, 0 past seqlen_q
  float* delta;
  float* mask;  // (64, kMaskPitch) mask terms of the step's pairs

  __device__ __forceinline__ explicit BackwardSmem(unsigned char* bytes) {
    k = reinterpret_cast<Element*>(bytes);
    v = k + Cfg::kTileElems;
    q = v + Cfg::kTileElems;
    dout = q + Cfg::kTileElems;
    ds = dout + Cfg::kTileElems;
    lse = reinterpret_cast<float*>(ds + Cfg::kBlockN * Cfg::kDsStride);
    delta = lse + Cfg::kBlockM;
    mask = delta + Cfg::kBlockM;
  }
};

template <int kTiles>
__device__ __forceinline__ void zero(float (&acc)[1][kTiles][4]) {
#pragma unroll
  for (int t = 0; t < kTiles; ++t) {
#pragma unroll
    for (int e = 0; e < 4; ++e) acc[0][t][e] = 0.f;
  }
}

// Stages a warp's 16 accumulator rows (times `scale`) in rows [0, 16) of `staged` and stores the
// first valid_rows of them to dst (row pitch dst_row_stride) as 16-byte vectors.
template <typename Element, int kHeadDim, int kStride>
__device__ __forceinline__ void store_warp_tile(const float (&acc)[1][kHeadDim / 8][4], float scale,
                                                Element* staged, Element* dst,
                                                int64_t dst_row_stride, int valid_rows, int lane) {
#pragma unroll
  for (int t = 0; t < kHeadDim / 8; ++t) {
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      const int row = 8 * half + lane / 4;
      const int col = t * 8 + 2 * (lane % 4);
      store_pair(staged + row * kStride + col, acc[0][t][2 * half] * scale,
                 acc[0][t][2 * half + 1] * scale);
    }
  }
  __syncwarp();
  store_warp_rows<16, kHeadDim, kStride>(dst, dst_row_stride, staged, valid_rows, lane);
}

// dQ_accum[rows of the warp] += dS K for the step, with dS^T in smem.ds ([key][query]) and K in
// smem.k. Each warp owns query rows [16 * warp, 16 * warp + 16) of the step and the kColumns
// columns from first_col (all of them, or its half under BackwardConfig::kColumnSplit); query
// row i of the step is accumulator row dq_rows + i * row_stride (in head_dim units).
template <typename Element, int kHeadDim, int kColumns>
__device__ __forceinline__ void accumulate_dq(const BackwardSmem<Element, kHeadDim>& smem,
                                              float* dq_rows, int64_t row_stride, int rows,
                                              int warp, int first_col, int lane) {
  using Cfg = BackwardConfig<kHeadDim>;
  constexpr int kKeySteps = Cfg::kBlockN / 16;
  constexpr int kChunk = 4;  // 8-column tiles per pass: 16 accumulators live at a time
  static_assert(kColumns % (8 * kChunk) == 0, "whole chunks of columns");
  // A = dS (queries x keys) read transposed from the [key][query] tile: matrices (keys 0-7 |
  // 8-15) x (queries 0-7 | 8-15) in the order a0 (q 0-7, k 0-7), a1 (q 8-15, k 0-7), a2, a3.
  const uint32_t ds_lane =
      shared_address(smem.ds + k_lane_offset<Element, Cfg::kDsStride>(lane) + 16 * warp);
  uint32_t a[kKeySteps][4];
#pragma unroll
  for (int kk = 0; kk < kKeySteps; ++kk) {
    ldmatrix_x4_trans(a[kk], ds_lane + kk * 16 * Cfg::kDsStride * int(sizeof(Element)));
  }
  // B = K (keys x dims) read transposed, as V in the forward's P V.
  const uint32_t k_lane =
      shared_address(smem.k + v_lane_offset<Element, Cfg::kRowStride>(lane) + first_col);
  const int row0 = 16 * warp + lane / 4;
  const int col0 = first_col + 2 * (lane % 4);
#pragma unroll
  for (int c = 0; c < kColumns / 8; c += kChunk) {
    float acc[kChunk][4];
#pragma unroll
    for (int t = 0; t < kChunk; ++t) {
#pragma unroll
      for (int e = 0; e < 4; ++e) acc[t][e] = 0.f;
    }
#pragma unroll
    for (int kk = 0; kk < kKeySteps; ++kk) {
#pragma unroll
      for (int t = 0; t < kChunk; t += 2) {
        uint32_t b[4];
        ldmatrix_x4_trans(
            b, k_lane + (kk * 16 * Cfg::kRowStride + (c + t) * 8) * int(sizeof(Element)));
        mma_m16n8k16<Element>(acc[t], a[kk], b[0], b[1]);
        mma_m16n8k16<Element>(acc[t + 1], a[kk], b[2], b[3]);
      }
    }
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      const int row = row0 + 8 * half;
      if (row < rows) {
        float* dst = dq_rows + row * row_stride * kHeadDim + c * 8 + col0;
#pragma unroll
        for (int t = 0; t < kChunk; ++t) {
          atomicAdd(dst + t * 8, acc[t][2 * half]);
          atomicAdd(dst + t * 8 + 1, acc[t][2 * half + 1]);
        }
      }
    }
  }
}

template <typename Element, int kHeadDim, bool kAtomicDq, bool kMasked>
__device__ __forceinline__ void dkdv_block(const detail::BackwardKernelParams& p) {
  using Cfg = BackwardConfig<kHeadDim>;
  constexpr int kBlockM = Cfg::kBlockM;
  constexpr int kBlockN = Cfg::kBlockN;
  constexpr int kThreads = Cfg::kDkdvThreads;
  constexpr int kSplit = Cfg::kColumnSplit;
  constexpr int kOwnColumns = kHeadDim / kSplit;  // the dK, dV and dQ columns a warp adds
  constexpr int kStride = Cfg::kRowStride;
  constexpr int kSubQueries = Cfg::kSubQueries;
  constexpr int kSubTiles = kSubQueries / 8;
  constexpr int kDTiles = kOwnColumns / 8;
  constexpr int kKSteps = Cfg::kKSteps;
  constexpr int kPitch = Cfg::kMaskPitch;
  const detail::ForwardKernelParams& f = p.fwd;

  extern __shared__ __align__(16) unsigned char shared_bytes[];
  const BackwardSmem<Element, kHeadDim> smem(shared_bytes);

  // Blocks of one (batch, kv head) are adjacent and start with key block 0, which under causal
  // masking sees the most queries, so the longest blocks start first.
  const int64_t n_blocks = (f.kept_keys + kBlockN - 1) / kBlockN;
  const int64_t n_block = blockIdx.x % n_blocks;
  const int64_t batch_head = blockIdx.x / n_blocks;
  const int64_t b = batch_head / p.heads_kv;
  const int64_t h_kv = batch_head % p.heads_kv;
  const int64_t n_begin = n_block * kBlockN;
  SequenceExtent seq{0, 0, f.seqlen_q, f.kept_keys, 0};
  if constexpr (kMasked) {
    seq = sequence_extent(f, b);
    if (n_begin >= seq.kept_keys) return;  // varlen: past the end of this sequence's keys
  }
  const int keys = static_cast<int>(min(static_cast<int64_t>(kBlockN), seq.kept_keys - n_begin));

  // Physical row k_row0 of the sequence, then logical key n_begin (row stride includes kv_stride).
  const Element* k = static_cast<const Element*>(f.k) + b * f.k_batch_stride +
                     h_kv * f.k_head_stride + seq.k_row0 * (f.k_row_stride / f.kv_stride) +
                     n_begin * f.k_row_stride;
  const Element* v = static_cast<const Element*>(f.v) + b * f.v_batch_stride +
                     h_kv * f.v_head_stride + seq.k_row0 * (f.v_row_stride / f.kv_stride) +
                     n_begin * f.v_row_stride;
  load_tile_async<kBlockN, kHeadDim, kStride, kThreads>(smem.k, k, f.k_row_stride, keys);
  load_tile_async<kBlockN, kHeadDim, kStride, kThreads>(smem.v, v, f.v_row_stride, keys);
  cp_async_commit();

  const int thread = static_cast<int>(threadIdx.x);
  // The warp's 16 keys (and 16 query rows of dQ) and its columns of dK, dV and dQ.
  const int warp = kSplit == 1 ? thread / 32 : thread / 32 % Cfg::kWarps;
  const int first_col = kSplit == 1 ? 0 : thread / 32 / Cfg::kWarps * kOwnColumns;
  const int lane = thread % 32;
  const int col0 = 2 * (lane % 4);
  // A operands: the warp's 16 keys of K and V. B operands: Q and dO rows (queries as columns).
  const uint32_t k_a =
      shared_address(smem.k + 16 * warp * kStride + q_lane_offset<Element, kStride>(lane));
  const uint32_t v_a =
      shared_address(smem.v + 16 * warp * kStride + q_lane_offset<Element, kStride>(lane));
  const uint32_t q_b = shared_address(smem.q + k_lane_offset<Element, kStride>(lane));
  const uint32_t do_b = shared_address(smem.dout + k_lane_offset<Element, kStride>(lane));
  // B operands of dV += P^T dO and dK += dS^T Q: dO and Q with queries as the k index.
  const Element* do_trans = smem.dout + v_lane_offset<Element, kStride>(lane) + first_col;
  const Element* q_trans = smem.q + v_lane_offset<Element, kStride>(lane) + first_col;

  // The lane's keys (rows g and g + 8 of the warp's 16), for the mask.
  int64_t lane_key[2];
  lane_key[0] = n_begin + 16 * warp + lane / 4;
  lane_key[1] = lane_key[0] + 8;

  float dk[1][kDTiles][4];
  float dv[1][kDTiles][4];
  zero(dk);
  zero(dv);

  const float scale_log2 = static_cast<float>(f.scale_log2);
  const int64_t m_blocks = (seq.seqlen_q + kBlockM - 1) / kBlockM;
  // The query blocks that can see a key of the block: under causal masking key n is first seen
  // by query n * kv_stride; masked, the union of the keys' query ranges (both ends grow with the
  // key), and [common_begin, common_end) the queries that see every key of the block.
  int64_t m_first = f.causal ? min(n_begin * f.kv_stride / kBlockM, m_blocks) : 0;
  int64_t m_end = m_blocks;
  [[maybe_unused]] int64_t common_begin = 0, common_end = 0;
  [[maybe_unused]] int query_lo[2] = {0, 0}, query_hi[2] = {0, 0};  // per lane key
  [[maybe_unused]] bool mask_tile_on = false;
  if constexpr (kMasked) {
    const detail::MaskPolicy policy = sequence_policy(f, seq);
    const detail::Span first =
        detail::visible_query_span(policy, n_begin, seq.seqlen_q, f.kv_stride);
    const detail::Span last =
        detail::visible_query_span(policy, n_begin + keys - 1, seq.seqlen_q, f.kv_stride);
    m_first = first.begin / kBlockM;
    m_end = max((last.end + kBlockM - 1) / kBlockM, m_first);
    common_begin = last.begin;
    common_end = first.end;
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      if (lane_key[half] < seq.kept_keys) {
        const detail::Span span =
            detail::visible_query_span(policy, lane_key[half], seq.seqlen_q, f.kv_stride);
        query_lo[half] = static_cast<int>(span.begin);
        query_hi[half] = static_cast<int>(span.end);
      }
    }
    mask_tile_on = detail::needs_mask_tile(f);
  }
  const float* lse_all = static_cast<const float*>(f.lse);
  const float* delta_all = static_cast<const float*>(p.delta);
  float* dq_accum = static_cast<float*>(p.dq_accum);

  // The steps: every query block (from m_first) of every query head of the group.
  const int64_t steps_per_head = m_end - m_first;
  const int64_t steps = f.group_size * steps_per_head;
  const auto step_head = [&](int64_t step) { return h_kv * f.group_size + step / steps_per_head; };
  const auto step_begin = [&](int64_t step) { return (m_first + step % steps_per_head) * kBlockM; };
  // lse, D and dQ-accumulator row of query row `query` of the sequence, head h.
  const auto stats_row = [&](int64_t h, int64_t query) {
    return b * f.lse_batch_stride + h * f.lse_head_stride + (seq.q_row0 + query) * f.lse_row_stride;
  };
  // The work of a step (masked kernels), and the next step at or after `step` that is not skipped.
  const auto step_work = [&](int64_t step) {
    const int64_t m_begin = step_begin(step);
    return pair_work(f, sequence_policy(f, b), mask_tile_on, b, step_head(step), m_begin,
                     static_cast<int>(min(static_cast<int64_t>(kBlockM), seq.seqlen_q - m_begin)),
                     kBlockM, n_begin, kBlockN, seq.kept_keys, common_begin, common_end, 0,
                     seq.kept_keys);
  };
  const auto next_step = [&](int64_t step, KeyBlockWork& work) {
    for (; step < steps; ++step) {
      work = step_work(step);
      if (work != KeyBlockWork::kSkip) break;
    }
    return step;
  };
  // Starts the copies of a step's Q, dO, lse and D. Rows past seqlen_q are zero-filled: with
  // dO = 0 and D = 0 their P (exp2(0) = 1 for lse 0) adds nothing to dV, and dS = P * (0 - 0).
  const auto load_step = [&](int64_t step) {
    const int64_t h = step_head(step);
    const int64_t m_begin = step_begin(step);
    const int rows = static_cast<int>(min(static_cast<int64_t>(kBlockM), seq.seqlen_q - m_begin));
    load_tile_async<kBlockM, kHeadDim, kStride, kThreads>(
        smem.q,
        static_cast<const Element*>(f.q) + b * f.q_batch_stride + h * f.q_head_stride +
            (seq.q_row0 + m_begin) * f.q_row_stride,
        f.q_row_stride, rows);
    load_tile_async<kBlockM, kHeadDim, kStride, kThreads>(
        smem.dout,
        static_cast<const Element*>(p.dout) + b * p.do_batch_stride + h * p.do_head_stride +
            (seq.q_row0 + m_begin) * p.do_row_stride,
        p.do_row_stride, rows);
    if (thread < kBlockM) {
      const bool real = thread < rows;
      const int64_t row = stats_row(h, m_begin + thread);
      cp_async_4(shared_address(smem.lse + thread), real ? lse_all + row : lse_all, real);
      cp_async_4(shared_address(smem.delta + thread), real ? delta_all + row : delta_all, real);
    }
    cp_async_commit();
  };

  KeyBlockWork work = KeyBlockWork::kRowRange;
  int64_t step = 0;
  if constexpr (kMasked) step = next_step(0, work);
  if (step < steps) load_step(step);

  while (step < steps) {
    const int64_t h = step_head(step);
    const int64_t m_begin = step_begin(step);
    const int rows = static_cast<int>(min(static_cast<int64_t>(kBlockM), seq.seqlen_q - m_begin));
    KeyBlockWork next_work = KeyBlockWork::kRowRange;
    int64_t next = step + 1;
    if constexpr (kMasked) {
      next = next_step(step + 1, next_work);
      // The previous step's readers of the mask tile passed the barrier after its products.
      if (work == KeyBlockWork::kMaskTile) {
        fill_pair_mask<kBlockM, kBlockN, 1, kPitch, kThreads>(
            smem.mask, f, sequence_policy(f, b), b, h, m_begin, rows, n_begin, seq.kept_keys);
      }
    }
    // This step's tiles (and K, V) have landed for every thread, and every warp is done with
    // the previous step's dS.
    cp_async_wait<0>();
    __syncthreads();

    // P^T: keys (rows) x queries (columns). Unmasked: key n is visible to query m iff
    // n < kept_keys and, under causal masking, n * kv_stride <= m: query column >=
    // first_visible of the row. Masked: query columns [first_visible, last_visible) of the
    // lane's key range, or the mask tile.
    bool needs_mask;
    int first_visible[2];
    [[maybe_unused]] int last_visible[2];
    if constexpr (kMasked) {
      needs_mask = work == KeyBlockWork::kRowRange;
#pragma unroll
      for (int half = 0; half < 2; ++half) {
        first_visible[half] = static_cast<int>(clamp64(query_lo[half] - m_begin, 0, kBlockM));
        last_visible[half] = static_cast<int>(clamp64(query_hi[half] - m_begin, 0, kBlockM));
      }
    } else {
      needs_mask = n_begin + kBlockN > f.kept_keys ||
                   (f.causal && (n_begin + kBlockN - 1) * f.kv_stride > m_begin);
#pragma unroll
      for (int half = 0; half < 2; ++half) {
        const int64_t first = lane_key[half] >= f.kept_keys ? kBlockM
                              : f.causal                    ? lane_key[half] * f.kv_stride - m_begin
                                                            : 0;
        first_visible[half] = static_cast<int>(max(min(first, int64_t{kBlockM}), int64_t{0}));
      }
    }
    // The step's queries in sub-blocks of kSubQueries columns: at head dim 128 the S^T and
    // dP^T of all 64 would not fit in registers next to dK and dV.
#pragma unroll 1
    for (int sub = 0; sub < kBlockM; sub += kSubQueries) {
      const uint32_t sub_bytes = sub * kStride * int(sizeof(Element));  // row offset in Q, dO
      float pt[1][kSubTiles][4];
      warp_qk<Element, 1, kSubTiles, kKSteps, kStride>(pt, k_a, q_b + sub_bytes);
#pragma unroll
      for (int t = 0; t < kSubTiles; ++t) {
        const int col = sub + t * 8 + col0;
        const float2 lse = *reinterpret_cast<const float2*>(smem.lse + col);
        const float lse2[2] = {kMasked ? lse_log2(lse.x) : lse.x * kLog2e,
                               kMasked ? lse_log2(lse.y) : lse.y * kLog2e};
        float2 terms[2];
        if constexpr (kMasked) {
          if (work == KeyBlockWork::kMaskTile) {
#pragma unroll
            for (int half = 0; half < 2; ++half) {
              terms[half] = *reinterpret_cast<const float2*>(
                  smem.mask + (16 * warp + 8 * half + lane / 4) * kPitch + col);
            }
          }
        }
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          float x = pt[0][t][e] * scale_log2 - lse2[e & 1];
          if constexpr (kMasked) {
            if (needs_mask &&
                (col + (e & 1) < first_visible[e / 2] || col + (e & 1) >= last_visible[e / 2])) {
              x = -INFINITY;
            }
            if (work == KeyBlockWork::kMaskTile) {
              x = add_mask_term(x, (e & 1) ? terms[e / 2].y : terms[e / 2].x);
            }
          } else if (needs_mask && col + (e & 1) < first_visible[e / 2]) {
            x = -INFINITY;
          }
          pt[0][t][e] = fast_exp2(x);
        }
      }
      warp_pv<Element, 1, kSubTiles, kDTiles, kStride>(dv, pt, do_trans + sub * kStride);

      float dst[1][kSubTiles][4];  // dP^T, then dS^T
      warp_qk<Element, 1, kSubTiles, kKSteps, kStride>(dst, v_a, do_b + sub_bytes);
#pragma unroll
      for (int t = 0; t < kSubTiles; ++t) {
        const float2 delta = *reinterpret_cast<const float2*>(smem.delta + sub + t * 8 + col0);
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          dst[0][t][e] = pt[0][t][e] * (dst[0][t][e] - ((e & 1) ? delta.y : delta.x));
        }
      }
      warp_pv<Element, 1, kSubTiles, kDTiles, kStride>(dk, dst, q_trans + sub * kStride);

      if (kAtomicDq && first_col == 0) {  // the warps of the other columns hold the same dS^T
        // dS^T rows of the warp's keys into the [key][query] tile: a lane writes 32-bit
        // pairs; with a 36-word row pitch the 8 rows g land 4 banks apart (32 banks a warp).
#pragma unroll
        for (int t = 0; t < kSubTiles; ++t) {
#pragma unroll
          for (int half = 0; half < 2; ++half) {
            const int row = 16 * warp + 8 * half + lane / 4;
            *reinterpret_cast<uint32_t*>(smem.ds + row * Cfg::kDsStride + sub + t * 8 + col0) =
                pack<Element>(dst[0][t][2 * half], dst[0][t][2 * half + 1]);
          }
        }
      }
    }
    // The whole dS tile is written, and every warp is done with this step's Q, dO, lse, D and
    // mask tile: the next step's copies overlap the dQ atomics.
    __syncthreads();
    if (next < steps) load_step(next);
    if constexpr (kAtomicDq) {
      accumulate_dq<Element, kHeadDim, kOwnColumns>(smem,
                                                    dq_accum + stats_row(h, m_begin) * kHeadDim,
                                                    f.lse_row_stride, rows, warp, first_col, lane);
    }
    step = next;
    work = next_work;
  }

  cp_async_wait<0>();  // with no step the K/V copies must land before the tiles are reused
  __syncthreads();     // every warp is done reading K and V
  const int warp_keys = max(0, min(16, keys - 16 * warp));
  if constexpr (kMasked) {
    if (p.dk_accum != nullptr) {
      // A part of the strided pattern: add this call's share into the fp32 accumulators (the
      // block owns these rows in this launch, and the parts run one after another).
      const int64_t acc0 = b * p.acc_batch_stride + h_kv * p.acc_head_stride;
#pragma unroll
      for (int half = 0; half < 2; ++half) {
        const int key = 16 * warp + 8 * half + lane / 4;
        if (key >= keys) continue;
        const int64_t row = acc0 + (n_begin + key) * p.acc_row_stride + first_col + col0;
#pragma unroll
        for (int t = 0; t < kDTiles; ++t) {
          float2* dk_acc = reinterpret_cast<float2*>(p.dk_accum + row + t * 8);
          float2* dv_acc = reinterpret_cast<float2*>(p.dv_accum + row + t * 8);
          const float2 dk_old = *dk_acc, dv_old = *dv_acc;
          *dk_acc = make_float2(dk_old.x + dk[0][t][2 * half], dk_old.y + dk[0][t][2 * half + 1]);
          *dv_acc = make_float2(dv_old.x + dv[0][t][2 * half], dv_old.y + dv[0][t][2 * half + 1]);
        }
      }
      return;
    }
  }
  // dK (times the softmax scale) and dV of the warp's keys and columns, staged in its own rows
  // and columns of K and V.
  const int64_t dk_row = p.dk_row_stride * f.kv_stride;  // logical key n is physical row n * s
  const int64_t dv_row = p.dv_row_stride * f.kv_stride;
  Element* dk_out = static_cast<Element*>(p.dk) + b * p.dk_batch_stride + h_kv * p.dk_head_stride +
                    seq.k_row0 * p.dk_row_stride + (n_begin + 16 * warp) * dk_row + first_col;
  Element* dv_out = static_cast<Element*>(p.dv) + b * p.dv_batch_stride + h_kv * p.dv_head_stride +
                    seq.k_row0 * p.dv_row_stride + (n_begin + 16 * warp) * dv_row + first_col;
  store_warp_tile<Element, kOwnColumns, kStride>(dk, static_cast<float>(p.scale),
                                                 smem.k + 16 * warp * kStride + first_col, dk_out,
                                                 dk_row, warp_keys, lane);
  store_warp_tile<Element, kOwnColumns, kStride>(dv, 1.f, smem.v + 16 * warp * kStride + first_col,
                                                 dv_out, dv_row, warp_keys, lane);

  // Physical rows between the block's kept keys (j % kv_stride != 0) get zero gradients (the
  // tensor-core path takes varlen with kv_stride 1 only).
  if (f.kv_stride > 1) {
    const int64_t first_row = n_begin * f.kv_stride;
    const int64_t end_row = min((n_begin + kBlockN) * f.kv_stride, p.seqlen_k);
    Element* dk_head =
        static_cast<Element*>(p.dk) + b * p.dk_batch_stride + h_kv * p.dk_head_stride;
    Element* dv_head =
        static_cast<Element*>(p.dv) + b * p.dv_batch_stride + h_kv * p.dv_head_stride;
    const Element zero_value = Element(0.f);
    for (int64_t i = thread; i < (end_row - first_row) * kHeadDim; i += kThreads) {
      const int64_t row = first_row + i / kHeadDim;
      const int64_t col = i % kHeadDim;
      if (row % f.kv_stride != 0) {
        dk_head[row * p.dk_row_stride + col] = zero_value;
        dv_head[row * p.dv_row_stride + col] = zero_value;
      }
    }
  }
}

// Deterministic dQ: one block per (batch, head, 64 queries); warp w owns query rows
// [16w, 16w + 16) and sums dS K over the visible key blocks in order, in registers.
template <typename Element, int kHeadDim, bool kMasked>
__device__ __forceinline__ void dq_block(const detail::BackwardKernelParams& p) {
  using Cfg = BackwardConfig<kHeadDim>;
  constexpr int kBlockM = Cfg::kBlockM;
  constexpr int kBlockN = Cfg::kBlockN;
  constexpr int kThreads = Cfg::kThreads;
  constexpr int kStride = Cfg::kRowStride;
  constexpr int kNTiles = kBlockN / 8;
  constexpr int kDTiles = Cfg::kDTiles;
  constexpr int kKSteps = Cfg::kKSteps;
  constexpr int kPitch = Cfg::kMaskPitch;
  const detail::ForwardKernelParams& f = p.fwd;

  extern __shared__ __align__(16) unsigned char shared_bytes[];
  const BackwardSmem<Element, kHeadDim> smem(shared_bytes);

  const int64_t num_m_blocks = (f.seqlen_q + kBlockM - 1) / kBlockM;
  const int64_t m_block = num_m_blocks - 1 - blockIdx.x % num_m_blocks;
  const int64_t batch_head = blockIdx.x / num_m_blocks;
  const int64_t b = batch_head / f.heads_q;
  const int64_t h = batch_head % f.heads_q;
  const int64_t h_kv = h / f.group_size;
  const int64_t m_begin = m_block * kBlockM;
  SequenceExtent seq{0, 0, f.seqlen_q, f.kept_keys, 0};
  [[maybe_unused]] detail::MaskPolicy policy = f.policy;
  if constexpr (kMasked) {
    seq = sequence_extent(f, b);
    if (m_begin >= seq.seqlen_q) return;  // varlen: past the end of this sequence
    policy = sequence_policy(f, seq);
  }
  const int rows = static_cast<int>(min(static_cast<int64_t>(kBlockM), seq.seqlen_q - m_begin));
  // Keys of the block's rows: unmasked [0, key_end) by causal; masked the union of the rows'
  // ranges, and [common_begin, common_end) the keys every row sees.
  int64_t key_begin = 0;
  int64_t key_end = kMasked ? 0 : block_key_end(f, m_begin, rows);
  [[maybe_unused]] int64_t common_begin = 0, common_end = 0;
  [[maybe_unused]] bool mask_tile_on = false;
  if constexpr (kMasked) {
    const detail::Span first =
        detail::visible_key_span(policy, m_begin, seq.kept_keys, f.kv_stride);
    const detail::Span last =
        detail::visible_key_span(policy, m_begin + rows - 1, seq.kept_keys, f.kv_stride);
    key_begin = first.begin;
    key_end = max(last.end, first.begin);
    common_begin = last.begin;
    common_end = first.end;
    mask_tile_on = detail::needs_mask_tile(f);
  }
  const int64_t n_blocks = (key_end + kBlockN - 1) / kBlockN;

  load_tile_async<kBlockM, kHeadDim, kStride, kThreads>(
      smem.q,
      static_cast<const Element*>(f.q) + b * f.q_batch_stride + h * f.q_head_stride +
          (seq.q_row0 + m_begin) * f.q_row_stride,
      f.q_row_stride, rows);
  load_tile_async<kBlockM, kHeadDim, kStride, kThreads>(
      smem.dout,
      static_cast<const Element*>(p.dout) + b * p.do_batch_stride + h * p.do_head_stride +
          (seq.q_row0 + m_begin) * p.do_row_stride,
      p.do_row_stride, rows);
  cp_async_commit();
  const Element* k = static_cast<const Element*>(f.k) + b * f.k_batch_stride +
                     h_kv * f.k_head_stride + seq.k_row0 * (f.k_row_stride / f.kv_stride);
  const Element* v = static_cast<const Element*>(f.v) + b * f.v_batch_stride +
                     h_kv * f.v_head_stride + seq.k_row0 * (f.v_row_stride / f.kv_stride);

  const int warp = static_cast<int>(threadIdx.x) / 32;
  const int lane = static_cast<int>(threadIdx.x) % 32;
  const int col0 = 2 * (lane % 4);
  const uint32_t q_a =
      shared_address(smem.q + 16 * warp * kStride + q_lane_offset<Element, kStride>(lane));
  const uint32_t do_a =
      shared_address(smem.dout + 16 * warp * kStride + q_lane_offset<Element, kStride>(lane));
  const uint32_t k_b = shared_address(smem.k + k_lane_offset<Element, kStride>(lane));
  const uint32_t v_b = shared_address(smem.v + k_lane_offset<Element, kStride>(lane));
  const Element* k_trans = smem.k + v_lane_offset<Element, kStride>(lane);

  // The lane's rows g and g + 8: lse * log2(e), D and the keys they see (unmasked: relative to
  // key_end, as in the forward; masked: their ranges). Padding rows get P = 0 through lse = +inf.
  float lse2[2], delta[2];
  int key_gap[2];
  [[maybe_unused]] int64_t key_lo[2] = {0, 0}, key_hi[2] = {0, 0};
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    const int row = 16 * warp + 8 * half + lane / 4;
    // lse and D exist only when some key does (lse may be null otherwise).
    const bool real = row < rows && n_blocks > 0;
    const int64_t stats = b * f.lse_batch_stride + h * f.lse_head_stride +
                          (seq.q_row0 + m_begin + row) * f.lse_row_stride;
    const float lse = real ? static_cast<const float*>(f.lse)[stats] : -INFINITY;
    lse2[half] = real ? (kMasked ? lse_log2(lse) : lse * kLog2e) : INFINITY;
    delta[half] = real ? static_cast<const float*>(p.delta)[stats] : 0.f;
    if constexpr (kMasked) {
      const detail::Span span =
          detail::visible_key_span(policy, m_begin + row, seq.kept_keys, f.kv_stride);
      key_lo[half] = span.begin;
      key_hi[half] = span.end;
      key_gap[half] = 0;
    } else {
      key_gap[half] = static_cast<int>(key_end - row_key_end(f, m_begin + row));
    }
  }
  const float scale_log2 = static_cast<float>(f.scale_log2);

  float dq[1][kDTiles][4];
  zero(dq);
  for (int64_t n_block = key_begin / kBlockN; n_block < n_blocks; ++n_block) {
    const int64_t n_begin = n_block * kBlockN;
    KeyBlockWork work = KeyBlockWork::kNone;
    if constexpr (kMasked) {
      // Uniform over the block: a key block none of the rows sees costs nothing.
      work = pair_work(f, sequence_policy(f, b), mask_tile_on, b, h, m_begin, rows, kBlockM,
                       n_begin, kBlockN, seq.kept_keys, 0, seq.seqlen_q, common_begin, common_end);
      if (work == KeyBlockWork::kSkip) continue;
    }
    const int keys = static_cast<int>(min(static_cast<int64_t>(kBlockN), key_end - n_begin));
    __syncthreads();  // every warp is done with the previous K, V and mask tile
    load_tile_async<kBlockN, kHeadDim, kStride, kThreads>(smem.k, k + n_begin * f.k_row_stride,
                                                          f.k_row_stride, keys);
    load_tile_async<kBlockN, kHeadDim, kStride, kThreads>(smem.v, v + n_begin * f.v_row_stride,
                                                          f.v_row_stride, keys);
    cp_async_commit();
    if constexpr (kMasked) {
      if (work == KeyBlockWork::kMaskTile) {
        fill_pair_mask<kBlockM, kBlockN, kPitch, 1, kThreads>(
            smem.mask, f, sequence_policy(f, b), b, h, m_begin, rows, n_begin, seq.kept_keys);
      }
    }
    cp_async_wait<0>();
    __syncthreads();

    float s[1][kNTiles][4];
    warp_qk<Element, 1, kNTiles, kKSteps, kStride>(s, q_a, k_b);
    bool needs_mask;
    [[maybe_unused]] int lo[2], hi[2];
    int block_keys;
    if constexpr (kMasked) {
      needs_mask = work == KeyBlockWork::kRowRange;
      block_keys = 0;
#pragma unroll
      for (int half = 0; half < 2; ++half) {
        lo[half] = static_cast<int>(clamp64(key_lo[half] - n_begin, 0, kBlockN));
        hi[half] = static_cast<int>(clamp64(key_hi[half] - n_begin, 0, kBlockN));
      }
    } else {
      needs_mask = n_begin + kBlockN > f.kept_keys ||
                   (f.causal && (n_begin + kBlockN - 1) * f.kv_stride > m_begin);
      block_keys = static_cast<int>(min(key_end - n_begin, int64_t{kBlockM + kBlockN}));
    }
#pragma unroll
    for (int t = 0; t < kNTiles; ++t) {
      [[maybe_unused]] float2 terms[2];
      if constexpr (kMasked) {
        if (work == KeyBlockWork::kMaskTile) {
#pragma unroll
          for (int half = 0; half < 2; ++half) {
            terms[half] = *reinterpret_cast<const float2*>(
                smem.mask + (16 * warp + 8 * half + lane / 4) * kPitch + t * 8 + col0);
          }
        }
      }
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int key = t * 8 + col0 + (e & 1);
        float x = s[0][t][e] * scale_log2 - lse2[e / 2];
        if constexpr (kMasked) {
          if (needs_mask && (key < lo[e / 2] || key >= hi[e / 2])) x = -INFINITY;
          if (work == KeyBlockWork::kMaskTile) {
            x = add_mask_term(x, (e & 1) ? terms[e / 2].y : terms[e / 2].x);
          }
        } else if (needs_mask && key >= block_keys - key_gap[e / 2]) {
          x = -INFINITY;
        }
        s[0][t][e] = fast_exp2(x);
      }
    }
    float ds[1][kNTiles][4];  // dP, then dS
    warp_qk<Element, 1, kNTiles, kKSteps, kStride>(ds, do_a, v_b);
#pragma unroll
    for (int t = 0; t < kNTiles; ++t) {
#pragma unroll
      for (int e = 0; e < 4; ++e) ds[0][t][e] = s[0][t][e] * (ds[0][t][e] - delta[e / 2]);
    }
    warp_pv<Element, 1, kNTiles, kDTiles, kStride>(dq, ds, k_trans);
  }

  // With no key block the Q/dO copies (issued by every thread for every row) must land before
  // a warp overwrites its Q rows.
  cp_async_wait<0>();
  __syncthreads();
  const int warp_rows = max(0, min(16, rows - 16 * warp));
  Element* dq_out = static_cast<Element*>(p.dq) + b * p.dq_batch_stride + h * p.dq_head_stride +
                    (seq.q_row0 + m_begin + 16 * warp) * p.dq_row_stride;
  store_warp_tile<Element, kHeadDim, kStride>(dq, static_cast<float>(p.scale),
                                              smem.q + 16 * warp * kStride, dq_out, p.dq_row_stride,
                                              warp_rows, lane);
}

// The kernel bodies exist only for sm80+ (cp.async, bf16 mma); the host never launches them on
// older devices, and an sm75 build traps instead of silently writing nothing.
template <typename Element, int kHeadDim, bool kAtomicDq, bool kMasked>
__global__ void __launch_bounds__(BackwardConfig<kHeadDim>::kDkdvThreads,
                                  BackwardConfig<kHeadDim>::kDkdvMinBlocksPerSm)
    backward_dkdv_kernel(const __grid_constant__ detail::BackwardKernelParams p) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  dkdv_block<Element, kHeadDim, kAtomicDq, kMasked>(p);
#else
  __trap();
#endif
}

template <typename Element, int kHeadDim, bool kMasked>
__global__ void __launch_bounds__(BackwardConfigBase::kThreads, BackwardConfigBase::kMinBlocksPerSm)
    backward_dq_kernel(const __grid_constant__ detail::BackwardKernelParams p) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  dq_block<Element, kHeadDim, kMasked>(p);
#else
  __trap();
#endif
}

// dq = scale * dq_accum, rounded to the element type. The accumulator has the lse's row layout:
// contiguous (batch, heads_q, seqlen_q, head_dim), or (heads_q, total_q, head_dim) for varlen;
// dq has arbitrary row/head/batch strides.
inline constexpr int kConvertThreads = 256;

template <typename Element>
__global__ void __launch_bounds__(kConvertThreads)
    backward_dq_convert_kernel(const __grid_constant__ detail::BackwardKernelParams p) {
  const detail::ForwardKernelParams& f = p.fwd;
  const int64_t dim = f.head_dim;
  const bool varlen = f.cu_seqlens_q != nullptr;
  const int64_t rows_per_head = varlen ? f.total_q : f.seqlen_q;
  const int64_t total = (varlen ? f.heads_q : f.batch * f.heads_q) * rows_per_head * dim;
  const float scale = static_cast<float>(p.scale);
  const float* accum = static_cast<const float*>(p.dq_accum);
  Element* dq = static_cast<Element*>(p.dq);
  const int64_t step = static_cast<int64_t>(gridDim.x) * kConvertThreads;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * kConvertThreads + threadIdx.x; i < total;
       i += step) {
    const int64_t col = i % dim;
    const int64_t row = i / dim;  // (b * heads_q + h) * rows_per_head + query
    const int64_t query = row % rows_per_head;
    const int64_t bh = row / rows_per_head;
    const int64_t offset = bh / f.heads_q * p.dq_batch_stride + bh % f.heads_q * p.dq_head_stride +
                           query * p.dq_row_stride + col;
    dq[offset] = Element(accum[i] * scale);
  }
}

// dk = scale * dk_accum and dv = dv_accum (the strided pattern's parts), rounded to the element
// type; the accumulators are contiguous (batch, heads_kv, seqlen_k, head_dim), dk and dv have
// arbitrary strides (kv_stride is 1 there).
template <typename Element>
__global__ void __launch_bounds__(kConvertThreads)
    backward_dkdv_convert_kernel(const __grid_constant__ detail::BackwardKernelParams p) {
  const int64_t dim = p.fwd.head_dim;
  const int64_t total = p.fwd.batch * p.heads_kv * p.seqlen_k * dim;
  const float scale = static_cast<float>(p.scale);
  const int64_t step = static_cast<int64_t>(gridDim.x) * kConvertThreads;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * kConvertThreads + threadIdx.x; i < total;
       i += step) {
    const int64_t col = i % dim;
    const int64_t row = i / dim;  // (b * heads_kv + h) * seqlen_k + key
    const int64_t key = row % p.seqlen_k;
    const int64_t bh = row / p.seqlen_k;
    const int64_t b = bh / p.heads_kv, h = bh % p.heads_kv;
    static_cast<Element*>(
        p.dk)[b * p.dk_batch_stride + h * p.dk_head_stride + key * p.dk_row_stride + col] =
        Element(p.dk_accum[i] * scale);
    static_cast<Element*>(
        p.dv)[b * p.dv_batch_stride + h * p.dv_head_stride + key * p.dv_row_stride + col] =
        Element(p.dv_accum[i]);
  }
}

}  // namespace samattn::tensor_core
