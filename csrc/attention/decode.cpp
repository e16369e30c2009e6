#include "attention/decode.h"

#include <algorithm>
#include <cmath>

#include "attention/alignment.h"
#include "attention/key_split.h"
#include "attention/prior_part.h"
#include "attention/validate.h"
#include "common/check.h"
#include "common/device.h"

namespace samattn::detail {
namespace {

// Grid limits of the launch's y (kv heads) and z (batch entries) dimensions.
constexpr int64_t kMaxGridYZ = 65535;

Status declined(const std::string& why) {
  return Status::failure("the decoding kernel does not take " + why);
}

// The right edge the kernel applies: -1 (none) also where every query sees every key (r >=
// seqlen_k), which keeps seqlen_q + r from overflowing for any r, and where the window follows
// bottom-right causal (its right edge then lies at or past the causal one, which the kernel
// applies itself).
int64_t right_edge(const AttentionParams& p) {
  if (p.mask.window_follows_causal) return -1;
  return p.mask.window_right >= 0 && p.mask.window_right < p.seqlen_k ? p.mask.window_right : -1;
}

// The left edge the kernel applies: a window's following bottom-right causal, -1 (none) also
// where it hides nothing (left >= seqlen_k), which keeps every sum with it from overflowing.
int64_t left_edge(const AttentionParams& p) {
  const int64_t left = p.mask.window_left;
  return p.mask.window_follows_causal && left >= 0 && left < p.seqlen_k ? left : -1;
}

// Keys any query sees: all, or with a right edge r the first seqlen_q + r (query t sees
// j <= t + r). Bottom-right causal and cache_seqlens hide keys per entry; the plan covers the
// longest (chunks past an entry's keys do nothing).
int64_t visible_keys(const AttentionParams& p) {
  // A window following bottom-right causal: an entry's rows see at most seqlen_q + left keys,
  // from its first row's window start (where its chunks begin).
  if (left_edge(p) >= 0) return std::min(p.seqlen_k, p.seqlen_q + left_edge(p));
  if (right_edge(p) < 0) return p.seqlen_k;
  return std::min(p.seqlen_k, p.seqlen_q + right_edge(p));
}

}  // namespace

Status decode_kernel_takes(const AttentionParams& p) {
  if (p.dtype != DType::kFloat16 && p.dtype != DType::kBFloat16) {
    return declined(concat("dtype ", dtype_name(p.dtype), " (float16, bfloat16)"));
  }
  const bool dim_ok = std::find(std::begin(kDecodeHeadDims), std::end(kDecodeHeadDims),
                                p.head_dim) != std::end(kDecodeHeadDims);
  if (!dim_ok || p.head_dim_v != p.head_dim) {
    return declined(concat("head_dim ", p.head_dim, " with head_dim_v ", p.head_dim_v,
                           " (equal, one of ", comma_list(kDecodeHeadDims), ")"));
  }
  if (p.kv_stride != 1) return declined(concat("kv_stride ", p.kv_stride, " (1)"));
  const MaskOptions& m = p.mask;
  // (A window following bottom-right causal has no effect without a left edge.)
  // A left edge only where it follows bottom-right causal (sliding-window decoding).
  if (p.causal || m.has_block_map() || m.is_varlen() || m.pattern != SparsePattern::kNone ||
      (m.window_left >= 0 && !m.window_follows_causal)) {
    return declined(
        "top-left causal or mask options other than bottom-right causal, a window (a left edge "
        "only with window_follows_causal), cache_seqlens and attn_mask");
  }
  if (m.has_element_mask() && (m.head_stride != 0 || (m.row_stride != 0 && p.seqlen_q > 1))) {
    return declined("an attn_mask that varies over heads or query rows (a key mask only)");
  }
  const int64_t rows = p.heads_q / p.heads_kv * p.seqlen_q;
  if (rows > kDecodeMaxRows) {
    return declined(concat((p.heads_q / p.heads_kv), " query heads per kv head x seqlen_q ",
                           p.seqlen_q, " = ", rows, " rows (at most ", kDecodeMaxRows, ")"));
  }
  if (p.seqlen_q == 0 || p.seqlen_k == 0 || p.batch == 0 || p.heads_kv == 0) {
    return declined("empty calls");
  }
  if (p.batch > kMaxGridYZ || p.heads_kv > kMaxGridYZ) {
    return declined(concat("batch ", p.batch, " and heads_kv ", p.heads_kv, " (each at most ",
                           kMaxGridYZ, ")"));
  }
  return Status::success();
}

KeySplit plan_decode(const AttentionParams& p, int64_t resident_blocks) {
  const int64_t keys = visible_keys(p);
  const int64_t key_tiles = ceil_div(keys, kDecodeBlockN);
  int64_t chunks = std::min(p.num_splits, key_tiles);
  if (p.num_splits == 0) {
    // As many chunks as fit the resident blocks in one wave: the blocks are equal work, so a
    // few past the wave would run a second wave of their own (e.g. 32 heads, 264 resident:
    // 9 chunks = 288 blocks took two block times, 8 = 256 take one).
    const int64_t blocks = p.batch * p.heads_kv;
    chunks = std::min({resident_blocks / blocks, key_tiles / kMinChunkBlocks, kMaxChunks});
  }
  chunks = std::clamp<int64_t>(chunks, 1, kMaxChunks);
  KeySplit split;
  split.on_decode_kernel = true;
  split.chunk_keys = ceil_div(key_tiles, chunks) * kDecodeBlockN;
  split.full_chunks = keys / split.chunk_keys;
  split.tail_keys = keys % split.chunk_keys;
  return split;
}

KeySplit decode_split_for(const AttentionParams& p) {
  if (!decode_kernel_takes(p).ok()) return {};
  const DeviceInfo& device = current_device_info();
  // Head dims 192 and 256 need more shared memory than sm86/sm89 blocks may opt in to.
  if (decode_smem_bytes(static_cast<int>(p.head_dim)) > device.max_smem_optin) return {};
  const int64_t resident =
      int64_t{device.multiprocessors} * tensor_core::decode_blocks_per_sm(p.dtype, p.head_dim);
  return plan_decode(p, resident);
}

DecodeKernelParams make_decode_kernel_params(const AttentionParams& p, const KeySplit& split,
                                             const PriorPart& workspace) {
  DecodeKernelParams k{};
  k.q = p.q;
  k.k = p.k;
  k.v = p.v;
  k.out = p.out;
  k.lse = static_cast<float*>(p.lse);
  k.parts = split.parts();
  if (k.parts > 1) {
    k.part_out = workspace.out;
    k.part_lse = workspace.lse;
  }
  k.workspace_rows = p.batch * p.heads_q * p.seqlen_q;
  k.q_batch_stride = p.q_strides.batch;
  k.q_head_stride = p.q_strides.head;
  k.q_row_stride = p.q_strides.seq;
  k.k_batch_stride = p.k_strides.batch;
  k.k_head_stride = p.k_strides.head;
  k.k_row_stride = p.k_strides.seq;
  k.v_batch_stride = p.v_strides.batch;
  k.v_head_stride = p.v_strides.head;
  k.v_row_stride = p.v_strides.seq;
  k.o_batch_stride = p.out_strides.batch;
  k.o_head_stride = p.out_strides.head;
  k.o_row_stride = p.out_strides.seq;
  k.heads_kv = p.heads_kv;
  k.group = p.heads_q / p.heads_kv;
  k.seqlen_q = p.seqlen_q;
  k.seqlen_k = p.seqlen_k;
  k.chunk_keys = split.chunk_keys;
  k.right_edge = right_edge(p);
  k.lower_right = p.mask.causal_lower_right;
  k.window_left = left_edge(p);
  k.cache_seqlens = p.mask.cache_seqlens;
  k.block_table = p.mask.block_table;
  k.block_table_stride = p.mask.block_table_stride;
  k.page_size = p.mask.page_size;
  k.num_pages = p.mask.num_pages;
  k.scale_log2 = static_cast<float>(resolved_softmax_scale(p) * M_LOG2E);
  k.mask = p.mask.data;
  k.mask_dtype = p.mask.dtype;
  k.mask_batch_stride = p.mask.batch_stride;
  k.mask_col_stride = p.mask.col_stride;
  return k;
}

void decode_forward(const AttentionParams& p, const KeySplit& split, cudaStream_t stream) {
  PriorPart workspace{nullptr, nullptr};
  if (split.parts() > 1) {
    SAMATTN_CHECK(p.workspace != nullptr, "the split decoding forward needs a workspace of ",
                  static_cast<uint64_t>(key_split_workspace_bytes(p, split)),
                  " bytes (attention_forward_workspace_bytes)");
    workspace = carve_split_workspace(p.workspace, p, split);
  }
  tensor_core::dispatch_decode(p.dtype, p.head_dim, p.batch,
                               make_decode_kernel_params(p, split, workspace), stream);
  if (split.parts() > 1) merge_key_split(p, split, workspace, stream);
}

}  // namespace samattn::detail
