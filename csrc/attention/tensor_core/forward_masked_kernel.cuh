// Internal: the tensor-core forward with masks (FlashAttention-2 design on mma.sync, sm80+,
// fp16/bf16): the unmasked kernel's tiles, pipeline and softmax (forward_kernel.cuh), plus
//   - the mask policy (attention/mask_policy.h, the SIMT kernels' and the reference's): each query
//     block walks only the keys its rows can see by causal and the window, and classifies every
//     key block of them as skipped (nothing visible: no loads, no math), full (no masking work) or
//     partial;
//   - partial blocks of causal / window / kv_stride / sequence ends (a contiguous key range per
//     row) compare each score's key with its row's range in registers; partial blocks of a
//     pattern, a block map or an element mask take every term (0, -inf or the additive value, in
//     the log2 domain) from a shared tile filled once per block by the whole block with
//     simt::masked_score, the definition the SIMT kernels use;
//   - varlen in one launch (sequence offsets read from cu_seqlens on the device; blocks past a
//     sequence's end exit at once), an fp32 output and a strided lse (for the strided pattern's
//     residue views), and a prior softmax part merged into each row before it is normalised, so
//     the strided pattern's two parts are rounded once (attention/strided_pattern.h).
// A row that sees no key gets output 0 and lse -inf.
#pragma once

#include <cstdint>

#include "attention/kernel_params.h"
#include "attention/mask_policy.cuh"
#include "attention/tensor_core/forward_config.h"
#include "attention/tensor_core/mma.cuh"
#include "attention/tensor_core/online_softmax.cuh"
#include "attention/tensor_core/tile_io.cuh"
#include "attention/tensor_core/warp_gemm.cuh"

