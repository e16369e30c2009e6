// Element types and tensor layouts shared by every samattn entry point.
#pragma once

#include <cstdint>

namespace samattn {

enum class DType : int { kFloat64, kFloat32, kFloat16, kBFloat16 };

const char* dtype_name(DType dtype);

// Size in bytes of one element of `dtype`.
int dtype_size(DType dtype);

// Strides, in elements, of a 4-D (batch, head, seq, dim) tensor whose last dimension is
// contiguous. Any of them may be zero or negative (broadcast or reversed views).
struct Strides {
  int64_t batch = 0;
  int64_t head = 0;
  int64_t seq = 0;
};

}  // namespace samattn
