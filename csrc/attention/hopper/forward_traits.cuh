// Internal: compile-time shapes of the Hopper forward kernel for one (element type, head dim):
// its wgmma tiled MMAs, swizzled shared-memory layouts, TMA copy types, pipelines and shared
// storage, and the parameters the kernel receives.
#pragma once

#include <cstdint>

#include <cutlass/arch/barrier.h>
#include <cutlass/cutlass.h>
#include <cutlass/numeric_types.h>
#include <cute/tensor.hpp>
#include <cutlass/gemm/collective/builders/sm90_common.inl>
#include <cutlass/pipeline/sm90_pipeline.hpp>

#include "attention/hopper/forward_config.h"
#include "attention/hopper/forward_scheduler.h"
#include "attention/hopper/forward_trace.cuh"
#include "attention/hopper/tma_copy.cuh"
#include "attention/hopper/wgmma_score_atom.cuh"
#include "attention/kernel_params.h"
#include "attention/mask_policy.h"

namespace samattn::hopper {

// A shared-memory slot through which one thread hands a value to others (publish_value): whole
// 16-byte words, so that vector accesses carry it.
template <int kWords>
struct alignas(16) PublishedSlot {
  static_assert(kWords % 4 == 0, "a slot is whole 16-byte words");
  int32_t words[kWords];
};

// A lean tile start's coordinates (ForwardTile::lean_tile_start; TileCoords, 11 words), published
// next to the Q buffer.
using TileCoordsSlot = PublishedSlot<12>;

// Which key blocks of a tile the block map lists (block-sparse calls): bit n % 32 of word n / 32
// for key block n (counted from key 0): in `rows[w]` when the map lists it for consumer
// warpgroup w's 64 rows (they lie in one map row: supports() has block_q % 64 == 0), in `tile`
// when it does for any of them. Only the words of the tile's key-block range are written for a
// tile (the others keep an earlier tile's bits, and no reader looks at them); only bits of the
// range are set in them.
inline constexpr int kKeyBlockWords = kMaxListedKeyBlocks / 32;
template <int kWarpgroups>
struct KeyBlockMasks {
  uint32_t tile[kKeyBlockWords];
  uint32_t rows[kWarpgroups][kKeyBlockWords];
};

// What the producer asks the list warp for: the masks of tile `half` of unit `unit` (the list
// warp finds the tile's coordinates itself, while the producer does) into Q buffer q_buffer's
// masks; q_buffer < 0 ends.
struct ListRequest {
  int32_t unit, half, q_buffer;
};
using ListRequestSlot = PublishedSlot<4>;

// kVariant: the entry of forward_config.h's tile table for kHeadDim.
template <typename Element, int kHeadDim, int kVariant>
struct KernelTraits {
  static_assert(kVariant >= 0 && kVariant < tile_variants(kHeadDim), "no such tile variant");
  static constexpr ForwardTile kTile = forward_tile(kHeadDim, kVariant);
  static constexpr int kConsumerWarpgroups = kTile.consumer_warpgroups;
  static constexpr int kConsumerThreads = 128 * kConsumerWarpgroups;
  static constexpr int kThreads = kTile.threads();
  static constexpr int kBlockM = kTile.block_m();
  static constexpr int kBlockN = kTile.block_n;
  static constexpr int kStages = kTile.stages;
  static constexpr int kQBuffers = kTile.q_buffers;
  using BlockM = cute::Int<kBlockM>;
  using BlockN = cute::Int<kBlockN>;
  using HeadDim = cute::Int<kHeadDim>;

  // Each consumer warpgroup is one 64-row wgmma atom; they stack along M.
  using AtomLayout = cute::Layout<cute::Shape<cute::Int<kConsumerWarpgroups>, cute::_1, cute::_1>>;
  using TiledMmaS =
      decltype(cute::make_tiled_mma(score_mma_op<Element, kBlockN, kHeadDim>(), AtomLayout{}));
  static_assert(cute::size<1>(typename TiledMmaS::AtomShape_MNK{}) == kBlockN,
                "S = Q K^T must be one wgmma per k-block: kBlockN needs its wgmma shape (define "
                "CUTE_SM90_EXTENDED_MMA_SHAPES_ENABLED before including CuTe, or add the shape "
                "to wgmma_score_atom.cuh)");
  // A tile's first key block for a warpgroup that sees only its first kNarrowBlockN keys
  // (ForwardKernelOptions::narrow_first_block): its softmax takes only those. 128-key blocks.
  static constexpr bool kNarrowFirstBlock = kBlockN == 128;
  static constexpr int kNarrowBlockN = kNarrowFirstBlock ? kBlockN / 2 : kBlockN;
  // O = P V: P from registers (K-major), V^T from shared memory, where V is stored (key, dim)
  // with dim contiguous: an MN-major B operand.
  using TiledMmaO = decltype(cute::make_tiled_mma(
      cute::GMMA::rs_op_selector<Element, Element, float, cute::Shape<cute::_64, HeadDim, BlockN>,
                                 cute::GMMA::Major::K, cute::GMMA::Major::MN>(),
      AtomLayout{}));