namespace samattn::tensor_core {

// Where sequence b lives: its first q/out row and k/v (physical) row, and its lengths. Dense
// batches: 0, 0, seqlen_q, kept_keys. Varlen: from cu_seqlens, clamped so that any contents stay
// inside the packed tensors.
struct SequenceExtent {
  int64_t q_row0, k_row0;
  int64_t seqlen_q, kept_keys;
  int64_t seqlen_k;  // physical key rows (varlen only: dense calls' policy is set on the host)
};

__device__ __forceinline__ int64_t clamp64(int64_t x, int64_t lo, int64_t hi) {
  return x < lo ? lo : (x > hi ? hi : x);
}

__device__ __forceinline__ SequenceExtent sequence_extent(const detail::ForwardKernelParams& p,
                                                          int64_t b) {
  if (p.cu_seqlens_q == nullptr) {
    const bool last = b == p.batch - 1 && p.last_batch_kept_keys > 0;
    return {0, 0, p.seqlen_q, last ? p.last_batch_kept_keys : p.kept_keys, 0};
  }
  const int64_t q0 = clamp64(p.cu_seqlens_q[b], 0, p.total_q);
  const int64_t q1 = clamp64(p.cu_seqlens_q[b + 1], q0, p.total_q);
  const int64_t k0 = clamp64(p.cu_seqlens_k[b], 0, p.total_k);
  const int64_t k1 = clamp64(p.cu_seqlens_k[b + 1], k0, p.total_k);
  const int64_t keys = (k1 - k0 + p.kv_stride - 1) / p.kv_stride;
  return {q0, k0, min(q1 - q0, p.seqlen_q), min(keys, p.kept_keys), k1 - k0};
}

// The mask policy of sequence `seq`: the call's, with a varlen sequence's own bottom-right
// causal shift (for dense calls the host set it from the call's lengths).
__device__ __forceinline__ detail::MaskPolicy sequence_policy(const detail::ForwardKernelParams& p,
                                                              const SequenceExtent& seq) {
  return p.cu_seqlens_q != nullptr && p.policy.lower_right
             ? detail::for_sequence(p.policy, seq.seqlen_q, seq.seqlen_k)
             : p.policy;
}

// The same for batch entry b, read again from cu_seqlens: what a key loop calls where it needs
// the policy, rather than keep the shift in registers next to its accumulators (kept, it cost
// the backward's masked dK/dV kernel 8-16 more bytes of spills at head dim 128).
__device__ __forceinline__ detail::MaskPolicy sequence_policy(const detail::ForwardKernelParams& p,
                                                              int64_t b) {
  return p.cu_seqlens_q != nullptr && p.policy.lower_right
             ? sequence_policy(p, sequence_extent(p, b))
             : p.policy;
}

// What a key block needs, decided uniformly for the thread block: nothing (skipped), no masking,
// or one kind of partial masking.
enum class KeyBlockWork : int { kSkip, kNone, kRowRange, kFixedPattern, kMaskTile };

// How the call masks a partial key block whose block-map entries (if any) are all listed: per-row
// key ranges (causal, window, kv_stride, sequence ends), the fixed pattern in registers, or the
// mask tile (an element mask, the strided pattern element by element). A block that a block map
// lists only in part takes the mask tile whatever this says.
__device__ __forceinline__ KeyBlockWork register_work(const detail::ForwardKernelParams& p) {
  if (p.mask != nullptr || p.policy.pattern == SparsePattern::kStrided) {
    return KeyBlockWork::kMaskTile;
  }
  return p.policy.pattern == SparsePattern::kFixed ? KeyBlockWork::kFixedPattern
                                                   : KeyBlockWork::kRowRange;
}

// A key block's class: any visible pair (live), some hidden pair (partial), and whether masking it
// needs the mask tile (a block map lists it only in part).
struct KeyBlockClass {
  bool live, partial, tile;
};

// With a pattern, block map or element mask (`by_policy`): the policy's classification of the
// rectangle, the block map's, an element mask and the sequence end (as
// simt::classify_key_block, keeping the map's verdict apart). Otherwise the block is partial iff
// some row's key range does not cover it ([common_begin, common_end) is the keys every row of the
// query block sees).
__device__ __forceinline__ KeyBlockClass classify(const detail::ForwardKernelParams& p,
                                                  const detail::MaskPolicy& policy, bool by_policy,
                                                  int64_t b, int64_t h, int64_t m_begin, int rows,
                                                  int64_t n_begin, int block_n, int64_t key_end,
                                                  int64_t common_begin, int64_t common_end) {
  if (!by_policy) {
    const bool covered = n_begin >= common_begin && n_begin + block_n <= common_end;
    return {true, !covered, false};
  }
  const int64_t n_last = min(n_begin + block_n, key_end) - 1;
  if (n_last < n_begin) return {false, false, false};
  const detail::BlockClass structure = detail::classify_block(
      policy, m_begin, m_begin + rows, n_begin * p.kv_stride, n_last * p.kv_stride + 1);
  if (structure == detail::BlockClass::kSkip) return {false, false, false};
  detail::BlockClass map = detail::BlockClass::kFull;
  if (p.block_map != nullptr) {
    map = simt::block_map_class(p, b, h, m_begin, m_begin + rows, n_begin * p.kv_stride,
                                n_last * p.kv_stride + 1);
    if (map == detail::BlockClass::kSkip) return {false, false, false};
  }
  const bool map_partial = map == detail::BlockClass::kPartial;
  const bool partial = map_partial || structure == detail::BlockClass::kPartial ||
                       p.mask != nullptr || n_begin + block_n > key_end;
  return {true, partial, map_partial};
}

// The classes of 32 key blocks at a time, one per lane, as two ballots: the walk down the key
// blocks then costs one parallel classification (one round of block-map reads) per 32 blocks
// instead of one dependent read per block. Every warp computes the same bits (same inputs), so
// the thread block stays uniform without a barrier; each warp keeps them in its own shared record
// (registers are full next to the O and S accumulators), with the summary-column bits of the
// current key block under the fixed pattern.
constexpr int kMaxSummaryWords = 4;  // key blocks of up to 128 keys

struct KeyBlockWindow {
  int top;                             // bit d is key block top - d
  uint32_t live;                       // blocks with a visible pair
  uint32_t partial;                    // blocks with a hidden pair too
  uint32_t tile;                       // partial blocks that need the mask tile
  uint32_t summary[kMaxSummaryWords];  // fixed pattern: bit k of word w, key 32 w + k a summary
};

// The fixed pattern's summary columns among logical keys [n_begin, n_begin + kBlockN): one ballot
// per 32 keys, written to the warp's record by lane 0 (read by the warp after a barrier).
template <int kBlockN>
__device__ __forceinline__ void record_summary_columns(KeyBlockWindow& record,
                                                       const detail::ForwardKernelParams& p,
                                                       int n_begin, int lane) {
  static_assert(kBlockN % 32 == 0 && kBlockN / 32 <= kMaxSummaryWords, "one ballot per 32 keys");
  const int l = static_cast<int>(p.policy.block);
  const int summary_from = l - static_cast<int>(p.policy.summary);
#pragma unroll
  for (int w = 0; w < kBlockN / 32; ++w) {
    // Positions stay below 2^31: the dispatcher keeps masked calls below 2^30 keys.
    const int position = (n_begin + 32 * w + lane) * static_cast<int>(p.kv_stride);
    const uint32_t bits = __ballot_sync(0xffffffffu, position % l >= summary_from);
    if (lane == 0) record.summary[w] = bits;
  }
}

// Masks the scores of a partial key block of the fixed pattern (query i sees position j <= i
// when j / l == i / l or j % l >= l - c) in registers: lane row r keeps key `key` (relative to
// the block) when it lies in the row's causal/window range [lo[r], hi[r]) and either in the row's
// own pattern block or on a summary column. The summary bits come from the warp's record; each
// row's first logical key of its pattern block, ceil(l * floor(i / l) / kv_stride), from
// row_start (block row -> key, filled once per thread block). The pattern block's end needs no
// check: the pattern is causal, and the row's range already ends at position i < j0 + l.
template <int kMTiles, int kNTiles, int kBlockN>
__device__ __forceinline__ void mask_fixed_pattern(float (&s)[kMTiles][kNTiles][4],
                                                   const uint32_t* summary_words,
                                                   const int* row_start, int n_begin,
                                                   const int (&lo)[2 * kMTiles],
                                                   const int (&hi)[2 * kMTiles], int lane) {
  const int col0 = 2 * (lane % 4);
  uint32_t summary[kBlockN / 32];
#pragma unroll
  for (int w = 0; w < kBlockN / 32; ++w) summary[w] = summary_words[w] >> col0;
  int same_lo[2 * kMTiles];
#pragma unroll
  for (int r = 0; r < 2 * kMTiles; ++r) same_lo[r] = row_start[8 * r] - n_begin;
#pragma unroll
  for (int m = 0; m < kMTiles; ++m) {
#pragma unroll
    for (int t = 0; t < kNTiles; ++t) {
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int r = 2 * m + e / 2;
        const int key = t * 8 + col0 + (e & 1);
        const bool on_summary = (summary[t / 4] >> ((t % 4) * 8 + (e & 1))) & 1u;
        const bool same_block = key >= same_lo[r];
        if (key < lo[r] || key >= hi[r] || !(same_block || on_summary)) s[m][t][e] = -INFINITY;
      }
    }
  }
}

