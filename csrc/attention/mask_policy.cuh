// Internal: the device side of the mask policy shared by the SIMT kernels: per-element
// visibility (kv_stride, causal, window, pattern, element mask) and per-block classification
// (skip / partial / full), on top of the host-device rules of mask_policy.h.
#pragma once

#include <cstdint>

#include "attention/kernel_params.h"
#include "attention/mask_policy.h"
#include "attention/simt/numeric.cuh"

namespace samattn::simt {

// The additive element-mask term of pair (b, h, query, position) in the log2 domain: 0 or -inf
// for a boolean mask, value * log2(e) for a float one.
template <typename Acc>
__device__ __forceinline__ Acc element_mask_log2(const detail::ForwardKernelParams& p, int64_t b,
                                                 int64_t h, int64_t query, int64_t position) {
  constexpr double kLog2e = 1.4426950408889634;
  const int64_t offset = b * p.mask_batch_stride + h * p.mask_head_stride +
                         query * p.mask_row_stride + position * p.mask_col_stride;
  switch (p.mask_dtype) {
    case MaskDType::kBool:
      return static_cast<const bool*>(p.mask)[offset] ? Acc(0) : negative_infinity<Acc>();
    case MaskDType::kFloat64:
      return static_cast<Acc>(static_cast<const double*>(p.mask)[offset] * kLog2e);
    case MaskDType::kFloat32:
      return static_cast<Acc>(static_cast<const float*>(p.mask)[offset]) * static_cast<Acc>(kLog2e);
    case MaskDType::kFloat16:
      return static_cast<Acc>(widen(static_cast<const __half*>(p.mask)[offset])) *
             static_cast<Acc>(kLog2e);
    case MaskDType::kBFloat16:
      return static_cast<Acc>(widen(static_cast<const __nv_bfloat16*>(p.mask)[offset])) *
             static_cast<Acc>(kLog2e);
  }
  return Acc(0);
}

// The block map's entry for (b, h, query, position): nonzero when the pair's block is listed.
__device__ __forceinline__ bool block_listed(const detail::ForwardKernelParams& p, int64_t b,
                                             int64_t h, int64_t query, int64_t position) {
  return p.block_map[b * p.block_batch_stride + h * p.block_head_stride +
                     (query / p.block_q) * p.block_row_stride +
                     (position / p.block_k) * p.block_col_stride] != 0;
}

// The block map's verdict on queries [q0, q1) x positions [k0, k1) (both non-empty): kSkip when
// no map block they overlap is listed, kFull when every one is, kPartial otherwise. Uniform over
// a thread block (every thread reads the same entries).
__device__ __forceinline__ detail::BlockClass block_map_class(const detail::ForwardKernelParams& p,
                                                              int64_t b, int64_t h, int64_t q0,
                                                              int64_t q1, int64_t k0, int64_t k1) {
  bool any = false, all = true;
#pragma unroll 1
  for (int64_t qb = q0 / p.block_q; qb <= (q1 - 1) / p.block_q; ++qb) {
#pragma unroll 1
    for (int64_t kb = k0 / p.block_k; kb <= (k1 - 1) / p.block_k; ++kb) {
      const bool listed = block_listed(p, b, h, qb * p.block_q, kb * p.block_k);
      any = any || listed;
      all = all && listed;
    }
  }
  if (!any) return detail::BlockClass::kSkip;
  return all ? detail::BlockClass::kFull : detail::BlockClass::kPartial;
}

// Applies everything but the element mask to one score: -inf when logical key `key` is past
// key_end or hidden from `query` by causal, the window or the pattern.
// `policy` is p.policy or, under varlen, the sequence's (detail::for_sequence).
__device__ __forceinline__ bool key_structurally_hidden(const detail::ForwardKernelParams& p,
                                                        const detail::MaskPolicy& policy,
                                                        int64_t query, int64_t key,
                                                        int64_t key_end) {
  if (key >= key_end) return true;
  if (!p.has_policy) return p.causal && key * p.kv_stride > query;
  return !detail::structurally_visible(policy, query, key * p.kv_stride);
}

// Masks one score in the log2 domain: structure, then the additive element mask.
template <typename Acc>
__device__ __forceinline__ Acc masked_score(const detail::ForwardKernelParams& p,
                                            const detail::MaskPolicy& policy, int64_t b, int64_t h,
                                            int64_t query, int64_t key, int64_t key_end,
                                            Acc score) {
  if (key_structurally_hidden(p, policy, query, key, key_end)) return negative_infinity<Acc>();
  if (p.block_map != nullptr && !block_listed(p, b, h, query, key * p.kv_stride)) {
    return negative_infinity<Acc>();
  }
  if (p.mask != nullptr) score += element_mask_log2<Acc>(p, b, h, query, key * p.kv_stride);
  return score;
}

// The logical keys [begin, end) that query rows [m_begin, m_begin + rows) (rows >= 1) can see
// at all, by causal and the window, among `kept_keys` (detail::visible_key_span of the first and
// the last row: both ends grow with the row).
struct LogicalKeyRange {
  int64_t begin, end;
};

__device__ __forceinline__ LogicalKeyRange visible_logical_keys(
    const detail::ForwardKernelParams& p, int64_t m_begin, int rows, int64_t kept_keys) {
  const detail::Span first = detail::visible_key_span(p.policy, m_begin, kept_keys, p.kv_stride);
  const detail::Span last =
      detail::visible_key_span(p.policy, m_begin + rows - 1, kept_keys, p.kv_stride);
  return {first.begin, last.end > first.begin ? last.end : first.begin};
}

__device__ __forceinline__ LogicalKeyRange
visible_logical_keys(const detail::ForwardKernelParams& p, int64_t m_begin, int rows) {
  return visible_logical_keys(p, m_begin, rows, p.kept_keys);
}

// True when partial blocks take their mask from a shared-memory tile (fill_mask_tile): any
// window, pattern or element mask. Causal and kv_stride alone keep the inline check
// (causal_hidden), which costs no barrier and no shared memory.
__device__ __forceinline__ bool uses_mask_tile(const detail::ForwardKernelParams& p) {
  return p.masked;
}

// The inline check of the plain path: past key_end, or after the query under causal.
__device__ __forceinline__ bool causal_hidden(const detail::ForwardKernelParams& p, int64_t query,
                                              int64_t key, int64_t key_end) {
  return key >= key_end || (p.causal && key * p.kv_stride > query);
}

// score + term, but exactly -inf for a hidden key (term -inf) even when the score is NaN or
// +inf, as the reference skips hidden keys altogether.
template <typename Acc>
__device__ __forceinline__ Acc masked_add(Acc score, Acc term) {
  return term == negative_infinity<Acc>() ? term : score + term;
}

// Writes the mask term (log2 domain: -inf, 0 or the additive value) of every pair of query rows
// [m_begin, m_begin + rows) (rows <= kRows) and logical keys [n_begin, n_begin + kKeys) into a
// shared tile, pair (row, key) at tile[row * kRowStride + key * kKeyStride]. The whole block calls
// it, between barriers; consecutive threads walk the tile's contiguous dimension. Done
// cooperatively and in a rolled loop on purpose: evaluated per element inside the kernels' unrolled
// score tiles, the window/pattern arithmetic and mask loads cost 50-60 registers.
template <typename Acc, int kRows, int kKeys, int kRowStride, int kKeyStride, int kThreads>
__device__ __forceinline__ void fill_mask_tile(Acc* tile, const detail::ForwardKernelParams& p,
                                               int64_t b, int64_t h, int64_t m_begin, int rows,
                                               int64_t n_begin, int64_t key_end) {
  static_assert(kRowStride == 1 || kKeyStride == 1, "one dimension of the tile is contiguous");
#pragma unroll 1
  for (int e = threadIdx.x; e < kRows * kKeys; e += kThreads) {
    const int row = kRowStride == 1 ? e % kRows : e / kKeys;
    const int key = kRowStride == 1 ? e / kRows : e % kKeys;
    // Rows past the block's valid queries are never read from the mask tensor.
    tile[row * kRowStride + key * kKeyStride] =
        row < rows
            ? masked_score<Acc>(p, p.policy, b, h, m_begin + row, n_begin + key, key_end, Acc(0))
            : negative_infinity<Acc>();
  }
}

// Skip / partial / full for logical keys [n_begin, n_begin + block_n) and query rows
// [m_begin, m_begin + rows): skip when the policy or the block map hides every pair; partial
// whenever an element mask is present, a key is past key_end, or the policy or the block map
// hides some pair.
__device__ __forceinline__ detail::BlockClass classify_key_block(
    const detail::ForwardKernelParams& p, const detail::MaskPolicy& policy, int64_t b, int64_t h,
    int64_t m_begin, int rows, int64_t n_begin, int block_n, int64_t key_end) {
  const int64_t n_last = min(n_begin + block_n, key_end) - 1;
  if (n_last < n_begin) return detail::BlockClass::kSkip;
  const detail::BlockClass structure = detail::classify_block(
      policy, m_begin, m_begin + rows, n_begin * p.kv_stride, n_last * p.kv_stride + 1);
  if (structure == detail::BlockClass::kSkip) return structure;
  detail::BlockClass map = detail::BlockClass::kFull;
  if (p.block_map != nullptr) {
    map = block_map_class(p, b, h, m_begin, m_begin + rows, n_begin * p.kv_stride,
                          n_last * p.kv_stride + 1);
    if (map == detail::BlockClass::kSkip) return map;
  }
  const bool partial = map == detail::BlockClass::kPartial ||
                       structure == detail::BlockClass::kPartial || p.mask != nullptr ||
                       n_begin + block_n > key_end;
  return partial ? detail::BlockClass::kPartial : detail::BlockClass::kFull;
}

}  // namespace samattn::simt