  // The widest swizzle a row of head_dim elements allows (128 B for every supported head dim).
  using SmemAtomQ =
      decltype(cutlass::gemm::collective::detail::ss_smem_selector<cute::GMMA::Major::K, Element,
                                                                   BlockM, HeadDim>());
  using SmemAtomKV =
      decltype(cutlass::gemm::collective::detail::ss_smem_selector<cute::GMMA::Major::K, Element,
                                                                   BlockN, HeadDim>());
  using SmemLayoutQ = decltype(cute::tile_to_shape(
      SmemAtomQ{}, cute::Shape<BlockM, HeadDim, cute::Int<kQBuffers>>{}));
  using SmemLayoutKV = decltype(cute::tile_to_shape(
      SmemAtomKV{}, cute::Shape<BlockN, HeadDim, cute::Int<kStages>>{}));
  // The same bytes as SmemLayoutKV seen as (dim, key, stage): V^T for the second wgmma.
  using SmemLayoutVt = decltype(cute::composition(
      SmemLayoutKV{}, cute::make_ordered_layout(cute::Shape<HeadDim, BlockN, cute::Int<kStages>>{},
                                                cute::Step<cute::_2, cute::_1, cute::_3>{})));

  using Pipeline = cutlass::PipelineTmaAsync<kStages>;
  using PipelineState = typename Pipeline::PipelineState;

  struct SharedStorage {
    cute::array_aligned<Element, cute::cosize_v<SmemLayoutQ>, 1024> q;
    cute::array_aligned<Element, cute::cosize_v<SmemLayoutKV>, 1024> k;
    cute::array_aligned<Element, cute::cosize_v<SmemLayoutKV>, 1024> v;
    typename Pipeline::SharedStorage pipeline_k;
    typename Pipeline::SharedStorage pipeline_v;
    // Per Q buffer. Full: the copy engine has landed the tile's Q. Empty: every consumer thread
    // is done with the last S GEMM of its tile, so the producer may load a later tile's Q.
    cutlass::arch::ClusterTransactionBarrier barrier_q_full[kQBuffers];
    cutlass::arch::ClusterBarrier barrier_q_empty[kQBuffers];
    // The query tile each Q buffer holds (publish_tile), or the end of the block's work.
    ScheduledTile q_tile[kQBuffers];
    // The unit the scheduler thread hands the producer (its half unused), and when it is
    // there (full) and taken (empty).
    ScheduledTile scheduled_unit;
    cutlass::arch::ClusterBarrier barrier_unit_full;
    cutlass::arch::ClusterBarrier barrier_unit_empty;
    // With a lean tile start, the coordinates of the tile in each Q buffer (last, so that the
    // other members keep their offsets in every tile).
    TileCoordsSlot q_tile_coords[kQBuffers];
    // Block-sparse calls only (after the members above, which keep their offsets): the key
    // blocks the block map lists for the tile in each Q buffer (KeyBlockMasks), which the list
    // warp builds at the producer's request (list_request; full: asked, empty: built), and
    // when they are built for the consumers, who may have the tile's Q before (masks_full).
    KeyBlockMasks<kConsumerWarpgroups> key_blocks[kQBuffers];
    ListRequestSlot list_request;
    cutlass::arch::ClusterBarrier barrier_list_full;
    cutlass::arch::ClusterBarrier barrier_list_empty;
    cutlass::arch::ClusterBarrier barrier_masks_full[kQBuffers];
    // The coordinates of the published unit's tiles (scheduler_loop), so that the producer,
    // which issues every copy from one thread, reads them instead of finding them (~2k cycles).
    TileCoordsSlot unit_coords[2];
  };
  static constexpr int kSmemBytes = static_cast<int>(sizeof(SharedStorage));
  static_assert(kSmemBytes <= forward_smem_bytes(kTile, kHeadDim, sizeof(Element)),
                "forward_config.h must bound the kernel's shared memory");

