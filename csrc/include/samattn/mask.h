// Which keys each query sees beyond causal and kv_stride: an element mask tensor, a sliding
// window, a Sparse Transformer pattern and variable-length (packed) batches. Every option is a
// run-time value of AttentionParams::mask; all of them combine (a key is visible when every
// option lets it through).
#pragma once

#include <cstdint>

namespace samattn {

// Element type of an attention mask tensor. kBool follows SDPA: true = attend. The float types
// are added to the scaled scores before the softmax (-inf hides a key); they must be float32 or
// the inputs' dtype.
enum class MaskDType : int { kBool, kFloat64, kFloat32, kFloat16, kBFloat16 };

const char* mask_dtype_name(MaskDType dtype);

// Sparse Transformer patterns (Child et al., 2019); both are causal by definition.
//   kStrided: query i sees key j <= i when i - j < block or (i - j) % block == 0.
//   kFixed:   query i sees key j <= i when j / block == i / block (its own block) or
//             j % block >= block - summary (the last `summary` positions of every block).
enum class SparsePattern : int { kNone, kStrided, kFixed };

const char* sparse_pattern_name(SparsePattern pattern);

struct MaskOptions {
  // Element mask (B|1, H|1, Sq, Sk) on the inputs' device, or null. Element (b, h, i, j) lives at
  // b * batch_stride + h * head_stride + i * row_stride + j * col_stride; a stride of 0
  // broadcasts that dimension. Indexed by the query head h (not the key head).
  const void* data = nullptr;
  MaskDType dtype = MaskDType::kBool;
  int64_t batch_stride = 0, head_stride = 0, row_stride = 0, col_stride = 0;

  // Block-sparse attention: a (B|1, H|1, ceil(Sq / block_q), ceil(Sk / block_k)) byte map on
  // the inputs' device (strides in elements, 0 broadcasts); pair (i, j) is visible only where
  // block_map[b, h, i / block_q, j / block_k] != 0. Key blocks whose entry is 0 are skipped by the
  // kernels; the element mask above, if any, still applies inside listed blocks. (The torch layer
  // builds it from FlexAttention's kv_num_blocks / kv_indices tables.)
  const uint8_t* block_map = nullptr;
  int64_t block_q = 0, block_k = 0;
  int64_t block_batch_stride = 0, block_head_stride = 0, block_row_stride = 0, block_col_stride = 0;

  // Sliding window around the diagonal: query i sees keys i - window_left <= j <= i +
  // window_right; -1 leaves that side unbounded.
  int64_t window_left = -1;
  int64_t window_right = -1;

  // Bottom-right causal: query i sees keys j <= i + seqlen_k - seqlen_q, under varlen with each
  // sequence's own lengths, so that the last query sees every key (new queries against a KV
  // cache, chunked prefill: torch's causal_lower_right, FlashAttention-2's causal=True).
  // AttentionParams::causal is the top-left form; at most one of the two is set. With seqlen_q >
  // seqlen_k the first seqlen_q - seqlen_k rows see no key (output 0, lse -inf). Positions are
  // physical, as for causal (kv_stride keeps positions 0, s, 2s, ...). Not with a pattern.
  bool causal_lower_right = false;
  // With causal_lower_right: the window follows the bottom-right diagonal, as FlashAttention's
  // window_size does: query i sees i + shift - window_left <= j <= i + shift + window_right,
  // shift = seqlen_k - seqlen_q of its sequence (varlen) or batch entry (cache_seqlens). Without
  // it the window stays centred on j = i.
  bool window_follows_causal = false;

  SparsePattern pattern = SparsePattern::kNone;
  int64_t pattern_block = 0;    // l: the stride (kStrided) or block length (kFixed), >= 1
  int64_t pattern_summary = 0;  // c: summary columns per block (kFixed), 1 <= c <= l

  // Variable-length batches in FlashAttention-2's packed layout. When cu_seqlens_q is set, q,
  // out (and dq, dout) are (total_q, H, D) tensors passed with batch stride 0: sequence b owns
  // rows [cu_seqlens_q[b], cu_seqlens_q[b + 1]); seqlen_q and seqlen_k are the maximum lengths
  // and `batch` the number of sequences. cu_seqlens_q and cu_seqlens_k are int32 arrays of
  // batch + 1 non-decreasing entries, starting at 0, in the memory of the call (device memory for
  // attention_forward, host memory for the reference), set together. lse is then (Hq, total_q).
  // Positions (causal, window, patterns, mask rows/columns) count from each sequence's start.
  // The tensor-core kernels (float16/bfloat16; on compute capability 9.0 with kv_stride 1 the
  // Hopper forward, which reads a sequence's last key block past its end in the packed k and v
  // and masks it) read cu_seqlens on the device in one launch and do
  // not validate their contents (FlashAttention-2's contract; they clamp them, so invalid arrays
  // give undefined values but no access outside the tensors); the CUDA-core kernels and the
  // reference read and check them on the host.
  const int32_t* cu_seqlens_q = nullptr;
  const int32_t* cu_seqlens_k = nullptr;
  int64_t total_q = 0;  // rows of the packed q / out (== cu_seqlens_q[batch])
  int64_t total_k = 0;  // rows of the packed k / v (== cu_seqlens_k[batch])

  // Per-entry key lengths of a dense batch (FlashAttention's cache_seqlens: a KV cache
  // allocated for seqlen_k keys and filled to a different length per entry), or null: batch
  // entry b's keys are the first cache_seqlens[b] rows of its k and v (0 <= value <= seqlen_k);
  // later rows are never read and get zero gradients. Bottom-right causal aligns each entry to its
  // own length (query i sees j <= i + cache_seqlens[b] - seqlen_q). int32, `batch` entries, in
  // the memory of the call, like cu_seqlens; not with varlen, whose cu_seqlens_k already give
  // each sequence its keys. The decoding kernel (AttentionParams::num_splits) reads them on the
  // device in its one launch, clamped to [0, seqlen_k]; every other call reads them on the host
  // (one synchronisation), checks them and runs one call per batch entry.
  const int32_t* cache_seqlens = nullptr;

  // A paged KV cache (vLLM's and FlashAttention's block_table), with cache_seqlens, or null: k
  // and v are pools of num_pages pages of page_size rows, k_strides.batch (v_strides.batch) the
  // stride between pages, .seq between a page's rows and .head between heads; batch entry b's key
  // j is row j % page_size of page block_table[b * block_table_stride + j / page_size]. int32, in
  // the memory of the call; on the device, entries outside [0, num_pages) are clamped (the
  // contents are the caller's). seqlen_k bounds the entries' lengths: block_table has at least
  // ceil(seqlen_k / page_size) columns. Only the decoding kernel reads a paged cache (the calls
  // AttentionParams::num_splits lists); the others are refused, naming the reason. The
  // reference gathers the pages first.
  const int32_t* block_table = nullptr;
  int64_t block_table_stride = 0;
  int64_t page_size = 0;
  int64_t num_pages = 0;

  bool has_element_mask() const { return data != nullptr; }
  bool has_block_map() const { return block_map != nullptr; }
  bool has_window() const { return window_left >= 0 || window_right >= 0; }
  bool is_varlen() const { return cu_seqlens_q != nullptr; }
  bool has_cache_seqlens() const { return cache_seqlens != nullptr; }
  bool is_paged() const { return block_table != nullptr; }
  // True when a key's visibility depends on anything but causal and kv_stride.
  bool any() const {
    return has_element_mask() || has_block_map() || has_window() || causal_lower_right ||
           pattern != SparsePattern::kNone || is_varlen() || has_cache_seqlens();
  }
};

}  // namespace samattn
