// Internal: per-entry key lengths of a dense batch (MaskOptions::cache_seqlens) on every path but
// the decoding kernel, which reads them on the device (decode.h). The lengths are read back once
// (a synchronisation) and checked; then each batch entry runs as a batch-1 call on its first
// cache_seqlens[b] keys, which every kernel takes as it is (bottom-right causal then aligns to
// the entry's length by itself). In the backward, the rows past an entry's length get zero dk and
// dv. One launch per entry: correct everywhere, fast only where entries are few or long.
#pragma once

#include <cstdint>
#include <vector>

#include <cuda_runtime_api.h>

#include "samattn/attention.h"

namespace samattn::detail {

// Copies cache_seqlens (device or host memory) to the host and checks that each is in
// [0, seqlen_k].
std::vector<int64_t> read_cache_seqlens(const AttentionParams& params, cudaStream_t stream);

// Batch entry b as a batch-1 call on its first `keys` keys: q, k, v, out, lse, the element mask
// and the block map moved to entry b, seqlen_k = keys, cache_seqlens cleared. The workspace and
// num_splits are the caller's.
AttentionParams batch_entry_params(const AttentionParams& params, int64_t b, int64_t keys);

// The same for a backward problem (dout, dq, dk and dv moved too).
AttentionBackwardParams batch_entry_backward_params(const AttentionBackwardParams& params,
                                                    int64_t b, int64_t keys);

// The entry call that sizes a per-entry call's workspace: entry 0 with every key. Only shapes
// and options are read, never the pointers.
AttentionParams entry_sizing_params(const AttentionParams& params);
AttentionBackwardParams entry_sizing_backward_params(const AttentionBackwardParams& params);

// The per-entry forward and backward (the caller validated `params`).
void per_entry_forward(const AttentionParams& params, cudaStream_t stream);
void per_entry_backward(const AttentionBackwardParams& params, cudaStream_t stream);

}  // namespace samattn::detail
