// Internal: pointer and stride arithmetic of the decompositions that run a call as views of its
// tensors (strided_pattern.h, key_split.h, varlen sequences).
#pragma once

#include <cstdint>

#include "samattn/attention.h"

namespace samattn::detail {

// `elements` of `element_bytes` past base; null stays null (absent optional tensors).
inline const void* advance(const void* base, int64_t elements, int element_bytes) {
  return base == nullptr ? nullptr : static_cast<const char*>(base) + elements * element_bytes;
}

inline void* advance(void* base, int64_t elements, int element_bytes) {
  return base == nullptr ? nullptr : static_cast<char*>(base) + elements * element_bytes;
}

// Bytes of one lse entry: the accumulation type (double for float64 inputs, float otherwise).
inline int lse_entry_bytes(DType dtype) { return dtype == DType::kFloat64 ? 8 : 4; }

// Bytes of one element mask entry.
inline int mask_entry_bytes(MaskDType dtype) {
  switch (dtype) {
    case MaskDType::kBool:
      return 1;
    case MaskDType::kFloat64:
      return 8;
    case MaskDType::kFloat32:
      return 4;
    case MaskDType::kFloat16:
    case MaskDType::kBFloat16:
      return 2;
  }
  return 1;
}

// Whether the (batch, head) pairs of q, k, v (and dout, for a backward) merge into one head
// index with one stride, so that a view can take every batch entry in one launch.
inline bool heads_merge(const AttentionParams& p, const Strides* dout = nullptr) {
  return p.batch == 1 || (p.q_strides.batch == p.heads_q * p.q_strides.head &&
                          p.k_strides.batch == p.heads_kv * p.k_strides.head &&
                          p.v_strides.batch == p.heads_kv * p.v_strides.head &&
                          (dout == nullptr || dout->batch == p.heads_q * dout->head));
}

}  // namespace samattn::detail
