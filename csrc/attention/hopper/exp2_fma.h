// Internal: 2^x on the FMA pipe, for the share of a softmax block's exponentials that relieves the
// MUFU (an SM does 16 ex2 per clock against 128 FMAs). Host and device, so the CPU tests check
// the same arithmetic the kernel runs.
//
// x = j + f with j = round(x): adding 1.5 * 2^23 leaves j in the low mantissa bits; f in
// [-0.5, 0.5]; 2^f by a degree-5 polynomial fitted for relative error (below 1.6e-7 in fp32,
// about ex2.approx's; exactly 1 at f = 0); 2^j added into the exponent field. Meant for x <= 0
// (scores minus their row max): x below -125 clamps to 2^-125 (a row's sum holds its max's 1, so
// the difference to 0 is far below fp32 resolution), and NaN stays NaN.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>

#if defined(__CUDACC__)
#define SAMATTN_EXP2_FMA_QUALIFIERS __host__ __device__ __forceinline__
#else
#define SAMATTN_EXP2_FMA_QUALIFIERS inline
#endif

namespace samattn::hopper {

SAMATTN_EXP2_FMA_QUALIFIERS float exp2_on_fma(float x) {
  constexpr float kRoundToInteger = 12582912.f;  // 1.5 * 2^23
  x = x < -125.f ? -125.f : x;                   // the compare is false for NaN
#if defined(__CUDA_ARCH__)
  // The _rn intrinsics are never contracted into an FMA or reassociated away.
  const float shifted = __fadd_rn(x, kRoundToInteger);
  const float f = __fsub_rn(x, __fsub_rn(shifted, kRoundToInteger));
#else
  volatile float shifted_store = x + kRoundToInteger;  // kept apart from the subtraction
  const float shifted = shifted_store;
  const float f = x - (shifted - kRoundToInteger);
#endif
  float p = 1.321946038e-03f;
  p = fmaf(p, f, 9.671699256e-03f);
  p = fmaf(p, f, 5.550890043e-02f);
  p = fmaf(p, f, 2.402223796e-01f);
  p = fmaf(p, f, 6.931468844e-01f);
  p = fmaf(p, f, 1.f);
  uint32_t p_bits, shifted_bits;
  std::memcpy(&p_bits, &p, sizeof(p));
  std::memcpy(&shifted_bits, &shifted, sizeof(shifted));
  const uint32_t bits = p_bits + (shifted_bits << 23);  // j's two's-complement low bits
  float result;
  std::memcpy(&result, &bits, sizeof(result));
  return result;
}

}  // namespace samattn::hopper

#undef SAMATTN_EXP2_FMA_QUALIFIERS
