// Internal: small device helpers shared by the Hopper (sm_90a) attention kernels: warpgroup GEMMs
// on CuTe tiled MMAs, reusing an accumulator as the next GEMM's A operand, packing fp32 pairs into
// 16-bit operands, exp2 on the MUFU, quad reductions over an accumulator row, and named barriers
// between warpgroups.
#pragma once

#include <cstdint>

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cutlass/numeric_types.h>
#include <cute/tensor.hpp>

namespace samattn::hopper {

// Accumulator fragment ((2, 2, N/8), M, 1) of a 64xN wgmma -> the A-operand fragment
// ((2, 2, 2), M, N/16) of the next wgmma with K = N: the same registers regrouped, 16 keys per
// k-block (values are ordered column pair, row half, 8-column half in both).
template <typename AccLayout>
CUTE_HOST_DEVICE auto accumulator_as_a_operand(AccLayout acc) {
  using namespace cute;
  auto values = logical_divide(get<0>(acc), Shape<Underscore, Underscore, _2>{});
  return make_layout(make_layout(get<0>(values), get<1>(values), get<2, 0>(values)), get<1>(acc),
                     get<2, 1>(values));
}

// Issues one warpgroup GEMM C (+)= A B over all k-blocks as one wgmma group. zero_init (a
// run-time value: the wgmma scale-d predicate) overwrites C instead of accumulating into it.
// With kWait the call also waits for the group; without, the caller waits (warpgroup_wait<n>)
// and then fences C (and a register A) with finish_operands. A wgmma's register operands belong
// to the tensor cores until wgmma.wait_group returns, and the fences keep the compiler from
// touching them before. kAInRegisters: A is a register fragment, not shared-memory descriptors.
template <bool kAInRegisters, bool kWait, typename TiledMma, typename TA, typename TB, typename TC>
__device__ __forceinline__ void warpgroup_gemm(TiledMma& mma, TA& a, const TB& b, TC& c,
                                               bool zero_init) {
  using namespace cute;
  if constexpr (kAInRegisters) warpgroup_fence_operand(a);
  warpgroup_fence_operand(c);
  warpgroup_arrive();
  mma.accumulate_ = zero_init ? GMMA::ScaleOut::Zero : GMMA::ScaleOut::One;
  CUTE_UNROLL
  for (int kb = 0; kb < size<2>(a); ++kb) {
    gemm(mma, a(_, _, kb), b(_, _, kb), c);
    mma.accumulate_ = GMMA::ScaleOut::One;
  }
  warpgroup_commit_batch();
  if constexpr (kWait) {
    cute::warpgroup_wait<0>();
    warpgroup_fence_operand(c);
    if constexpr (kAInRegisters) warpgroup_fence_operand(a);
  }
}

// After warpgroup_wait: the registers of C (and of a register A) are the program's again.
template <typename TC, typename... TA>
__device__ __forceinline__ void finish_operands(TC& c, TA&... a) {
  cute::warpgroup_fence_operand(c);
  (cute::warpgroup_fence_operand(a), ...);
}

__device__ __forceinline__ float fast_exp2(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
  return y;
}

// The four lanes of a quad hold one accumulator row between them.
__device__ __forceinline__ float quad_max(float value) {
  value = fmaxf(value, __shfl_xor_sync(0xffffffffu, value, 1));
  return fmaxf(value, __shfl_xor_sync(0xffffffffu, value, 2));
}

__device__ __forceinline__ float quad_sum(float value) {
  value += __shfl_xor_sync(0xffffffffu, value, 1);
  return value + __shfl_xor_sync(0xffffffffu, value, 2);
}

// Two floats rounded to nearest into the operand type, packed as one 32-bit register (lo in
// the low half: the lower column / key).
template <typename Element>
__device__ __forceinline__ uint32_t pack_pair(float lo, float hi) {
  if constexpr (cute::is_same_v<Element, cutlass::bfloat16_t>) {
    const __nv_bfloat162 pair = __floats2bfloat162_rn(lo, hi);
    return reinterpret_cast<const uint32_t&>(pair);
  } else {
    static_assert(cute::is_same_v<Element, cutlass::half_t>, "fp16 or bf16 operands");
    const __half2 pair = __floats2half2_rn(lo, hi);
    return reinterpret_cast<const uint32_t&>(pair);
  }
}

// Named barriers (bar.sync / bar.arrive) between warpgroups. Ids 1-15 are free for the caller to
// assign (0 is __syncthreads); `threads` counts every thread that syncs or arrives, a multiple
// of 32. Every thread of a warp must execute the same barrier instruction.
__device__ __forceinline__ void named_barrier_sync(int id, int threads) {
  asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
}

__device__ __forceinline__ void named_barrier_arrive(int id, int threads) {
  asm volatile("bar.arrive %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
}

}  // namespace samattn::hopper