  static constexpr uint32_t kQBytes = kBlockM * kHeadDim * sizeof(Element);
  static constexpr uint32_t kKVBytes = kBlockN * kHeadDim * sizeof(Element);

  // TMA copy atoms (their descriptors travel in the kernel parameters).
  template <typename SmemLayout, typename Tile>
  using Tma = TmaCopy<cute::SM90_TMA_LOAD, const Element, SmemLayout, Tile>;
  using TmaQ = Tma<decltype(cute::take<0, 2>(SmemLayoutQ{})), cute::Shape<BlockM, HeadDim>>;
  using TmaKV = Tma<decltype(cute::take<0, 2>(SmemLayoutKV{})), cute::Shape<BlockN, HeadDim>>;

  // The output leaves by TMA store, one consumer warpgroup's 64 rows at a time, from where that
  // warpgroup staged them: its own rows of the tile's Q buffer. Rows 64 w .. 64 w + 63 of a Q
  // buffer have the layout of rows 0 .. 63 (the swizzle atoms stack along the rows first, and
  // 64 rows are a whole number of 1024-byte swizzle periods), so one descriptor serves all.
  using OStageRows = cute::_64;
  using SmemLayoutOStage = decltype(cute::composition(
      cute::take<0, 2>(SmemLayoutQ{}),
      cute::make_layout(cute::Shape<OStageRows, HeadDim>{}, cute::Stride<cute::_1, BlockM>{})));
  using TmaO =
      TmaCopy<cute::SM90_TMA_STORE, Element, SmemLayoutOStage, cute::Shape<OStageRows, HeadDim>>;
};

// The sizes the device code computes with, narrowed to int32 on the host (supports() bounds the
// extents by 2^31 - 1), so that no 64-bit division runs in the kernel.
struct TileGeometry {
  int32_t seqlen_q;
  int32_t kept_keys;  // logical keys (positions 0, kv_stride, 2 kv_stride, ...)
  int32_t kv_stride;  // capped at seqlen_q: a larger stride hides the same keys
  // Causal: query row i sees the logical keys n < (i / kv_stride) * causal_key_step +
  // causal_key_bias. Step 1 and bias 1 are n * kv_stride <= i. The fixed pattern's summary part
  // (fixed_pattern.h) has l in kv_stride, step c and bias 0: row i sees the c summary columns of
  // each pattern block before its own, gathered into consecutive keys.
  int32_t causal_key_step;
  int32_t causal_key_bias;
  int32_t heads_q;
  int32_t group_size;  // heads_q / heads_kv
  bool causal;
  // A sliding window or bottom-right causal (mask_policy.h's visible_key_span, causal included in
  // `policy`), with kv_stride 1 (supports()): a constant stride of 1 leaves no division in the
  // kernel, whose 64-bit form spilled registers next to the key loop's accumulators. Off, the
  // int32 causal arithmetic above is all that runs.
  bool windowed;
  detail::MaskPolicy policy;
  // Varlen (kv_stride 1, supports()): sequence b owns q/out rows [cu_seqlens_q[b],
  // cu_seqlens_q[b + 1]) and k/v rows [cu_seqlens_k[b], cu_seqlens_k[b + 1]) of the packed
  // tensors, read per tile and clamped as the tensor-core kernels do; seqlen_q and kept_keys
  // above are then the maximum lengths. Null when the batch is dense.
  const int32_t* cu_seqlens_q;
  const int32_t* cu_seqlens_k;
  int32_t total_q, total_k;
  // Query tile m covers rows [m * block_m - tile_row_shift, ...): a multiple of 64 below the
  // rows the last tile has past seqlen_q, so that the causal tile short of rows is the first,
  // which walks the fewest key blocks, rather than the last, which walks them all
  // (forward_config.h's ForwardKernelOptions::partial_first_tile). Rows before 0 belong to no
  // warpgroup.
  int32_t tile_row_shift;
};

template <typename Element, int kHeadDim, int kVariant>
struct HopperForwardParams {
  using Traits = KernelTraits<Element, kHeadDim, kVariant>;
  detail::ForwardKernelParams p;
  TileGeometry geometry;
  TileSchedule schedule;
  ForwardKernelOptions options;
  GmemShape shape_q, shape_k, shape_v, shape_o;
  typename Traits::TmaQ tma_q;
  typename Traits::TmaKV tma_k;
  typename Traits::TmaKV tma_v;
  typename Traits::TmaO tma_o;
#if defined(SAMATTN_HOPPER_TRACE)
  ForwardTrace trace{};  // forward_trace.cuh: a diagnostic build's timeline (set by the launcher)
#endif
};

// Only warpgroup 0 walks the schedule. Its TMA thread tells the consumers which tile a Q buffer
// holds (as its unit and half, which its loop has live anyway: the tile's coordinates would take
// registers) by writing it next to the buffer before arriving on the buffer's full barrier, and
// they read it after their wait; the scheduler thread hands units to the TMA thread the same way.
// The asm carries memory clobbers to keep both accesses on their side of the barrier operations
// (CUTLASS's mbarrier asm has none); the barrier's release and acquire order them between threads.
// unit < 0 ends the block's work.
__device__ __forceinline__ void publish_tile(ScheduledTile& slot, int32_t unit, int32_t half) {
  const uint32_t address = cute::cast_smem_ptr_to_uint(&slot);
  asm volatile("st.shared.v2.s32 [%0], {%1, %2};" ::"r"(address), "r"(unit), "r"(half) : "memory");
}

__device__ __forceinline__ ScheduledTile published_tile(const ScheduledTile& slot) {
  const uint32_t address = cute::cast_smem_ptr_to_uint(&slot);
  ScheduledTile tile;
  asm volatile("ld.volatile.shared.v2.s32 {%0, %1}, [%2];"
               : "=r"(tile.unit), "=r"(tile.half)
               : "r"(address)
               : "memory");
  return tile;
}

// The (batch, head, rows, key blocks) of one query tile, as every role of the block sees it.
struct TileCoords {
  int32_t b, h, h_kv;
  int32_t b_tensor;  // the batch coordinate in the TMA tensors: b, or 0 for packed varlen ones
  int32_t q_row0;    // the sequence's first q/out row (0 unless varlen)
  int32_t k_row0;    // the sequence's first k/v row (0 unless varlen)
  int32_t m_block;
  int32_t m_begin;   // first query row, counted from the sequence's start (< 0: tile_row_shift)
  int32_t rows;      // rows from m_begin up to seqlen_q; <= 0: the tile lies past its sequence
  int32_t n_first;   // the first key block any row sees (0 without a window)
  int32_t n_blocks;  // key blocks n_first, n_first + 1, ...: walked from the last to the first
};

// 16 bytes of shared memory at `address`: four words stored, or loaded without caching in
// registers across the barrier wait that orders them (the published slots below).
__device__ __forceinline__ void store_shared_v4(uint32_t address, const int32_t* w) {
  asm volatile("st.shared.v4.s32 [%0], {%1, %2, %3, %4};" ::"r"(address), "r"(w[0]), "r"(w[1]),
               "r"(w[2]), "r"(w[3])
               : "memory");
}
__device__ __forceinline__ void load_shared_v4(uint32_t address, int32_t* w) {
  asm volatile("ld.volatile.shared.v4.s32 {%0, %1, %2, %3}, [%4];"
               : "=r"(w[0]), "=r"(w[1]), "=r"(w[2]), "=r"(w[3])
               : "r"(address)
               : "memory");
}

// A value published through a slot like publish_tile's unit: stored before the writer's arrival
// on a barrier and loaded after the readers' wait on it, with the same memory clobbers, one
// 16-byte word at a time.
template <int kWords, typename T>
__device__ __forceinline__ void publish_value(PublishedSlot<kWords>& slot, const T& value) {
  static_assert(sizeof(T) <= sizeof(slot.words), "the slot holds the value");
  int32_t w[kWords] = {};
  memcpy(w, &value, sizeof(value));
  const uint32_t address = cute::cast_smem_ptr_to_uint(&slot);
  CUTE_UNROLL
  for (int i = 0; i < kWords; i += 4) store_shared_v4(address + 4 * i, &w[i]);
}

// A published value copied from one slot to another 16 bytes at a time, so that it is never in
// registers whole (the producer's copy of a looked-ahead tile's coordinates: whole, they spilled).
template <int kWords>
__device__ __forceinline__ void copy_published(PublishedSlot<kWords>& to,
                                               const PublishedSlot<kWords>& from) {
  const uint32_t from_address = cute::cast_smem_ptr_to_uint(&from);
  const uint32_t to_address = cute::cast_smem_ptr_to_uint(&to);
  CUTE_UNROLL
  for (int i = 0; i < kWords; i += 4) {
    int32_t w[4];
    load_shared_v4(from_address + 4 * i, w);
    store_shared_v4(to_address + 4 * i, w);
  }
}

// One 32-bit member of a published value, at byte offset `offset` of the value.
template <int kWords>
__device__ __forceinline__ int32_t published_word(const PublishedSlot<kWords>& slot, int offset) {
  int32_t w;
  asm volatile("ld.volatile.shared.s32 %0, [%1];"
               : "=r"(w)
               : "r"(cute::cast_smem_ptr_to_uint(&slot) + offset)
               : "memory");
  return w;
}

template <typename T, int kWords>
__device__ __forceinline__ T published_value(const PublishedSlot<kWords>& slot) {
  static_assert(sizeof(T) <= sizeof(slot.words), "the slot holds the value");
  int32_t w[kWords];
  const uint32_t address = cute::cast_smem_ptr_to_uint(&slot);
  CUTE_UNROLL
  for (int i = 0; i < kWords; i += 4) load_shared_v4(address + 4 * i, &w[i]);
  T value;
  memcpy(&value, w, sizeof(value));
  return value;
}

// Where sequence b lives: its first q/out and k/v rows and its lengths. A dense batch: 0, 0 and
// the call's lengths. Varlen: from cu_seqlens, clamped as the tensor-core kernels clamp them.
struct SequenceSpan {
  int32_t q_row0, k_row0, seqlen_q, kept_keys;
};

__device__ __forceinline__ SequenceSpan sequence_span(const TileGeometry& call, int32_t b) {
  if (call.cu_seqlens_q == nullptr) return {0, 0, call.seqlen_q, call.kept_keys};
  const int32_t q0 = max(0, min(call.cu_seqlens_q[b], call.total_q));
  const int32_t q1 = max(q0, min(call.cu_seqlens_q[b + 1], call.total_q));
  const int32_t k0 = max(0, min(call.cu_seqlens_k[b], call.total_k));
  const int32_t k1 = max(k0, min(call.cu_seqlens_k[b + 1], call.total_k));
  return {q0, k0, min(q1 - q0, call.seqlen_q), min(k1 - k0, call.kept_keys)};
}

// The geometry of sequence b: the call's, with a varlen sequence's lengths. The consumers call it
// where they need it rather than keeping it in registers through the key loop (next to the
// loop's accumulators the two lengths spilled at head dims 128 and 256); cu_seqlens stays cached.
__device__ __forceinline__ TileGeometry sequence_geometry(const TileGeometry& call,
                                                          const SequenceSpan& span) {
  TileGeometry g = call;
  g.seqlen_q = span.seqlen_q;
  g.kept_keys = span.kept_keys;
  // Varlen's bottom-right causal: the sequence's own shift (kv_stride 1, supports(): its kept
  // keys are its keys). A dense call's is set on the host.
  if (call.cu_seqlens_q != nullptr && call.policy.lower_right) {
    g.policy = detail::for_sequence(call.policy, span.seqlen_q, span.kept_keys);
  }
  return g;
}

__device__ __forceinline__ TileGeometry sequence_geometry(const TileGeometry& call, int32_t b) {
  return sequence_geometry(call, sequence_span(call, b));
}

// One past the last logical key that causal lets query row `row` see (not clipped to the keys).
__device__ __forceinline__ int32_t causal_key_end(const TileGeometry& g, int32_t row) {
  return row / g.kv_stride * g.causal_key_step + g.causal_key_bias;
}

// One past the last logical key query row `row` (< seqlen_q) sees: key n is visible to query i
// iff n < kept_keys and, when causal, n < causal_key_end(i). Without a window.
__device__ __forceinline__ int32_t row_key_end(const TileGeometry& g, int32_t row) {
  return g.causal ? min(causal_key_end(g, row), g.kept_keys) : g.kept_keys;
}

// The logical keys [begin, end) query row `row` (< seqlen_q) sees with the window (both ends
// within [0, kept_keys] and non-decreasing in row).
__device__ __forceinline__ detail::Span window_key_span(const TileGeometry& g, int32_t row) {
  return detail::visible_key_span(g.policy, row, g.kept_keys, /*kv_stride=*/1);
}

// The first key block (from the low end) in which every key is at or past where the window of
// `last_row` (capped at the last row) starts, so no row up to it is cut off on the left: blocks
// below it need masking. 0 without a window.
template <int kBlockN>
__device__ __forceinline__ int32_t first_unclipped_key_block(const TileGeometry& g,
                                                             int32_t last_row) {
  if (!g.windowed) return 0;
  const int64_t begin = window_key_span(g, min(last_row, g.seqlen_q - 1)).begin;
  return static_cast<int32_t>((begin + kBlockN - 1) / kBlockN);
}

// The first key block (blocks are numbered from 0 at key 0; the consumers walk them downwards)
// in which some key is hidden from some query row from `first_row` on: the block that crosses
// the end of the kept keys, or the first whose last key lies past the causal diagonal of
// `first_row`. Rows past seqlen_q are never stored, so first_row is capped at the last row.
template <int kBlockN>
__device__ __forceinline__ int32_t first_masked_key_block(const TileGeometry& g,
                                                          int32_t first_row) {
  if (g.windowed) {
    return static_cast<int32_t>(window_key_span(g, min(first_row, g.seqlen_q - 1)).end / kBlockN);
  }
  int32_t first = g.kept_keys / kBlockN;
  if (g.causal) {
    // (n + 1) * kBlockN > causal_key_end(row)  <=>  n >= causal_key_end(row) / kBlockN.
    const int32_t row = min(first_row, g.seqlen_q - 1);
    first = min(first, causal_key_end(g, row) / kBlockN);
  }
  return first;
}

template <int kBlockM, int kBlockN>
__device__ __forceinline__ TileCoords tile_coords(const TileGeometry& call, QueryTile tile) {
  TileCoords c;
  c.b = tile.batch_head / call.heads_q;
  c.h = tile.batch_head - c.b * call.heads_q;
  c.h_kv = c.h / call.group_size;
  const SequenceSpan span = sequence_span(call, c.b);
  c.b_tensor = call.cu_seqlens_q == nullptr ? c.b : 0;
  c.q_row0 = span.q_row0;
  c.k_row0 = span.k_row0;
  const TileGeometry g = sequence_geometry(call, span);
  c.m_block = tile.m_block;
  c.m_begin = tile.m_block * kBlockM - call.tile_row_shift;
  c.rows = min(kBlockM, g.seqlen_q - c.m_begin);
  if (c.rows <= 0) {
    c.n_first = 0;
    c.n_blocks = 0;
    return c;
  }
  if (g.windowed) {
    // The tile's rows see keys from its first row's window start to its last row's window end.
    const int64_t begin = window_key_span(g, c.m_begin).begin;
    const int64_t end = window_key_span(g, c.m_begin + c.rows - 1).end;
    c.n_first = static_cast<int32_t>(begin / kBlockN);
    c.n_blocks = max(0, static_cast<int32_t>((end + kBlockN - 1) / kBlockN) - c.n_first);
    return c;
  }
  const int32_t key_end = row_key_end(g, c.m_begin + c.rows - 1);
  c.n_first = 0;
  c.n_blocks = (key_end + kBlockN - 1) / kBlockN;
  return c;
}

// One past the last key the rows [first_row, first_row + 64) of one consumer warpgroup of tile c
// see: their last row's causal diagonal or window end; 0 when all of them lie past the
// sequence's end or before its start (a shifted first tile's, TileGeometry::tile_row_shift).
__device__ __forceinline__ int32_t warpgroup_key_end(const TileGeometry& g, const TileCoords& c,
                                                     int32_t first_row) {
  if (first_row < 0 || first_row >= c.m_begin + c.rows) return 0;
  const int32_t last_row = min(first_row + 63, c.m_begin + c.rows - 1);
  return g.windowed ? static_cast<int32_t>(window_key_span(g, last_row).end)
                    : row_key_end(g, last_row);
}

// How many of tile c's key blocks (counted from c.n_first, so the lowest ones) one consumer
// warpgroup sees, from its rows' key end (warpgroup_key_end): the blocks above are past every
// one of those rows' causal diagonals or window ends, and the warpgroup skips them (all of them
// when its rows lie past the sequence's end). The tile's last warpgroup with rows sees all of
// c.n_blocks.
template <int kBlockN>
__device__ __forceinline__ int32_t warpgroup_key_blocks(const TileCoords& c, int32_t key_end) {
  const int32_t blocks = (key_end + kBlockN - 1) / kBlockN - c.n_first;
  return max(0, min(blocks, c.n_blocks));
}

}  // namespace samattn::hopper
