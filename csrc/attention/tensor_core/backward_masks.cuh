// Internal: the mask policy in the tensor-core backward (the kMasked instantiations of
// backward_kernel.cuh), with the forward's rules (forward_masked_kernel.cuh): pairs of a query
// block and a key block are skipped when nothing of them is visible, computed without masking
// work when everything is, and masked element by element otherwise: by per-row (dQ kernel) or
// per-key (dK/dV kernel) ranges for causal, the window, kv_stride and sequence ends, or by a
// shared tile of mask terms (simt::masked_score) for patterns, block maps and element masks.
#pragma once

#include <cstdint>

#include "attention/kernel_params.h"
#include "attention/mask_policy.cuh"
#include "attention/tensor_core/forward_masked_kernel.cuh"

namespace samattn::tensor_core {

// The work of the pair (queries [m_begin, m_begin + rows), keys [n_begin, n_begin + block_n)):
// with a mask tile, the shared classification; otherwise partial unless the queries lie in
// [query_begin, query_end) and the keys in [key_begin, key_end), the rectangle every pair of
// which is visible by causal and the window (empty ranges make every pair partial).
__device__ __forceinline__ KeyBlockWork pair_work(
    const detail::ForwardKernelParams& f, const detail::MaskPolicy& policy, bool mask_tile,
    int64_t b, int64_t h, int64_t m_begin, int rows, int block_m, int64_t n_begin, int block_n,
    int64_t kept_keys, int64_t query_begin, int64_t query_end, int64_t key_begin, int64_t key_end) {
  if (mask_tile) {
    const detail::BlockClass c =
        simt::classify_key_block(f, policy, b, h, m_begin, rows, n_begin, block_n, kept_keys);
    if (c == detail::BlockClass::kSkip) return KeyBlockWork::kSkip;
    return c == detail::BlockClass::kFull ? KeyBlockWork::kNone : KeyBlockWork::kMaskTile;
  }
  const bool covered = m_begin >= query_begin && m_begin + block_m <= query_end &&
                       n_begin >= key_begin && n_begin + block_n <= key_end;
  return covered ? KeyBlockWork::kNone : KeyBlockWork::kRowRange;
}

// Fills the mask terms of queries [m_begin, m_begin + kBlockM) x logical keys [n_begin, n_begin +
// kBlockN) into tile[query * kQueryStride + key * kKeyStride] (queries past `rows` and keys past
// kept_keys get -inf). The whole block calls it; consecutive threads take consecutive keys, so
// reads of a row-major mask tensor coalesce.
template <int kBlockM, int kBlockN, int kQueryStride, int kKeyStride, int kThreads>
__device__ __forceinline__ void fill_pair_mask(float* tile, const detail::ForwardKernelParams& f,
                                               const detail::MaskPolicy& policy, int64_t b,
                                               int64_t h, int64_t m_begin, int rows,
                                               int64_t n_begin, int64_t kept_keys) {
#pragma unroll 1
  for (int e = threadIdx.x; e < kBlockM * kBlockN; e += kThreads) {
    const int query = e / kBlockN;
    const int key = e % kBlockN;
    tile[query * kQueryStride + key * kKeyStride] =
        query < rows ? simt::masked_score<float>(f, policy, b, h, m_begin + query, n_begin + key,
                                                 kept_keys, 0.f)
                     : -INFINITY;
  }
}

// lse * log2(e) for exp2(s * scale * log2 e - lse * log2 e), with a row that saw no key (lse
// -inf) turned into +inf so that its probabilities are 0, never inf.
__device__ __forceinline__ float lse_log2(float lse) {
  return lse == -INFINITY ? INFINITY : lse * kLog2e;
}

// Adds a mask term in the log2 domain: exactly -inf for a hidden pair, whatever the score.
__device__ __forceinline__ float add_mask_term(float x, float term) {
  return term == -INFINITY ? -INFINITY : x + term;
}

}  // namespace samattn::tensor_core
