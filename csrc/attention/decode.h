// Internal: the decoding kernel, the split-key forward (key_split.h) for few query rows per
// key/value head: decoding one token, or verifying a few draft tokens, against a KV cache.
//
// The generic split runs its chunks on the tensor-core forward, whose thread blocks compute 128
// query rows: a decoding call has one to a few valid rows per head, so that kernel computed
// ~100x the needed products and ran compute-bound where the cache's bytes should set the time
// (benchmarks/NOTES.md, stop 51). This kernel is shaped for the call instead:
//  - one thread block per (key chunk, kv head, batch entry), all in one launch whatever the
//    cache's layout, holding every query row of the kv head: the G query heads that share it
//    (grouped-query attention) times the T queries, G * T <= 64 rows, so the chunk's keys and
//    values are read once for all of them;
//  - its 4 warps share the 64-key tiles of a two-stage cp.async pipeline and split the rows
//    into 16-row mma tiles and, when fewer than 4 tiles, the keys of each tile between them;
//    at the end the warps' softmax states merge in shared memory;
//  - one chunk writes the output and lse directly; several write fp32 parts that the split's
//    merge (key_split_merge.cu) combines.
// Calls it takes: float16/bfloat16, head dims 64, 96, 128, 192 and 256, kv_stride 1, no top-left
// causal, no mask options but bottom-right causal (new tokens against a cache), a window's right
// edge r (query t sees keys j <= t + r), a window following bottom-right causal (sliding-window
// decoding: its left edge, the chunks starting at each entry's window), per-entry key lengths
// (cache_seqlens: read on the device, chunks past an entry's length do nothing), a paged cache
// (block_table, with cache_seqlens: each key row's address from its page) and an attn_mask that is
// the same for every head and query (a padded batch's key mask, (B|1, 1, 1, Sk), or any broadcast
// over heads with one query), 16-byte aligned rows (the tensor-core path's alignment).
#pragma once

#include <cstdint>

#include <cuda_runtime_api.h>

#include "attention/key_split.h"
#include "common/host_device.h"
#include "samattn/attention.h"