// Fills tile[row * kPitch + key] with the mask term of query m_begin + row and logical key
// n_begin + key for the block's `rows` valid rows (fill_rows_past_end set the others once). The
// whole block calls it; consecutive threads take consecutive keys (coalesced mask reads,
// conflict-free stores).
template <int kBlockM, int kBlockN, int kPitch, int kThreads>
__device__ __forceinline__ void fill_mask_tile(float* tile, const detail::ForwardKernelParams& p,
                                               const detail::MaskPolicy& policy, int64_t b,
                                               int64_t h, int64_t m_begin, int rows,
                                               int64_t n_begin, int64_t key_end) {
#pragma unroll 1
  for (int e = threadIdx.x; e < rows * kBlockN; e += kThreads) {
    const int row = e / kBlockN;
    const int key = e % kBlockN;
    tile[row * kPitch + key] =
        simt::masked_score<float>(p, policy, b, h, m_begin + row, n_begin + key, key_end, 0.f);
  }
}

// The mask tile's rows past the block's `rows` valid ones: -inf, once per block (they are never
// stored; fill_mask_tile leaves them). A decoding call's block has one valid row of 128:
// filling all of them on every key block was 128 times the mask work it needs (stop 51).
template <int kBlockM, int kBlockN, int kPitch, int kThreads>
__device__ __forceinline__ void fill_rows_past_end(float* tile, int rows) {
#pragma unroll 1
  for (int e = rows * kBlockN + static_cast<int>(threadIdx.x); e < kBlockM * kBlockN;
       e += kThreads) {
    tile[(e / kBlockN) * kPitch + e % kBlockN] = -INFINITY;
  }
}

