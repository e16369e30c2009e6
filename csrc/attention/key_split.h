// Internal: split-key attention (flash-decoding) for calls with too few query blocks to fill the
// GPU, such as decoding: a few query rows per (batch, head) against a long KV cache. One thread
// block per query block would stream all keys through a handful of SMs; instead the keys are cut
// into chunks and every (chunk, query block) pair is a thread block of one tensor-core launch,
// each writing its normalised fp32 output and lse into the workspace. A second kernel merges the
// chunks of every row in one softmax: with m the chunks' largest lse,
//   out = sum_c exp(lse_c - m) out_c / sum_c exp(lse_c - m),  lse = m + log sum_c exp(lse_c - m),
// and rounds the output once.
//
// Calls with at most 64 query rows per kv head (decoding) run their chunks on the decoding
// kernel (decode.h): one launch for every batch entry, thread blocks shaped for those rows.
// Other calls' chunks are views the tensor-core kernels already take: the chunk is their batch
// index (q's batch stride 0, k's and v's one chunk of rows), the (batch, head) pairs their heads
// when the strides merge them (else one launch per batch entry); the last chunk, of other length,
// runs in the same launch (the kernel's last batch entry has fewer keys), or, with a window, as a
// second launch. A window with only a right edge r (query i sees positions j <= i + r:
// bottom-right causal, samattn's causal="lower_right", new tokens against a KV cache) splits
// too: the full chunks end where every query sees all their keys (their last position <= r), so
// only the last chunk keeps the window, moved to its start. An element mask splits with the keys
// (each chunk reads its columns). Causal and the other mask options do not split (each chunk
// would need its own key offset).
#pragma once

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <vector>

#include <cuda_runtime_api.h>

#include "attention/prior_part.h"
#include "common/host_device.h"
#include "samattn/attention.h"

