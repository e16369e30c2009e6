// Internal: variable-length (packed) batches on the GPU, one dense sub-problem per sequence.
// The sequences' offsets are read back from cu_seqlens once per call (a synchronisation), then
// every sequence runs as a batch-1 problem on its slice of the packed tensors, with lse written
// into its columns of the (Hq, total_q) array. Correct for every kernel; the fused grid over
// max_seqlen with an early exit per block is future work (see README).
#pragma once

#include <cstdint>
#include <vector>

#include <cuda_runtime_api.h>

#include "samattn/attention.h"

namespace samattn::detail {

struct VarlenSequence {
  int64_t q_row0, k_row0, seqlen_q, seqlen_k;
};

// Copies cu_seqlens_q/k (device or host memory) to the host and checks them (0 first,
// non-decreasing, last = total, no sequence longer than the max lengths).
std::vector<VarlenSequence> read_varlen_sequences(const AttentionParams& params,
                                                  cudaStream_t stream);

// The dense batch-1 problem of one sequence: pointers moved to its first rows, lengths set,
// varlen cleared. The caller sets lse's strides in the kernel parameters (head stride total_q).
AttentionParams sequence_params(const AttentionParams& params, const VarlenSequence& sequence);

// Same for a backward problem (dout, dq, dk, dv moved too; the workspace is shared).
AttentionBackwardParams sequence_backward_params(const AttentionBackwardParams& params,
                                                 const VarlenSequence& sequence);

}  // namespace samattn::detail
