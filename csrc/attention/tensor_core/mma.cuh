// Internal: inline-PTX wrappers for the sm80+ tensor-core path: cp.async, ldmatrix, mma.sync
// (fp16, bf16, tf32) and the fast exp2. Each wrapper is one instruction, so the kernel reads like
// the PTX it emits.
//
// Fragment layouts of mma.m16n8k16 (lane = threadIdx.x % 32, g = lane / 4, c = 2 * (lane % 4)):
//   A (16x16, row-major) a0:(g, c..c+1) a1:(g+8, c..c+1) a2:(g, c+8..c+9) a3:(g+8, c+8..c+9)
//   B (16x8, k x n)      b0:(k = c..c+1, n = g)          b1:(k = c+8..c+9, n = g)
//   C (16x8, f32)        c0,c1:(g, c..c+1)               c2,c3:(g+8, c..c+1)
// Each 32-bit A/B register holds two 16-bit elements, the lower column (or k) in the low half.
#pragma once

#include <cstdint>

#include <cuda_bf16.h>
#include <cuda_fp16.h>

namespace samattn::tensor_core {

__device__ __forceinline__ uint32_t shared_address(const void* pointer) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(pointer));
}

// 16-byte global -> shared copy that bypasses L1. With `valid` false nothing is read and the
// destination is zero-filled (the source size operand is 0), which is how tile tails are padded.
__device__ __forceinline__ void cp_async_16(uint32_t dst, const void* src, bool valid) {
  const int src_bytes = valid ? 16 : 0;
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src),
               "r"(src_bytes));
}

// 4-byte global -> shared copy (through L1); with `valid` false the destination is zero-filled.
__device__ __forceinline__ void cp_async_4(uint32_t dst, const void* src, bool valid) {
  const int src_bytes = valid ? 4 : 0;
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(dst), "l"(src),
               "r"(src_bytes));
}

__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }

// Waits until at most kPending committed groups of this thread are still in flight.
template <int kPending>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(kPending) : "memory");
}

// Four 8x8 b16 matrices; lanes 8i..8i+7 give the row addresses of matrix i, which lands in r[i].
// `volatile` keeps shared-memory reads from being hoisted across __syncthreads.
__device__ __forceinline__ void ldmatrix_x4(uint32_t (&r)[4], uint32_t address) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(address));
}

// As ldmatrix_x4, each matrix transposed: reads a k-major (row = k) tile as a B fragment.
__device__ __forceinline__ void ldmatrix_x4_trans(uint32_t (&r)[4], uint32_t address) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(address));
}

// d += a * b on a 16x8x16 tile, f32 accumulators.
template <typename Element>
__device__ __forceinline__ void mma_m16n8k16(float (&d)[4], const uint32_t (&a)[4], uint32_t b0,
                                             uint32_t b1);

template <>
__device__ __forceinline__ void mma_m16n8k16<__half>(float (&d)[4], const uint32_t (&a)[4],
                                                     uint32_t b0, uint32_t b1) {
  asm("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 "
      "{%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

template <>
__device__ __forceinline__ void mma_m16n8k16<__nv_bfloat16>(float (&d)[4], const uint32_t (&a)[4],
                                                            uint32_t b0, uint32_t b1) {
  asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 "
      "{%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// d += a * b on a 16x8x8 tile of TF32 operands (fp32 bit patterns, see to_tf32), f32 accumulators.
// Fragments as for m16n8k16 with 32-bit elements, k halved (t = lane % 4):
//   A a0:(g, t) a1:(g+8, t) a2:(g, t+4) a3:(g+8, t+4)    B b0:(k = t, n = g) b1:(k = t+4, n = g)
__device__ __forceinline__ void mma_m16n8k8_tf32(float (&d)[4], const uint32_t (&a)[4], uint32_t b0,
                                                 uint32_t b1) {
  asm("mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 "
      "{%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// Rounds `x` to TF32 (10-bit mantissa), to nearest with ties away from zero, as the bit pattern
// mma expects; the tensor cores would otherwise truncate.
__device__ __forceinline__ uint32_t to_tf32(float x) {
  uint32_t y;
  asm("cvt.rna.tf32.f32 %0, %1;\n" : "=r"(y) : "f"(x));
  return y;
}

// Two floats rounded to nearest into one register of two 16-bit elements, `low` in bits 0..15.
template <typename Element>
__device__ __forceinline__ uint32_t pack(float low, float high);

template <>
__device__ __forceinline__ uint32_t pack<__half>(float low, float high) {
  const __half2 packed = __floats2half2_rn(low, high);
  return *reinterpret_cast<const uint32_t*>(&packed);
}

template <>
__device__ __forceinline__ uint32_t pack<__nv_bfloat16>(float low, float high) {
  const __nv_bfloat162 packed = __floats2bfloat162_rn(low, high);
  return *reinterpret_cast<const uint32_t*>(&packed);
}

// 2^x on the special-function unit (about 2 ulp); exp2(-inf) = 0 and NaN stays NaN.
__device__ __forceinline__ float fast_exp2(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
  return y;
}

}  // namespace samattn::tensor_core