template <typename Element, int kHeadDim>
__device__ __forceinline__ void masked_forward_block(const detail::ForwardKernelParams& p) {
  using Cfg = ForwardConfig<kHeadDim, int(sizeof(Element))>;
  constexpr int kBlockM = Cfg::kBlockM;
  constexpr int kBlockN = Cfg::kBlockN;
  constexpr int kThreads = Cfg::kThreads;
  constexpr int kStride = Cfg::kRowStride;
  constexpr int kMTiles = Cfg::kMTiles;
  constexpr int kRows = 2 * kMTiles;
  constexpr int kNTiles = kBlockN / 8;
  constexpr int kDTiles = kHeadDim / 8;
  constexpr int kKSteps = kHeadDim * int(sizeof(Element)) / 32;
  constexpr int kPitch = Cfg::kMaskPitch;

  extern __shared__ __align__(16) unsigned char shared_bytes[];
  Element* q_tile = reinterpret_cast<Element*>(shared_bytes);  // (kBlockM, kStride)
  Element* k_tile = q_tile + Cfg::kQTileElems;                 // (kBlockN, kStride)
  Element* v_tile = k_tile + Cfg::kKVTileElems;                // (kBlockN, kStride)
  KeyBlockWindow* windows = reinterpret_cast<KeyBlockWindow*>(shared_bytes + Cfg::kSmemBytes);
  int* row_start = reinterpret_cast<int*>(windows + Cfg::kWarps);  // (kBlockM): fixed pattern
  float* mask_tile = reinterpret_cast<float*>(shared_bytes + Cfg::kSmemBytes +
                                              Cfg::kKeyWindowBytes);  // (kBlockM, kPitch)
  static_assert(Cfg::kKeyWindowBytes ==
                    Cfg::kWarps * int(sizeof(KeyBlockWindow)) + kBlockM * int(sizeof(int)),
                "records and row starts");

  // Block coordinates and key indices as 32-bit values (fewer registers next to the O and S
  // accumulators): the dispatcher keeps calls with 2^30 or more rows or keys on SIMT, and the
  // grid is below 2^31 blocks.
  const int num_m_blocks = static_cast<int>((p.seqlen_q + kBlockM - 1) / kBlockM);
  const int block = static_cast<int>(blockIdx.x);
  const int m_block = num_m_blocks - 1 - block % num_m_blocks;
  const int batch_head = block / num_m_blocks;
  const int b = batch_head / static_cast<int>(p.heads_q);
  const int h = batch_head % static_cast<int>(p.heads_q);
  const int h_kv = h / static_cast<int>(p.group_size);
  const int m_begin = m_block * kBlockM;
  const SequenceExtent seq = sequence_extent(p, b);
  if (m_begin >= seq.seqlen_q) return;  // varlen: the whole block is past its sequence's end
  const int rows = static_cast<int>(min(static_cast<int64_t>(kBlockM), seq.seqlen_q - m_begin));
  const detail::MaskPolicy policy = sequence_policy(p, seq);

  // Keys the block's rows can see (first row's begin to last row's end), and the keys all of them
  // see (last row's begin to first row's end): both ends of a row's range grow with the row.
  const detail::Span first_span =
      detail::visible_key_span(policy, m_begin, seq.kept_keys, p.kv_stride);
  const detail::Span last_span =
      detail::visible_key_span(policy, m_begin + rows - 1, seq.kept_keys, p.kv_stride);
  const int key_begin = static_cast<int>(first_span.begin);
  const int key_end = static_cast<int>(max(last_span.end, first_span.begin));
  const int common_begin = static_cast<int>(last_span.begin);
  const int common_end = static_cast<int>(first_span.end);
  const int first_block = key_begin / kBlockN;

  const int64_t k_phys_row = p.k_row_stride / p.kv_stride;  // one physical row of k
  const int64_t v_phys_row = p.v_row_stride / p.kv_stride;
  const Element* q = static_cast<const Element*>(p.q) + b * p.q_batch_stride + h * p.q_head_stride +
                     (seq.q_row0 + m_begin) * p.q_row_stride;
  const Element* k = static_cast<const Element*>(p.k) + b * p.k_batch_stride +
                     h_kv * p.k_head_stride + seq.k_row0 * k_phys_row;
  const Element* v = static_cast<const Element*>(p.v) + b * p.v_batch_stride +
                     h_kv * p.v_head_stride + seq.k_row0 * v_phys_row;

  const int warp = static_cast<int>(threadIdx.x) / 32;
  const int lane = static_cast<int>(threadIdx.x) % 32;

  // The next key block at or below n_block that is not skipped (first_block - 1 when none), and
  // its work; the whole block calls it at the same points (the ballots need every lane).
  KeyBlockWindow& window = windows[warp];
  if (lane == 0) window.top = -1;
  __syncwarp();
  if (register_work(p) == KeyBlockWork::kFixedPattern) {
    // Read after the main loop's first barrier.
    const int l = static_cast<int>(p.policy.block);
    const int stride = static_cast<int>(p.kv_stride);
    for (int row = static_cast<int>(threadIdx.x); row < kBlockM; row += kThreads) {
      const int i = m_begin + row;
      row_start[row] = (i - i % l + stride - 1) / stride;
    }
  }
  const auto next_block = [&](int n_block, KeyBlockWork& work) {
    while (n_block >= first_block) {
      int top = window.top;
      uint32_t live, partial, tile;
      if (n_block > top || n_block <= top - 32) {
        const int mine = n_block - lane;
        const KeyBlockClass c =
            mine >= first_block
                ? classify(p, policy, detail::needs_mask_tile(p), b, h, m_begin, rows,
                           mine * kBlockN, kBlockN, key_end, common_begin, common_end)
                : KeyBlockClass{false, false, false};
        top = n_block;
        live = __ballot_sync(0xffffffffu, c.live);
        partial = __ballot_sync(0xffffffffu, c.partial);
        tile = __ballot_sync(0xffffffffu, c.tile);
        __syncwarp();  // every lane has read the old record
        if (lane == 0) {
          window.top = top;
          window.live = live;
          window.partial = partial;
          window.tile = tile;
        }
        __syncwarp();
      } else {
        live = window.live;
        partial = window.partial;
        tile = window.tile;
      }
      const uint32_t ahead = live >> (top - n_block);  // bit 0: n_block
      if (ahead != 0) {
        n_block -= __ffs(ahead) - 1;
        const int d = top - n_block;
        // p lives in the constant bank: re-deriving the kind costs no register.
        work = !((partial >> d) & 1u) ? KeyBlockWork::kNone
               : (tile >> d) & 1u     ? KeyBlockWork::kMaskTile
                                      : register_work(p);
        return n_block;
      }
      n_block = top - 32;
    }
    return n_block;
  };

  // Rows that see no key (an empty range: a window starting past the last key) run no block.
  KeyBlockWork work = KeyBlockWork::kSkip;
  int n_block = key_end > key_begin ? next_block((key_end + kBlockN - 1) / kBlockN - 1, work)
                                    : first_block - 1;
  load_tile_async<kBlockM, kHeadDim, kStride, kThreads>(q_tile, q, p.q_row_stride, rows);
  cp_async_commit();
  if (n_block >= first_block) {
    const int n_begin = n_block * kBlockN;
    load_tile_async<kBlockN, kHeadDim, kStride, kThreads>(
        k_tile, k + n_begin * p.k_row_stride, p.k_row_stride, min(kBlockN, key_end - n_begin));
  }
  cp_async_commit();

  const int warp_row0 = warp * Cfg::kWarpRows;
  const uint32_t q_lane =
      shared_address(q_tile + warp_row0 * kStride + q_lane_offset<Element, kStride>(lane));
  const uint32_t k_lane = shared_address(k_tile + k_lane_offset<Element, kStride>(lane));
  const Element* v_lane = v_tile + v_lane_offset<Element, kStride>(lane);
  const int col0 = 2 * (lane % 4);

  // Lane row r is query row warp_row0 + 8 * r + lane / 4 of the block; it sees the keys
  // [key_begin + lo, key_end - gap), lo and gap packed as 16-bit halves of key_limits[r]: both
  // are at most about kBlockM / kv_stride + 1, since the ends of a row's range grow with the row
  // by at most one key per kv_stride rows.
  uint32_t key_limits[kRows];
#pragma unroll
  for (int r = 0; r < kRows; ++r) {
    const detail::Span span = detail::visible_key_span(
        policy, m_begin + warp_row0 + 8 * r + lane / 4, seq.kept_keys, p.kv_stride);
    const int64_t lo = clamp64(span.begin - key_begin, 0, 0xffff);
    const int64_t gap = clamp64(key_end - span.end, 0, 0xffff);
    key_limits[r] = static_cast<uint32_t>(lo) | (static_cast<uint32_t>(gap) << 16);
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
  // Published by the first key block's barrier, like the tile's other rows.
  if (detail::forward_needs_mask_tile(p) && rows < kBlockM) {
    fill_rows_past_end<kBlockM, kBlockN, kPitch, kThreads>(mask_tile, rows);
  }

  while (n_block >= first_block) {
    const int n_begin = n_block * kBlockN;
    const int keys = min(kBlockN, key_end - n_begin);
    // The block after this one, found while S is not live (fewer registers than next to it).
    KeyBlockWork next_work = KeyBlockWork::kSkip;
    const int next = next_block(n_block - 1, next_work);
    // The previous block's readers of the mask tile passed the barrier before its P V.
    if (work == KeyBlockWork::kMaskTile) {
      fill_mask_tile<kBlockM, kBlockN, kPitch, kThreads>(mask_tile, p, policy, b, h, m_begin, rows,
                                                         n_begin, key_end);
    } else if (work == KeyBlockWork::kFixedPattern) {
      record_summary_columns<kBlockN>(window, p, n_begin, lane);
    }
    cp_async_wait<0>();  // K of this block (and Q) has landed ...
    __syncthreads();     // ... for every thread, the mask tile / summary bits are written, V free
    load_tile_async<kBlockN, kHeadDim, kStride, kThreads>(v_tile, v + n_begin * p.v_row_stride,
                                                          p.v_row_stride, keys);
    cp_async_commit();

    float s[kMTiles][kNTiles][4];
    warp_qk<Element, kMTiles, kNTiles, kKSteps, kStride>(s, q_lane, k_lane);
#pragma unroll
    for (int m = 0; m < kMTiles; ++m) {
#pragma unroll
      for (int t = 0; t < kNTiles; ++t) {
#pragma unroll
        for (int e = 0; e < 4; ++e) s[m][t][e] *= scale_log2;
      }
    }
    if (work == KeyBlockWork::kMaskTile) {
#pragma unroll
      for (int m = 0; m < kMTiles; ++m) {
#pragma unroll
        for (int half = 0; half < 2; ++half) {
          const float* terms = mask_tile + (warp_row0 + 16 * m + 8 * half + lane / 4) * kPitch;
#pragma unroll
          for (int t = 0; t < kNTiles; ++t) {
            const float2 term = *reinterpret_cast<const float2*>(terms + t * 8 + col0);
            float& s0 = s[m][t][2 * half];
            float& s1 = s[m][t][2 * half + 1];
            // Exactly -inf for a hidden key, even when its score is NaN or +inf.
            s0 = term.x == -INFINITY ? -INFINITY : s0 + term.x;
            s1 = term.y == -INFINITY ? -INFINITY : s1 + term.y;
          }
        }
      }
    } else if (work != KeyBlockWork::kNone) {
      // Keys relative to this block: row r sees [lo, hi) by causal, the window and the ends.
      int lo[kRows], hi[kRows];
#pragma unroll
      for (int r = 0; r < kRows; ++r) {
        lo[r] = key_begin + static_cast<int>(key_limits[r] & 0xffffu) - n_begin;
        hi[r] = key_end - static_cast<int>(key_limits[r] >> 16) - n_begin;
      }
      if (work == KeyBlockWork::kFixedPattern) {
        mask_fixed_pattern<kMTiles, kNTiles, kBlockN>(
            s, window.summary, row_start + warp_row0 + lane / 4, n_begin, lo, hi, lane);
      } else {
#pragma unroll
        for (int m = 0; m < kMTiles; ++m) {
#pragma unroll
          for (int t = 0; t < kNTiles; ++t) {
#pragma unroll
            for (int e = 0; e < 4; ++e) {
              const int r = 2 * m + e / 2;
              const int key = t * 8 + col0 + (e & 1);
              if (key < lo[r] || key >= hi[r]) s[m][t][e] = -INFINITY;
            }
          }
        }
      }
    }
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
    __syncthreads();     // ... for every thread; nobody reads K or the mask tile any more
    if (next >= first_block) {
      // Every key of an earlier block is below key_end: a whole tile.
      load_tile_async<kBlockN, kHeadDim, kStride, kThreads>(
          k_tile, k + static_cast<int64_t>(next) * kBlockN * p.k_row_stride, p.k_row_stride,
          kBlockN);
    }
    cp_async_commit();

    warp_pv<Element, kMTiles, kNTiles, kDTiles, kStride>(o, s, v_lane);
    n_block = next;
    work = next_work;
  }
  // Every copy (Q's included, when no key block ran) has landed before Q's rows are reused.
  cp_async_wait<0>();
  __syncthreads();
  // Re-read rather than kept live through the loop.
  const int64_t q_row0 = sequence_extent(p, b).q_row0;

  // Row statistics, with the prior part (if any) folded in: total = sum * 2^(max - new max) +
  // 2^(prior lse * log2 e - new max), and the output rescaled the same way.
  float total[kRows], row_max[kRows], inverse[kRows];
#pragma unroll
  for (int r = 0; r < kRows; ++r) {
    total[r] = quad_sum(softmax.row_sum[r]);
    row_max[r] = softmax.row_max[r];
  }
  if (p.prior_lse != nullptr) {
    const int64_t prior_row0 = (b * p.heads_q + h) * p.seqlen_q + m_begin;
#pragma unroll
    for (int m = 0; m < kMTiles; ++m) {
#pragma unroll
      for (int half = 0; half < 2; ++half) {
        const int r = 2 * m + half;
        const int row = warp_row0 + 8 * r + lane / 4;
        const bool has_prior = row < rows && m_begin + row >= p.prior_rows_begin;
        const float prior = has_prior ? p.prior_lse[prior_row0 + row] * kLog2e : -INFINITY;
        const float new_max = fmaxf(row_max[r], prior);
        const float shift = new_max == -INFINITY ? 0.f : new_max;
        const float own_weight = exp2f(row_max[r] - shift);
        const float prior_weight = exp2f(prior - shift);
        total[r] = total[r] * own_weight + prior_weight;
        row_max[r] = new_max;
        const float* prior_out = p.prior_out + (prior_row0 + row) * p.head_dim_v + col0;
#pragma unroll
        for (int t = 0; t < kDTiles; ++t) {
          const float2 po = has_prior ? *reinterpret_cast<const float2*>(prior_out + t * 8)
                                      : make_float2(0.f, 0.f);
          o[m][t][2 * half] = o[m][t][2 * half] * own_weight + po.x * prior_weight;
          o[m][t][2 * half + 1] = o[m][t][2 * half + 1] * own_weight + po.y * prior_weight;
        }
      }
    }
  }
#pragma unroll
  for (int r = 0; r < kRows; ++r) inverse[r] = total[r] == 0.f ? 0.f : 1.f / total[r];

  const int64_t out_offset =
      b * p.o_batch_stride + h * p.o_head_stride + (q_row0 + m_begin) * p.o_row_stride;
  if (p.out_is_float) {
    // An fp32 workspace: straight from the accumulators, two floats per store.
    float* out = static_cast<float*>(p.out) + out_offset;
#pragma unroll
    for (int m = 0; m < kMTiles; ++m) {
#pragma unroll
      for (int half = 0; half < 2; ++half) {
        const int r = 2 * m + half;
        const int row = warp_row0 + 16 * m + 8 * half + lane / 4;
        if (row < rows) {
#pragma unroll
          for (int t = 0; t < kDTiles; ++t) {
            *reinterpret_cast<float2*>(out + row * p.o_row_stride + t * 8 + col0) =
                make_float2(o[m][t][2 * half] * inverse[r], o[m][t][2 * half + 1] * inverse[r]);
          }
        }
      }
    }
  } else {
    // Stage the warp's rows in its own (no longer read) rows of the Q tile, then 16-byte stores.
    Element* staged = q_tile + warp_row0 * kStride;
#pragma unroll
    for (int m = 0; m < kMTiles; ++m) {
#pragma unroll
      for (int t = 0; t < kDTiles; ++t) {
#pragma unroll
        for (int half = 0; half < 2; ++half) {
          const int r = 2 * m + half;
          const int row = 16 * m + 8 * half + lane / 4;
          store_pair(staged + row * kStride + t * 8 + col0, o[m][t][2 * half] * inverse[r],
                     o[m][t][2 * half + 1] * inverse[r]);
        }
      }
    }
    __syncwarp();
    const int warp_rows = max(0, min(Cfg::kWarpRows, rows - warp_row0));
    Element* out = static_cast<Element*>(p.out) + out_offset;
    store_warp_rows<Cfg::kWarpRows, kHeadDim, kStride>(out + warp_row0 * p.o_row_stride,
                                                       p.o_row_stride, staged, warp_rows, lane);
  }

  if (p.lse != nullptr && lane % 4 == 0) {
    constexpr float kLn2 = 0.6931471805599453f;
    float* lse = static_cast<float*>(p.lse) + b * p.lse_batch_stride + h * p.lse_head_stride +
                 (q_row0 + m_begin) * p.lse_row_stride;
#pragma unroll
    for (int r = 0; r < kRows; ++r) {
      const int row = warp_row0 + 8 * r + lane / 4;
      if (row < rows) {
        lse[row * p.lse_row_stride] =
            total[r] == 0.f ? -INFINITY : (row_max[r] + log2f(total[r])) * kLn2;
      }
    }
  }
}

// As forward_kernel: the body exists only for sm80+.
template <typename Element, int kHeadDim>
__global__ void __launch_bounds__(ForwardConfig<kHeadDim, int(sizeof(Element))>::kThreads,
                                  ForwardConfig<kHeadDim, int(sizeof(Element))>::kMinBlocksPerSm)
    masked_forward_kernel(const __grid_constant__ detail::ForwardKernelParams p) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  masked_forward_block<Element, kHeadDim>(p);
#else
  __trap();
#endif
}

}  // namespace samattn::tensor_core
