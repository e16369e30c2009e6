// Internal: a block-wide barrier whose arrival and wait are two calls (an mbarrier), so a thread
// can do independent work between announcing that its shared-memory stores are done and waiting
// for everyone else's. __syncthreads cannot be split: a thread arrives and waits in one step.
#pragma once

#include <cstdint>

#include "attention/tensor_core/mma.cuh"

namespace samattn::detail::simt {

// Every thread of the block calls arrive() then wait() once per phase, in the same order; the
// phases alternate parity 0, 1, 0, ... from init(). Arrival releases and the wait acquires, so
// shared-memory accesses before a thread's arrive() are visible to (and ordered before) those
// after every thread's wait(). Below sm_80 (no mbarrier) wait() is __syncthreads().
class SliceBarrier {
 public:
  __device__ explicit SliceBarrier(uint64_t* barrier)
      : address_(tensor_core::shared_address(barrier)) {}

  // One thread; a __syncthreads() must follow before any arrive().
  __device__ void init(int threads) const {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    asm volatile("mbarrier.init.shared.b64 [%0], %1;\n" ::"r"(address_), "r"(threads) : "memory");
#endif
  }

  __device__ __forceinline__ void arrive() const {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    asm volatile(
        "{\n"
        ".reg .b64 state;\n"
        "mbarrier.arrive.shared.b64 state, [%0];\n"
        "}\n" ::"r"(address_)
        : "memory");
#endif
  }

  __device__ __forceinline__ void wait(uint32_t parity) const {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile(
        "{\n"
        ".reg .pred done;\n"
        "retry:\n"
        "mbarrier.try_wait.parity.shared::cta.b64 done, [%0], %1;\n"
        "@!done bra retry;\n"
        "}\n" ::"r"(address_),
        "r"(parity)
        : "memory");
#elif defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    asm volatile(
        "{\n"
        ".reg .pred done;\n"
        "retry:\n"
        "mbarrier.test_wait.parity.shared.b64 done, [%0], %1;\n"
        "@!done bra retry;\n"
        "}\n" ::"r"(address_),
        "r"(parity)
        : "memory");
#else
    (void)parity;
    __syncthreads();
#endif
  }

 private:
  uint32_t address_;
};

}  // namespace samattn::detail::simt
