#include "attention/key_split.h"

#include <algorithm>

#include "attention/decode.h"
#include "attention/kernel_params.h"
#include "attention/prior_part.h"
#include "attention/tensor_core/forward_config.h"
#include "attention/tensor_core/forward_launch.h"
#include "attention/validate.h"
#include "attention/views.h"
#include "common/check.h"
#include "common/device.h"

namespace samattn::detail {
namespace {

// Query rows of every (batch, head) in the workspace arrays.
int64_t workspace_rows(const AttentionParams& p) { return p.batch * p.heads_q * p.seqlen_q; }

}  // namespace

AttentionParams packed_query_heads(const AttentionParams& p) {
  const int64_t group = p.heads_q / p.heads_kv;
  const bool rows_follow_heads =
      p.seqlen_q == 1 || (p.q_strides.head == p.seqlen_q * p.q_strides.seq &&
                          p.out_strides.head == p.seqlen_q * p.out_strides.seq);
  if (group == 1 || p.causal || p.mask.any() || !rows_follow_heads) return p;
  AttentionParams packed = p;
  packed.heads_q = p.heads_kv;
  packed.seqlen_q = group * p.seqlen_q;
  // With one query row the heads are the rows; otherwise the rows of consecutive heads are
  // consecutive rows.
  const int64_t q_row = p.seqlen_q == 1 ? p.q_strides.head : p.q_strides.seq;
  const int64_t out_row = p.seqlen_q == 1 ? p.out_strides.head : p.out_strides.seq;
  packed.q_strides = {p.q_strides.batch, group * p.q_strides.head, q_row};
  packed.out_strides = {p.out_strides.batch, group * p.out_strides.head, out_row};
  return packed;
}

bool splittable_mask(const AttentionParams& p) {
  const MaskOptions& m = p.mask;
  return !m.has_block_map() && !m.is_varlen() && m.pattern == SparsePattern::kNone &&
         m.window_left < 0 && !m.causal_lower_right && !m.has_cache_seqlens();
}

bool chunk_heads_merge(const AttentionParams& p) {
  const MaskOptions& m = p.mask;
  return heads_merge(p) &&
         (p.batch == 1 || !m.has_element_mask() || m.batch_stride == p.heads_q * m.head_stride);
}

KeySplit plan_key_split(const AttentionParams& p, int multiprocessors, SplitTile tile) {
  const KeySplit none;
  const bool half = p.dtype == DType::kFloat16 || p.dtype == DType::kBFloat16;
  if (p.num_splits == 1 || !half || p.causal || !splittable_mask(p)) return none;
  const int64_t keys = strided_key_count(p);
  if (p.batch == 0 || p.seqlen_q == 0 || keys == 0) return none;
  const int64_t key_blocks = ceil_div(keys, tile.block_n);
  int64_t chunks = std::min(p.num_splits, key_blocks);
  if (p.num_splits == 0) {
    // Only where one launch runs every chunk: launches run one after the other.
    if (p.mask.window_right >= 0 || (p.batch > 1 && !chunk_heads_merge(p))) return none;
    // As many chunks as the launch's query blocks fit every SM's resident blocks in one wave
    // (more would start a second wave for the few blocks past the first).
    const int64_t query_blocks = p.batch * p.heads_q * ceil_div(p.seqlen_q, tile.block_m);
    const int64_t resident = int64_t{multiprocessors} * tile.blocks_per_sm;
    chunks = std::min({resident / query_blocks, key_blocks / kMinChunkBlocks, kMaxChunks});
  }
  chunks = std::min(chunks, kMaxChunks);
  if (chunks < 2) return none;
  KeySplit split;
  split.chunk_keys = ceil_div(key_blocks, chunks) * tile.block_n;
  // With a right edge r the full chunks hold only keys every query sees, and the last chunk
  // starts at a position <= r, so that its window (r less its start) stays an edge, not -1.
  const int64_t shared_keys =
      p.mask.window_right >= 0 ? std::min(keys, p.mask.window_right / p.kv_stride) : keys;
  split.full_chunks = shared_keys / split.chunk_keys;
  split.tail_keys = keys - split.full_chunks * split.chunk_keys;
  return split.full_chunks > 0 ? split : none;
}

KeySplit key_split_for(const AttentionParams& p) {
  // cache_seqlens: the decoding kernel reads them on the device even unsplit (num_splits 1, one
  // chunk), where the other paths would read them back and run one call per batch entry.
  const bool lengths = p.mask.has_cache_seqlens();
  if ((p.num_splits == 1 && !lengths) || !tensor_core::supports(p).ok()) return {};
  if (const KeySplit decode = decode_split_for(p); decode.parts() > 0) return decode;
  if (p.num_splits == 1 || lengths) return {};
  const DeviceInfo& device = current_device_info();
  const int bytes = dtype_size(p.dtype);
  // The chunks write fp32 outputs, which only the masked kernel does: it needs a little more
  // shared memory than the plain one supports() checked (with an element mask, its tile too).
  if (tensor_core::forward_masked_smem_bytes(p.head_dim, bytes, p.mask.has_element_mask()) >
      device.max_smem_optin) {
    return {};
  }
  const tensor_core::TileShape shape = tensor_core::tile_shape(p.head_dim, bytes);
  const SplitTile tile{16 * shape.m_tiles * shape.warps, shape.block_n, shape.min_blocks_per_sm};
  const AttentionParams packed = packed_query_heads(p);
  const KeySplit split = plan_key_split(packed, device.multiprocessors, tile);
  // The masked kernel's length limit, for the chunks' rows and keys.
  if (packed.seqlen_q >= tensor_core::kMaxMaskedLength ||
      split.chunk_keys * p.kv_stride >= tensor_core::kMaxMaskedLength) {
    return {};
  }
  return split;
}

namespace {

// The chunks' (out, lse) arrays are one prior part of the problem repeated per chunk.
AttentionParams every_chunk(const AttentionParams& p, const KeySplit& split) {
  AttentionParams all = p;
  all.batch = split.parts() * p.batch;
  return all;
}

}  // namespace

size_t key_split_workspace_bytes(const AttentionParams& p, const KeySplit& split) {
  return prior_part_bytes(every_chunk(p, split));
}

PriorPart carve_split_workspace(void* base, const AttentionParams& p, const KeySplit& split) {
  return carve_prior_part(base, every_chunk(p, split));
}

std::vector<SplitLaunch> key_split_launches(const AttentionParams& p, const KeySplit& split,
                                            const PriorPart& workspace) {
  const int bytes = dtype_size(p.dtype);
  const int64_t rows = workspace_rows(p);
  const int64_t dim_v = p.head_dim_v;
  const int64_t chunk_rows = split.chunk_keys * p.kv_stride;      // physical k/v rows per chunk
  const int64_t per_launch = chunk_heads_merge(p) ? p.batch : 1;  // batch entries per launch
  const int64_t tail_rows = p.seqlen_k - split.full_chunks * chunk_rows;
  const int64_t tail_count = split.tail_keys > 0 ? 1 : 0;
  // (first chunk, chunks, physical rows of each, of the last): without a window one launch, the
  // tail its last batch entry; with one the full chunks, then the tail, which keeps the window.
  struct Piece {
    int64_t first, count, seqlen_k, last_seqlen_k;
  };
  const bool window = p.mask.window_right >= 0;
  const std::vector<Piece> pieces =
      window ? std::vector<Piece>{{0, split.full_chunks, chunk_rows, 0},
                                  {split.full_chunks, tail_count, tail_rows, 0}}
             : std::vector<Piece>{
                   {0, split.full_chunks + tail_count, chunk_rows, tail_count ? tail_rows : 0}};
  std::vector<SplitLaunch> launches;
  for (int64_t b0 = 0; b0 < p.batch; b0 += per_launch) {
    for (const Piece& piece : pieces) {
      if (piece.count == 0) continue;
      AttentionParams view = p;
      view.batch = piece.count;
      view.heads_q = p.heads_q * per_launch;
      view.heads_kv = p.heads_kv * per_launch;
      view.seqlen_k = piece.seqlen_k;
      view.mask = MaskOptions{};
      view.num_splits = 1;
      view.workspace = nullptr;
      const int64_t row0 = piece.first * chunk_rows;
      // The full chunks hold only keys every query sees; the last keeps the right edge, moved
      // to its first position (row0 <= r by the plan).
      if (p.mask.window_right >= 0 && piece.first == split.full_chunks) {
        view.mask.window_right = p.mask.window_right - row0;
      }
      // The element mask's columns of the chunk; the chunk is the view's batch index and the
      // (batch, head) pairs its heads, as for q.
      const MaskOptions& m = p.mask;
      if (m.has_element_mask()) {
        view.mask.data =
            advance(m.data, b0 * m.batch_stride + row0 * m.col_stride, mask_entry_bytes(m.dtype));
        view.mask.dtype = m.dtype;
        view.mask.batch_stride = chunk_rows * m.col_stride;
        view.mask.head_stride = m.head_stride;
        view.mask.row_stride = m.row_stride;
        view.mask.col_stride = m.col_stride;
      }
      view.q = advance(p.q, b0 * p.q_strides.batch, bytes);
      view.k = advance(p.k, b0 * p.k_strides.batch + row0 * p.k_strides.seq, bytes);
      view.v = advance(p.v, b0 * p.v_strides.batch + row0 * p.v_strides.seq, bytes);
      // Every chunk reads the same queries: batch stride 0.
      view.q_strides = {0, p.q_strides.head, p.q_strides.seq};
      view.k_strides = {chunk_rows * p.k_strides.seq, p.k_strides.head, p.k_strides.seq};
      view.v_strides = {chunk_rows * p.v_strides.seq, p.v_strides.head, p.v_strides.seq};
      // Chunk c's (b, h, i) at (c * rows + (b * heads_q + h) * seqlen_q + i), in floats.
      const int64_t row_offset = piece.first * rows + b0 * p.heads_q * p.seqlen_q;
      view.out = workspace.out + row_offset * dim_v;
      view.out_strides = {rows * dim_v, p.seqlen_q * dim_v, dim_v};
      view.lse = workspace.lse + row_offset;
      launches.push_back({view, rows, p.seqlen_q, piece.last_seqlen_k});
    }
  }
  return launches;
}

void key_split_forward(const AttentionParams& params, const KeySplit& split, cudaStream_t stream) {
  const AttentionParams p = packed_query_heads(params);
  SAMATTN_CHECK(p.workspace != nullptr, "the split-key forward needs a workspace of ",
                static_cast<uint64_t>(key_split_workspace_bytes(p, split)),
                " bytes (attention_forward_workspace_bytes)");
  const PriorPart workspace = carve_split_workspace(p.workspace, p, split);
  for (const SplitLaunch& launch : key_split_launches(p, split, workspace)) {
    ForwardKernelParams kernel = make_forward_kernel_params(launch.view);
    kernel.out_is_float = true;
    kernel.lse_batch_stride = launch.lse_batch_stride;
    kernel.lse_head_stride = launch.lse_head_stride;
    kernel.last_batch_kept_keys = ceil_div(launch.last_chunk_seqlen_k, p.kv_stride);
    tensor_core::dispatch_forward(p.dtype, kernel, stream);
  }
  merge_key_split(p, split, workspace, stream);
}

}  // namespace samattn::detail
