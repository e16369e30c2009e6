// Internal: host-side conversions between double and the 16-bit float formats, written out so
// the CPU reference does not depend on CUDA's host headers. Rounding is to nearest, ties to even.
#pragma once

#include <cstdint>
#include <cstring>
#include <vector>

#include "samattn/types.h"

namespace samattn::detail {

inline float bits_to_float(uint32_t bits) {
  float value;
  std::memcpy(&value, &bits, sizeof(value));
  return value;
}

inline uint32_t float_to_bits(float value) {
  uint32_t bits;
  std::memcpy(&bits, &value, sizeof(bits));
  return bits;
}

inline double bfloat16_to_double(uint16_t bits) {
  return bits_to_float(static_cast<uint32_t>(bits) << 16);
}

inline uint16_t double_to_bfloat16(double value) {
  const uint32_t bits = float_to_bits(static_cast<float>(value));
  if ((bits & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((bits >> 16) | 0x40u);
  const uint32_t rounding = 0x7fffu + ((bits >> 16) & 1u);
  return static_cast<uint16_t>((bits + rounding) >> 16);
}

inline double float16_to_double(uint16_t bits) {
  const uint32_t sign = (bits >> 15) & 1u;
  const uint32_t exponent = (bits >> 10) & 0x1fu;
  const uint32_t mantissa = bits & 0x3ffu;
  double magnitude;
  if (exponent == 0) {
    magnitude = mantissa * (1.0 / (1 << 24));  // subnormal: mantissa * 2^-24
  } else if (exponent == 31) {
    magnitude = mantissa ? __builtin_nan("") : __builtin_inf();
  } else {
    magnitude = (1.0 + mantissa / 1024.0) * static_cast<double>(1ull << exponent) / (1 << 15);
  }
  return sign ? -magnitude : magnitude;
}

inline uint16_t double_to_float16(double value) {
  const uint32_t bits = float_to_bits(static_cast<float>(value));
  const uint32_t sign = (bits >> 16) & 0x8000u;
  const uint32_t abs_bits = bits & 0x7fffffffu;
  if (abs_bits > 0x7f800000u) return static_cast<uint16_t>(sign | 0x7e00u);   // NaN
  if (abs_bits >= 0x477ff000u) return static_cast<uint16_t>(sign | 0x7c00u);  // rounds to inf
  if (abs_bits < 0x38800000u) {
    // Result is subnormal (or zero) in half precision: round |x| / 2^-24 to an integer.
    const float scaled = bits_to_float(abs_bits) * 16777216.0f;  // exact: power of two
    const uint32_t truncated = static_cast<uint32_t>(scaled);
    const float remainder = scaled - static_cast<float>(truncated);
    uint32_t rounded = truncated;
    if (remainder > 0.5f || (remainder == 0.5f && (truncated & 1u))) ++rounded;
    return static_cast<uint16_t>(sign | rounded);
  }
  // Normal: rebias the exponent (127 -> 15) and round the 23-bit mantissa to 10 bits.
  const uint32_t rebased = abs_bits - (112u << 23);
  const uint32_t rounding = 0xfffu + ((rebased >> 13) & 1u);
  return static_cast<uint16_t>(sign | ((rebased + rounding) >> 13));
}

// Element `offset` of a host array of `dtype`, exactly, as double.
inline double load_as_double(const void* base, int64_t offset, DType dtype) {
  switch (dtype) {
    case DType::kFloat64:
      return static_cast<const double*>(base)[offset];
    case DType::kFloat32:
      return static_cast<const float*>(base)[offset];
    case DType::kFloat16:
      return float16_to_double(static_cast<const uint16_t*>(base)[offset]);
    case DType::kBFloat16:
      return bfloat16_to_double(static_cast<const uint16_t*>(base)[offset]);
  }
  return 0.0;
}

// `rows` rows of `cols` elements of a host array of `dtype`, the first at element `first`, rows
// `row_stride` and columns `col_stride` elements apart, as contiguous doubles (row-major). The
// references convert their operands once this way rather than per product: loading and
// converting each element inside the dot products took most of their time. The conversion is
// exact, so sums over the result equal those over the loads.
inline std::vector<double> rows_as_double(const void* base, DType dtype, int64_t first,
                                          int64_t row_stride, int64_t rows, int64_t cols,
                                          int64_t col_stride = 1) {
  std::vector<double> out(static_cast<size_t>(rows * cols));
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t c = 0; c < cols; ++c) {
      out[r * cols + c] = load_as_double(base, first + r * row_stride + c * col_stride, dtype);
    }
  }
  return out;
}

// Stores `value` rounded to `dtype` (to nearest, ties to even) at element `offset`.
inline void store_from_double(void* base, int64_t offset, DType dtype, double value) {
  switch (dtype) {
    case DType::kFloat64:
      static_cast<double*>(base)[offset] = value;
      break;
    case DType::kFloat32:
      static_cast<float*>(base)[offset] = static_cast<float>(value);
      break;
    case DType::kFloat16:
      static_cast<uint16_t*>(base)[offset] = double_to_float16(value);
      break;
    case DType::kBFloat16:
      static_cast<uint16_t*>(base)[offset] = double_to_bfloat16(value);
      break;
  }
}

}  // namespace samattn::detail
