// Internal: the alignment rules of the vectorised (16-byte) and TMA load paths, shared by the
// dispatchers that decide whether a call can take them.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "samattn/types.h"

namespace samattn::detail {

enum class StrideRule {
  kVector16,  // 16-byte vector loads/stores: base and strides multiples of 16 bytes
  kTma,       // TMA descriptors: the same, and strides positive and below 2^40 bytes
};

// Checks a (batch, heads, rows, ...) tensor: its base pointer, and the strides of dimensions
// longer than 1 (a length-1 dimension is never stepped along). Returns "" or what is wrong,
// naming the tensor, the dimension and the stride.
std::string misalignment(const char* name, const void* pointer, const Strides& strides,
                         int64_t row_stride, int64_t batch, int64_t heads, int64_t rows,
                         int element_bytes, StrideRule rule = StrideRule::kVector16);

// "32, 64, 128" for error messages that list what is supported.
template <std::size_t N>
std::string comma_list(const int (&values)[N]) {
  std::string list;
  for (int v : values) list += (list.empty() ? "" : ", ") + std::to_string(v);
  return list;
}

}  // namespace samattn::detail
