// Internal: element conversions and math used by the SIMT kernels, overloaded per type so the
// kernels stay generic over double, float, half and bfloat16.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

namespace samattn::simt {

template <typename Element>
struct AccumulatorOf {
  using type = float;
};
template <>
struct AccumulatorOf<double> {
  using type = double;
};

__device__ __forceinline__ double widen(double x) { return x; }
__device__ __forceinline__ float widen(float x) { return x; }
__device__ __forceinline__ float widen(__half x) { return __half2float(x); }
__device__ __forceinline__ float widen(__nv_bfloat16 x) { return __bfloat162float(x); }

template <typename Element>
__device__ __forceinline__ Element narrow(float x);
template <>
__device__ __forceinline__ float narrow<float>(float x) {
  return x;
}
template <>
__device__ __forceinline__ __half narrow<__half>(float x) {
  return __float2half_rn(x);
}
template <>
__device__ __forceinline__ __nv_bfloat16 narrow<__nv_bfloat16>(float x) {
  return __float2bfloat16_rn(x);
}
template <typename Element>
__device__ __forceinline__ Element narrow(double x) {
  return x;
}

__device__ __forceinline__ float exp2_acc(float x) { return exp2f(x); }
__device__ __forceinline__ double exp2_acc(double x) { return exp2(x); }
__device__ __forceinline__ float log2_acc(float x) { return log2f(x); }
__device__ __forceinline__ double log2_acc(double x) { return log2(x); }

template <typename T>
__device__ __forceinline__ T negative_infinity() {
  return -static_cast<T>(INFINITY);
}

// Loads N consecutive shared-memory values with the widest aligned vector accesses.
// The caller guarantees `src` is aligned to the full width (16 bytes, or 8 for 8-byte loads).
template <typename T, int N>
__device__ __forceinline__ void load_vector(T (&dst)[N], const T* src) {
  constexpr int kBytes = N * int(sizeof(T));
  if constexpr (kBytes % 16 == 0) {
#pragma unroll
    for (int i = 0; i < kBytes / 16; ++i) {
      reinterpret_cast<uint4*>(dst)[i] = reinterpret_cast<const uint4*>(src)[i];
    }
  } else if constexpr (kBytes % 8 == 0) {
#pragma unroll
    for (int i = 0; i < kBytes / 8; ++i) {
      reinterpret_cast<uint2*>(dst)[i] = reinterpret_cast<const uint2*>(src)[i];
    }
  } else {
#pragma unroll
    for (int i = 0; i < N; ++i) dst[i] = src[i];
  }
}

// Reduction over the 16 lanes of a half-warp that share a row.
template <typename T>
__device__ __forceinline__ T half_warp_max(T value) {
#pragma unroll
  for (int offset = 8; offset > 0; offset /= 2) {
    value = max(value, __shfl_xor_sync(0xffffffffu, value, offset));
  }
  return value;
}

template <typename T>
__device__ __forceinline__ T half_warp_sum(T value) {
#pragma unroll
  for (int offset = 8; offset > 0; offset /= 2) {
    value += __shfl_xor_sync(0xffffffffu, value, offset);
  }
  return value;
}

}  // namespace samattn::simt
