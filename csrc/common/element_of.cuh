// Internal: the CUDA element type of each samattn::DType, for the launchers that turn a run-time
// dtype into a kernel template argument.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "samattn/types.h"

namespace samattn::detail {

template <DType kDType>
struct ElementOf;
template <>
struct ElementOf<DType::kFloat64> {
  using type = double;
};
template <>
struct ElementOf<DType::kFloat32> {
  using type = float;
};
template <>
struct ElementOf<DType::kFloat16> {
  using type = __half;
};
template <>
struct ElementOf<DType::kBFloat16> {
  using type = __nv_bfloat16;
};

}  // namespace samattn::detail
