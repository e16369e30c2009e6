#include "attention/cache_seqlens.h"

#include "attention/validate.h"
#include "attention/views.h"
#include "common/check.h"
#include "common/cuda_check.h"

namespace samattn::detail {
namespace {

// Zeroes rows [first_row, rows) of each of `heads` heads of batch entry b of a (B, H, S, width)
// gradient whose last dimension is contiguous.
void zero_rows(void* base, const Strides& strides, int element_bytes, int64_t b, int64_t heads,
               int64_t first_row, int64_t rows, int64_t width, cudaStream_t stream) {
  if (first_row >= rows || width == 0) return;
  const size_t row_bytes = static_cast<size_t>(width) * element_bytes;
  for (int64_t h = 0; h < heads; ++h) {
    void* first = advance(base, b * strides.batch + h * strides.head + first_row * strides.seq,
                          element_bytes);
    const int64_t count = rows - first_row;
    if (count == 1 || strides.seq * element_bytes == static_cast<int64_t>(row_bytes)) {
      SAMATTN_CUDA_CHECK(cudaMemsetAsync(first, 0, count * row_bytes, stream));
    } else {
      SAMATTN_CUDA_CHECK(
          cudaMemset2DAsync(first, strides.seq * element_bytes, 0, row_bytes, count, stream));
    }
  }
}

}  // namespace

std::vector<int64_t> read_cache_seqlens(const AttentionParams& p, cudaStream_t stream) {
  std::vector<int32_t> lengths(p.batch);
  SAMATTN_CUDA_CHECK(cudaMemcpyAsync(lengths.data(), p.mask.cache_seqlens,
                                     lengths.size() * sizeof(int32_t), cudaMemcpyDefault, stream));
  SAMATTN_CUDA_CHECK(cudaStreamSynchronize(stream));
  AttentionParams host = p;
  host.mask.cache_seqlens = lengths.data();
  validate_host_cache_seqlens(host);
  return {lengths.begin(), lengths.end()};
}

AttentionParams batch_entry_params(const AttentionParams& p, int64_t b, int64_t keys) {
  AttentionParams entry = p;
  const int bytes = dtype_size(p.dtype);
  entry.batch = 1;
  entry.seqlen_k = keys;
  entry.q = advance(p.q, b * p.q_strides.batch, bytes);
  entry.k = advance(p.k, b * p.k_strides.batch, bytes);
  entry.v = advance(p.v, b * p.v_strides.batch, bytes);
  entry.out = advance(p.out, b * p.out_strides.batch, bytes);
  entry.lse = advance(p.lse, b * p.heads_q * p.seqlen_q, lse_entry_bytes(p.dtype));
  MaskOptions& m = entry.mask;
  m.data = advance(p.mask.data, b * p.mask.batch_stride, mask_entry_bytes(p.mask.dtype));
  if (p.mask.has_block_map()) m.block_map = p.mask.block_map + b * p.mask.block_batch_stride;
  m.cache_seqlens = nullptr;
  return entry;
}

AttentionBackwardParams batch_entry_backward_params(const AttentionBackwardParams& bp, int64_t b,
                                                    int64_t keys) {
  AttentionBackwardParams entry = bp;
  entry.forward = batch_entry_params(bp.forward, b, keys);
  const int bytes = dtype_size(bp.forward.dtype);
  entry.dout = advance(bp.dout, b * bp.dout_strides.batch, bytes);
  entry.dq = advance(bp.dq, b * bp.dq_strides.batch, bytes);
  entry.dk = advance(bp.dk, b * bp.dk_strides.batch, bytes);
  entry.dv = advance(bp.dv, b * bp.dv_strides.batch, bytes);
  return entry;
}

AttentionParams entry_sizing_params(const AttentionParams& p) {
  return batch_entry_params(p, 0, p.seqlen_k);
}

AttentionBackwardParams entry_sizing_backward_params(const AttentionBackwardParams& bp) {
  return batch_entry_backward_params(bp, 0, bp.forward.seqlen_k);
}

void per_entry_forward(const AttentionParams& p, cudaStream_t stream) {
  const std::vector<int64_t> lengths = read_cache_seqlens(p, stream);
  const size_t workspace = attention_forward_workspace_bytes(entry_sizing_params(p));
  for (int64_t b = 0; b < p.batch; ++b) {
    AttentionParams entry = batch_entry_params(p, b, lengths[b]);
    // The caller's workspace was sized for an entry with every key; an entry whose plan would
    // want more (a plan need not grow with its keys) runs without one, as it may.
    if (attention_forward_workspace_bytes(entry) > workspace) {
      entry.workspace = nullptr;
      entry.num_splits = 1;
    }
    attention_forward(entry, stream);
  }
}

void per_entry_backward(const AttentionBackwardParams& bp, cudaStream_t stream) {
  const AttentionParams& p = bp.forward;
  const std::vector<int64_t> lengths = read_cache_seqlens(p, stream);
  const size_t workspace = attention_backward_workspace_bytes(entry_sizing_backward_params(bp));
  const int bytes = dtype_size(p.dtype);
  for (int64_t b = 0; b < p.batch; ++b) {
    const AttentionBackwardParams entry = batch_entry_backward_params(bp, b, lengths[b]);
    SAMATTN_CHECK(attention_backward_workspace_bytes(entry) <= workspace, "internal: batch entry ",
                  b,
                  " of a cache_seqlens backward needs more workspace "
                  "than its sizing entry");
    attention_backward(entry, stream);
    zero_rows(bp.dk, bp.dk_strides, bytes, b, p.heads_kv, lengths[b], p.seqlen_k, p.head_dim,
              stream);
    zero_rows(bp.dv, bp.dv_strides, bytes, b, p.heads_kv, lengths[b], p.seqlen_k, p.head_dim_v,
              stream);
  }
}

}  // namespace samattn::detail