namespace samattn::detail {

inline constexpr int kDecodeThreads = 128;     // 4 warps
inline constexpr int kDecodeBlockN = 64;       // keys per pipeline stage
inline constexpr int kDecodeStages = 2;        // the next tile loads while this one is used
inline constexpr int64_t kDecodeMaxRows = 64;  // query rows per kv head: 4 mma tiles of 16
inline constexpr int kDecodeHeadDims[] = {64, 96, 128, 192, 256};

// Shared memory of a block: the query rows, then the stages' K and V tiles, rows padded by 16
// bytes (the tensor-core tiles' conflict-free pitch), then one tile's key-mask terms (fp32). The
// warps' final states overlay the stages.
constexpr int decode_row_pitch(int head_dim) { return head_dim + 8; }  // 16-bit elements
constexpr int decode_tiles_bytes(int head_dim) {
  return static_cast<int>(kDecodeMaxRows + 2 * kDecodeStages * kDecodeBlockN) *
         decode_row_pitch(head_dim) * 2;
}
constexpr int decode_smem_bytes(int head_dim) {
  return decode_tiles_bytes(head_dim) + kDecodeBlockN * 4;
}

struct DecodeKernelParams {
  const void* q;
  const void* k;
  const void* v;
  void* out;   // one chunk: the call's output ...
  float* lse;  // ... and its lse (nullable), contiguous (batch, heads_q, seqlen_q)
  // Several chunks: chunk c's fp32 output and lse of query row (b, hq, t) at row
  // c * workspace_rows + (b * heads_q + hq) * seqlen_q + t (the split's workspace layout).
  float* part_out;
  float* part_lse;
  int64_t workspace_rows;
  int64_t q_batch_stride, q_head_stride, q_row_stride;
  int64_t k_batch_stride, k_head_stride, k_row_stride;
  int64_t v_batch_stride, v_head_stride, v_row_stride;
  int64_t o_batch_stride, o_head_stride, o_row_stride;
  int64_t heads_kv, group, seqlen_q, seqlen_k;
  int64_t chunk_keys, parts;
  int64_t right_edge;  // the window's: -1: none; else query t sees keys j <= t + right_edge
  // Bottom-right causal: query t of entry b sees keys j <= t + keys(b) - seqlen_q (with a window's
  // right edge, the nearer of the two).
  bool lower_right;
  // A window's left edge following bottom-right causal (MaskOptions::window_follows_causal), or
  // -1: query t of entry b sees keys j >= t + keys(b) - seqlen_q - window_left; the chunks then
  // start at the first row's window, so the keys before every window are never read.
  int64_t window_left;
  // Per-entry key lengths (MaskOptions::cache_seqlens), or null: entry b's keys are its first
  // cache_seqlens[b], clamped to [0, seqlen_k] (the contents are the caller's, as for varlen).
  const int32_t* cache_seqlens;
  // A paged cache (MaskOptions::block_table), or null: key j of entry b is row j % page_size of
  // page block_table[b * block_table_stride + j / page_size] (clamped to [0, num_pages)), the
  // pages k_batch_stride / v_batch_stride apart.
  const int32_t* block_table;
  int64_t block_table_stride, page_size, num_pages;
  float scale_log2;  // softmax scale * log2(e)
  // A key mask (attn_mask the same for every head and query row, as a padded batch's), or
  // null: key j of batch entry b at mask + b * mask_batch_stride + j * mask_col_stride.
  const void* mask;
  MaskDType mask_dtype;
  int64_t mask_batch_stride, mask_col_stride;
};

// Chunk `chunk` of a block of batch entry b: its keys [begin, end) (empty where the chunk starts
// past the entry's keys), and, relative to begin, the keys some row sees (any_end: the last
// query's right edge) and that every row sees (all_end: the first query's); either may be <= 0.
// tiles: the 64-key tiles that cover [0, any_end). edge: where has_edge, query t sees keys
// j <= t + edge (the window's right edge or bottom-right causal, the nearer). With a left edge
// (has_left), query t sees keys from first_begin + t on, relative to begin (first_begin <= 0 for
// the chunk holding the first row's window start, which the chunks start from).
struct DecodeChunk {
  int64_t begin, end, any_end, all_end, tiles;
  int64_t edge;
  bool has_edge;
  int64_t first_begin;
  bool has_left;
};

SAMATTN_HOST_DEVICE int64_t decode_min(int64_t a, int64_t b) { return a < b ? a : b; }
SAMATTN_HOST_DEVICE int64_t decode_max(int64_t a, int64_t b) { return a > b ? a : b; }

// Where key `key` of batch entry b lives in a paged cache: its page (clamped to the pool) and
// its row in the page.
struct DecodePagedRow {
  int64_t page, row;
};

SAMATTN_HOST_DEVICE DecodePagedRow decode_paged_row(const DecodeKernelParams& p, int64_t b,
                                                    int64_t key) {
  // Keys and page sizes fit 32 bits (cache_seqlens are int32): a 32-bit division.
  const int64_t slot = static_cast<uint32_t>(key) / static_cast<uint32_t>(p.page_size);
  const int64_t page = p.block_table[b * p.block_table_stride + slot];
  return {page < 0 ? 0 : (page >= p.num_pages ? p.num_pages - 1 : page), key - slot * p.page_size};
}

// Keys of batch entry b: seqlen_k, or its cache_seqlens entry clamped to [0, seqlen_k].
SAMATTN_HOST_DEVICE int64_t decode_entry_keys(const DecodeKernelParams& p, int64_t b) {
  if (p.cache_seqlens == nullptr) return p.seqlen_k;
  return decode_min(p.seqlen_k, decode_max(int64_t{0}, p.cache_seqlens[b]));
}

SAMATTN_HOST_DEVICE DecodeChunk decode_chunk(const DecodeKernelParams& p, int64_t chunk,
                                             int64_t b) {
  const int64_t keys = decode_entry_keys(p, b);
  DecodeChunk c;
  c.has_edge = p.right_edge >= 0 || p.lower_right;
  c.edge = p.right_edge >= 0 ? p.right_edge : keys;
  // keys - seqlen_q >= -64 and right_edge < seqlen_k (the host's): no overflow below.
  if (p.lower_right) c.edge = decode_min(c.edge, keys - p.seqlen_q);
  // With a left edge the chunks start at the first row's window (t = 0 sees keys from
  // shift - left on, the other rows from later keys).
  c.has_left = p.window_left >= 0;
  const int64_t window_start = keys - p.seqlen_q - p.window_left;  // of row 0; with has_left
  const int64_t first_key = c.has_left ? decode_max(int64_t{0}, window_start) : 0;
  c.begin = first_key + chunk * p.chunk_keys;
  c.first_begin = window_start - c.begin;
  c.end = decode_max(c.begin, decode_min(keys, c.begin + p.chunk_keys));
  c.any_end = c.end - c.begin;
  c.all_end = c.any_end;
  if (c.has_edge) {
    c.any_end = decode_min(c.any_end, p.seqlen_q + c.edge - c.begin);
    c.all_end = decode_min(c.all_end, c.edge + 1 - c.begin);
  }
  c.tiles = c.any_end > 0 ? (c.any_end + kDecodeBlockN - 1) / kDecodeBlockN : 0;
  return c;
}

// Keys of the chunk that query row `row` (query row % seqlen_q) sees, relative to its begin;
// rows past the block's `rows` (padding of the last mma tile) get the chunk's end.
SAMATTN_HOST_DEVICE int64_t decode_row_end(const DecodeKernelParams& p, const DecodeChunk& c,
                                           int row, int rows) {
  const int64_t end = c.end - c.begin;
  if (!c.has_edge || row >= rows) return end;
  return decode_min(end, row % p.seqlen_q + c.edge + 1 - c.begin);
}

// The first key of the chunk that query row `row` sees, relative to its begin (<= 0: from the
// chunk's first key); rows past the block's `rows` and calls without a left edge get 0.
SAMATTN_HOST_DEVICE int64_t decode_row_begin(const DecodeKernelParams& p, const DecodeChunk& c,
                                             int row, int rows) {
  if (!c.has_left || row >= rows) return 0;
  return c.first_begin + row % p.seqlen_q;
}

// What warp `warp` of `warps` computes for a block of `rows` query rows: 16-row mma tile
// row_tile, over the 16-key slices phase, phase + phases, ... of each tile; a warp whose phase
// is >= phases only helps load.
struct DecodeWarpRole {
  int row_tiles, phases, row_tile, phase;
  SAMATTN_HOST_DEVICE bool computes() const { return phase < phases; }
};

SAMATTN_HOST_DEVICE DecodeWarpRole decode_warp_role(int rows, int warp, int warps) {
  DecodeWarpRole role;
  role.row_tiles = (rows + 15) / 16;
  role.phases = warps / role.row_tiles;
  role.row_tile = warp % role.row_tiles;
  role.phase = warp / role.row_tiles;
  return role;
}

// Whether the decoding kernel takes `params` (validated), before any device query; otherwise the
// message says why.
Status decode_kernel_takes(const AttentionParams& params);

// The chunks of a call the kernel takes on a device running `resident_blocks` of its blocks at
// once. num_splits 0: as many chunks as batch * heads_kv * chunks <= resident blocks allows
// (one wave), each at least two key tiles, at most 128 (the merge's bound); n > 1: about n. One
// chunk (parts() == 1, no workspace, no merge) where the blocks already fill the device. Covers the
// keys any query can see (all of them, or with a right edge r the first seqlen_q + r).
// on_decode_kernel is set.
KeySplit plan_decode(const AttentionParams& params, int64_t resident_blocks);

// The plan for the current device, or parts() == 0 where the kernel does not take the call or
// its blocks do not fit. For key_split_for, which has checked num_splits (!= 1, or 1 with
// cache_seqlens: one chunk) and that the tensor-core path runs the call on the device
// (tensor_core::supports).
KeySplit decode_split_for(const AttentionParams& params);

// The kernel's parameters; `workspace` (the split's, key_split.h) is used when parts() > 1.
DecodeKernelParams make_decode_kernel_params(const AttentionParams& params, const KeySplit& split,
                                             const PriorPart& workspace);

// Runs the plan: the kernel, then the merge when there are several chunks (params.workspace of
// key_split_workspace_bytes bytes then).
void decode_forward(const AttentionParams& params, const KeySplit& split, cudaStream_t stream);

}  // namespace samattn::detail

namespace samattn::tensor_core {

// Blocks of the decoding kernel an SM of the current device runs at once (occupancy query,
// cached per device).
int decode_blocks_per_sm(DType dtype, int64_t head_dim);

// Launches the instantiation for (dtype, head dim) on a (parts, heads_kv, batch) grid.
void dispatch_decode(DType dtype, int64_t head_dim, int64_t batch,
                     const detail::DecodeKernelParams& params, cudaStream_t stream);

}  // namespace samattn::tensor_core
