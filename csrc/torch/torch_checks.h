// Internal: the torch binding's checks. Each raises a torch ValueError/TypeError whose message
// is built by samattn's formatter (common/check.h explains why no iostreams): c10 passes a ready
// std::string through untouched.
#pragma once

#include <string>

#include <ATen/core/Tensor.h>
#include <c10/util/Exception.h>

#include "common/check.h"
#include "samattn/types.h"

#define SAMATTN_CHECK_VALUE(cond, ...) \
  TORCH_CHECK_VALUE(cond, ::samattn::detail::concat("samattn: ", __VA_ARGS__))
#define SAMATTN_CHECK_TYPE(cond, ...) \
  TORCH_CHECK_TYPE(cond, ::samattn::detail::concat("samattn: ", __VA_ARGS__))

namespace samattn::torch_ops {

// "[2, 8, 64]" for messages about shapes and strides.
std::string shape_list(at::IntArrayRef values);

// The samattn dtype of a float64/float32/float16/bfloat16 tensor; a TypeError naming `arg`
// otherwise.
DType to_dtype(at::ScalarType type, const char* arg);

}  // namespace samattn::torch_ops