namespace samattn::detail {

inline int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

// A chunk of fewer key blocks than this pays its start, its fp32 store and its share of the
// merge for too little streaming; the automatic choice keeps chunks at least this long.
inline constexpr int64_t kMinChunkBlocks = 2;
// Bounds the merge's loop over a row's chunks and the workspace (FlashAttention-2's bound too).
inline constexpr int64_t kMaxChunks = 128;

// Keys [0, kept keys) cut into full_chunks chunks of chunk_keys logical keys, then a tail.
struct KeySplit {
  int64_t chunk_keys = 0;
  int64_t full_chunks = 0;
  int64_t tail_keys = 0;  // keys of the last chunk (0: none); more than chunk_keys only where a
                          // right-edge window ends the full chunks early
  bool on_decode_kernel = false;  // the chunks run on the decoding kernel (decode.h), which
                                  // also runs a plan of one chunk (no workspace, no merge)
  int64_t parts() const { return full_chunks + (tail_keys > 0 ? 1 : 0); }
};

// Whether the split keeps chunk results in a workspace: any split of the tensor-core chunks, a
// decoding split of two or more chunks.
inline bool split_needs_workspace(const KeySplit& split) {
  return split.parts() > (split.on_decode_kernel ? 1 : 0);
}

// The tensor-core kernel's tile: query rows of a thread block, keys per step, and the blocks an
// SM runs at once.
struct SplitTile {
  int64_t block_m, block_n, blocks_per_sm;
};

// The call with the query heads that share a key/value head packed as the rows of one head
// (grouped-query attention): q (B, Hq, Sq, D) read as (B, Hkv, G * Sq, D), G = Hq / Hkv, and out
// likewise, so one thread block reads a chunk of K and V for all G heads instead of each of them
// reading it again. lse's layout is the same: row g * Sq + i of kv head j is query head
// j * G + g's row i. Possible without causal or mask options (which depend on the row's
// position) when each head of q and out is Sq rows apart (always with Sq = 1, decoding);
// otherwise, or with G = 1, `params` is returned unchanged. The split-key forward runs packed.
AttentionParams packed_query_heads(const AttentionParams& params);

// Whether the call's mask options split: an element mask (its columns cut with the keys) and a
// window's right edge (see the top of the file); not a left edge, block map, pattern, varlen or
// mask.causal_lower_right (the torch layer passes a dense call's as a right edge).
bool splittable_mask(const AttentionParams& params);

// Whether one launch takes every batch entry: the (batch, head) pairs of q, k, v and of the
// element mask, if any, merge into one head index with one stride.
bool chunk_heads_merge(const AttentionParams& params);

// The split of `params` (validated) for a device with `multiprocessors` SMs running blocks of
// `tile`, or parts() == 0 when the call does not split: num_splits 1, a dtype other than
// float16/bfloat16, causal or a mask option splittable_mask() rejects, or (num_splits
// 0) when the query blocks already fill the device or the keys are too few to share out, or when
// the split would take more than one launch (a right edge, or batch entries whose heads do not
// merge: launched one after the other, they were slower than no split on an H200, see
// benchmarks/NOTES.md, stop 51); also when a right edge leaves no whole chunk every query sees.
// Pure: no device query.
KeySplit plan_key_split(const AttentionParams& params, int multiprocessors, SplitTile tile);

// The split attention_forward runs for `params` on the current device (parts() == 0: none;
// also when the tensor-core kernels cannot take the call): the decoding kernel's plan
// (decode_split_for) where it takes the call, else the tensor-core kernels' chunks, planned on
// packed_query_heads(params); the workspace, the launches and the merge below take the packed
// parameters then. A call with cache_seqlens gets the decoding kernel's plan even at num_splits 1
// (one chunk) and never the tensor-core chunks.
KeySplit key_split_for(const AttentionParams& params);

// fp32 workspace of a split: each chunk's output (parts, batch, heads_q, seqlen_q, head_dim_v)
// and lse (parts, batch, heads_q, seqlen_q), laid out as a prior part (prior_part.h) of a
// problem with parts * batch batch entries.
size_t key_split_workspace_bytes(const AttentionParams& params, const KeySplit& split);
PriorPart carve_split_workspace(void* base, const AttentionParams& params, const KeySplit& split);

// One launch of chunks: `view` holds q, k, v, the shapes (batch = chunks, heads = merged
// (batch, head) pairs) and out (fp32 workspace, strides in floats); its lse goes to view.lse
// with these strides (the view's chunk and merged head).
struct SplitLaunch {
  AttentionParams view;
  int64_t lse_batch_stride, lse_head_stride;
  // > 0: the view's last chunk (batch entry) has only this many physical key rows (the tail,
  // run in the same launch as the full chunks); 0: view.seqlen_k like the others.
  int64_t last_chunk_seqlen_k = 0;
};

// Every launch of the split's chunks, in order, writing into `workspace`.
std::vector<SplitLaunch> key_split_launches(const AttentionParams& params, const KeySplit& split,
                                            const PriorPart& workspace);

// The merge of one row's chunks (see the top of this file), in pieces the merge kernel runs in
// parallel and the host tests in order. A NaN lse (a chunk whose scores held a NaN) makes the
// row's lse and output NaN; a row that sees no key in any chunk gets -inf and 0.

// The larger of two lse, NaN if either is.
SAMATTN_HOST_DEVICE float merge_max(float a, float b) {
  return (a != a || b != b) ? NAN : fmaxf(a, b);
}

// A chunk's share of the row's sum, given the chunks' largest lse.
SAMATTN_HOST_DEVICE float chunk_term(float lse, float largest) {
  return largest == -INFINITY ? 0.f : expf(lse - largest);
}

// The row's lse from the chunks' largest lse and the sum of their chunk_term.
SAMATTN_HOST_DEVICE float merged_from(float largest, float sum) {
  return largest == -INFINITY ? -INFINITY : largest + logf(sum);
}

// A chunk's weight in the row's output, exp(lse_c - merged) (0 where the row sees no key).
SAMATTN_HOST_DEVICE float chunk_weight(float lse, float merged) {
  return merged == -INFINITY ? 0.f : expf(lse - merged);
}

// A chunk's slot in the merge of a row's output: kNoKeys for a chunk that saw no key (lse -inf),
// which adds nothing whatever its output holds; else its weight, whose product with the chunk's
// output keeps a NaN output even where the weight underflows to 0.
inline constexpr float kNoKeys = -1.f;
SAMATTN_HOST_DEVICE float chunk_slot(float lse, float merged) {
  return lse == -INFINITY ? kNoKeys : chunk_weight(lse, merged);
}
SAMATTN_HOST_DEVICE float chunk_share(float slot, float out) {
  return slot == kNoKeys ? 0.f : slot * out;
}

// The whole merge of one row: `lse` points at the row's lse in chunk 0, consecutive chunks
// `chunk_stride` apart.
SAMATTN_HOST_DEVICE float merged_lse(const float* lse, int64_t parts, int64_t chunk_stride) {
  float largest = -INFINITY;
  for (int64_t c = 0; c < parts; ++c) largest = merge_max(largest, lse[c * chunk_stride]);
  float sum = 0.f;
  for (int64_t c = 0; c < parts; ++c) sum += chunk_term(lse[c * chunk_stride], largest);
  return merged_from(largest, sum);
}

// Output column `out[0]` of a row merged from its chunks' outputs (chunk_stride apart) given the
// row's merged lse: the chunks' weights sum to 1. A chunk that saw no key (lse -inf) adds
// nothing, whatever its output holds; any other chunk's NaN output makes the value NaN, even
// where its weight underflows to 0.
SAMATTN_HOST_DEVICE float merged_value(const float* out, const float* lse, int64_t parts,
                                       int64_t out_chunk_stride, int64_t lse_chunk_stride,
                                       float merged) {
  if (merged != merged) return NAN;
  float value = 0.f;
  for (int64_t c = 0; c < parts; ++c) {
    value += chunk_share(chunk_slot(lse[c * lse_chunk_stride], merged), out[c * out_chunk_stride]);
  }
  return value;
}

// Merges the chunks in the workspace into params.out (params.dtype) and params.lse (if set).
void merge_key_split(const AttentionParams& params, const KeySplit& split,
                     const PriorPart& workspace, cudaStream_t stream);

// Runs the split of key_split_for(params): packs the query heads, runs the chunks' launches on
// the tensor-core kernels, then the merge (params.workspace of key_split_workspace_bytes bytes).
void key_split_forward(const AttentionParams& params, const KeySplit& split, cudaStream_t stream);

}  // namespace samattn::detail
