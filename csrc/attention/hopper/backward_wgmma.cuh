// Internal: small warpgroup-GEMM and register helpers of the Hopper backward. The forward has its
// own copies in forward_kernel.cuh; they live in a separate namespace here so the two can be
// folded into one shared header later without a clash.
#pragma once

#include <cstdint>

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cutlass/numeric_types.h>
#include <cute/tensor.hpp>

namespace samattn::hopper::bwd {

// Accumulator fragment ((2, 2, N/8), M, 1) of a 64xN wgmma -> the A-operand fragment
// ((2, 2, 2), M, N/16) of a wgmma with K = N: the same registers regrouped, 16 columns per
// k-block (values are ordered column pair, row half, 8-column half in both).
template <typename AccLayout>
__device__ __forceinline__ auto accumulator_as_a_operand(AccLayout acc) {
  using namespace cute;
  auto values = logical_divide(get<0>(acc), Shape<Underscore, Underscore, _2>{});
  return make_layout(make_layout(get<0>(values), get<1>(values), get<2, 0>(values)), get<1>(acc),
                     get<2, 1>(values));
}

// Issues one warpgroup GEMM C (+)= A B over all k-blocks as one wgmma group and commits it; the
// caller waits (warpgroup_wait<n>) and then fences C (and a register A): a wgmma's register
// operands belong to the tensor cores until wgmma.wait_group returns, and the fences keep the
// compiler from touching them before. kAInRegisters: A is a register fragment, not shared-memory
// descriptors.
template <bool kZeroInit, bool kAInRegisters, typename TiledMma, typename TA, typename TB,
          typename TC>
__device__ __forceinline__ void issue_gemm(TiledMma& mma, TA&& a, TB&& b, TC& c) {
  using namespace cute;
  if constexpr (kAInRegisters) warpgroup_fence_operand(a);
  warpgroup_fence_operand(c);
  warpgroup_arrive();
  if constexpr (kZeroInit) mma.accumulate_ = GMMA::ScaleOut::Zero;
  CUTE_UNROLL
  for (int kb = 0; kb < size<2>(a); ++kb) {
    gemm(mma, a(_, _, kb), b(_, _, kb), c);
    mma.accumulate_ = GMMA::ScaleOut::One;
  }
  warpgroup_commit_batch();
}

__device__ __forceinline__ float fast_exp2(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
  return y;
}

// Two floats rounded to nearest into the operand type, packed as one 32-bit register (lo in
// the low half: the lower column).
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

// Rounds an fp32 accumulator fragment, times `scale`, pairwise into a 16-bit fragment with the
// same element order (the A operand of the next wgmma, or dK / dV for their store).
template <typename Element, typename TAcc, typename TOut>
__device__ __forceinline__ void convert_pairs(const TAcc& acc, TOut& out, float scale = 1.f) {
  uint32_t* pairs = reinterpret_cast<uint32_t*>(cute::raw_pointer_cast(out.data()));
  CUTE_UNROLL
  for (int i = 0; i < cute::size(acc) / 2; ++i) {
    pairs[i] = pack_pair<Element>(acc(2 * i) * scale, acc(2 * i + 1) * scale);
  }
}

// dst[0 .. bytes / 4) += src[...] in global memory, one bulk reduce-add from shared memory by the
// TMA unit (sm_90; bytes a multiple of 16, both addresses 16-byte aligned), committed as its own
// bulk async-group of the issuing thread. The caller has made src's generic stores visible to the
// async proxy (fence.proxy.async) and synchronised with the threads that wrote it.
__device__ __forceinline__ void bulk_reduce_add(float* dst, const void* src, uint32_t bytes) {
  const uint32_t src_shared = static_cast<uint32_t>(__cvta_generic_to_shared(src));
  asm volatile(
      "cp.reduce.async.bulk.global.shared::cta.bulk_group.add.f32 [%0], [%1], %2;\n"
      "cp.async.bulk.commit_group;\n" ::"l"(dst),
      "r"(src_shared), "r"(bytes)
      : "memory");
}

// Waits until every bulk async-group of this thread has finished reading its shared memory.
__device__ __forceinline__ void bulk_wait_read_all() {
  asm volatile("cp.async.bulk.wait_group.read 0;\n" ::: "memory");
}

// Waits until every bulk async-group of this thread has completed.
__device__ __forceinline__ void bulk_wait_all() {
  asm volatile("cp.async.bulk.wait_group 0;\n" ::: "memory");
}

}  // namespace samattn::hopper::bwd
