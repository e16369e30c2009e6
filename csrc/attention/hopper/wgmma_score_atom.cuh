// Internal: the wgmma of S = Q K^T over 80-key blocks (head dims 192 and 256). CuTe has an
// m64n80k16 operation only among its extended shapes (every N that is a multiple of 8, behind
// CUTE_SM90_EXTENDED_MMA_SHAPES_ENABLED), which multiply the CPU time of parsing its headers
// by ~5 (6 s -> 34 s for forward_launch.cuh alone on this project's 2-core machine, nvcc 13.0).
// So that one instruction is written here in CuTe's form (an MMA operation and its traits); the
// kernels' SASS is byte for byte what CuTe's operation gave (stop 49, benchmarks/NOTES.md).
#pragma once

#include <cstdint>

#include <cutlass/numeric_types.h>
#include <cute/atom/mma_traits_sm90_gmma.hpp>

// In CuTe's namespace: its wgmma mma_unpack, which passes the accumulate flag, is found through
// the operation's namespace (argument-dependent lookup).
namespace cute::SM90::GMMA {

// wgmma.mma_async m64n80k16 with fp32 accumulators, A and B from shared memory (descriptors);
// Element is cutlass::half_t or cutlass::bfloat16_t.
template <class Element, Major tnspA, Major tnspB>
struct SamattnMma64x80x16F32SS {
  static_assert(cute::is_same_v<Element, cutlass::half_t> ||
                    cute::is_same_v<Element, cutlass::bfloat16_t>,
                "fp16 or bf16 operands");
  using DRegisters = void;
  using ARegisters = uint64_t[1];
  using BRegisters = uint64_t[1];
  using CRegisters = float[40];

  CUTE_HOST_DEVICE static void fma(uint64_t const& desc_a, uint64_t const& desc_b, float& d00,
                                   float& d01, float& d02, float& d03, float& d04, float& d05,
                                   float& d06, float& d07, float& d08, float& d09, float& d10,
                                   float& d11, float& d12, float& d13, float& d14, float& d15,
                                   float& d16, float& d17, float& d18, float& d19, float& d20,
                                   float& d21, float& d22, float& d23, float& d24, float& d25,
                                   float& d26, float& d27, float& d28, float& d29, float& d30,
                                   float& d31, float& d32, float& d33, float& d34, float& d35,
                                   float& d36, float& d37, float& d38, float& d39,
                                   ScaleOut const scale_d = ScaleOut::One) {
#if defined(CUTE_ARCH_MMA_SM90A_ENABLED)
// The 40 accumulators (read and written) and the two descriptors, the accumulate flag, the
// operands' scales (+1) and their majors; the instruction's element types differ by dtype.
#define SAMATTN_WGMMA_M64N80_OPERANDS                                                       \
  : "+f"(d00), "+f"(d01), "+f"(d02), "+f"(d03), "+f"(d04), "+f"(d05), "+f"(d06), "+f"(d07),       \
    "+f"(d08), "+f"(d09), "+f"(d10), "+f"(d11), "+f"(d12), "+f"(d13), "+f"(d14), "+f"(d15),       \
    "+f"(d16), "+f"(d17), "+f"(d18), "+f"(d19), "+f"(d20), "+f"(d21), "+f"(d22), "+f"(d23),       \
    "+f"(d24), "+f"(d25), "+f"(d26), "+f"(d27), "+f"(d28), "+f"(d29), "+f"(d30), "+f"(d31),       \
    "+f"(d32), "+f"(d33), "+f"(d34), "+f"(d35), "+f"(d36), "+f"(d37), "+f"(d38), "+f"(d39)        \
  : "l"(desc_a), "l"(desc_b), "r"(int32_t(scale_d)), "n"(int32_t(ScaleIn::One)),                 \
    "n"(int32_t(ScaleIn::One)), "n"(int32_t(tnspA)), "n"(int32_t(tnspB))
#define SAMATTN_WGMMA_M64N80_REGISTERS                                                          \
  "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, " \
  "%20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, "  \
  "%38, %39}, %40, %41, p, %43, %44, %45, %46;\n"
    if constexpr (cute::is_same_v<Element, cutlass::half_t>) {
      asm volatile(
          "{\n.reg .pred p;\nsetp.ne.b32 p, %42, 0;\n"
          "wgmma.mma_async.sync.aligned.m64n80k16.f32.f16.f16 " SAMATTN_WGMMA_M64N80_REGISTERS
          "}\n" SAMATTN_WGMMA_M64N80_OPERANDS);
    } else {
      asm volatile(
          "{\n.reg .pred p;\nsetp.ne.b32 p, %42, 0;\n"
          "wgmma.mma_async.sync.aligned.m64n80k16.f32.bf16.bf16 " SAMATTN_WGMMA_M64N80_REGISTERS
          "}\n" SAMATTN_WGMMA_M64N80_OPERANDS);
    }
#undef SAMATTN_WGMMA_M64N80_REGISTERS
#undef SAMATTN_WGMMA_M64N80_OPERANDS
#else
    CUTE_INVALID_CONTROL_PATH("wgmma m64n80k16 needs sm_90a");
#endif
  }
};

}  // namespace cute::SM90::GMMA

namespace cute {

template <class Element, SM90::GMMA::Major tnspA, SM90::GMMA::Major tnspB>
struct MMA_Traits<SM90::GMMA::SamattnMma64x80x16F32SS<Element, tnspA, tnspB>> {
  using ValTypeD = float;
  using ValTypeA = Element;
  using ValTypeB = Element;
  using ValTypeC = float;
  using FrgTypeA = SM90::GMMA::smem_desc<tnspA>;
  using FrgTypeB = SM90::GMMA::smem_desc<tnspB>;
  using Shape_MNK = Shape<_64, _80, _16>;
  using ThrID = Layout<_128>;
  using ALayout = SM90::GMMA::ABLayout<64, 16>;
  using BLayout = SM90::GMMA::ABLayout<80, 16>;
  using CLayout = SM90::GMMA::CLayout_64xN<80>;
  SM90::GMMA::ScaleOut accumulate_ = SM90::GMMA::ScaleOut::One;
};

}  // namespace cute

namespace samattn::hopper {

// S = Q K^T's wgmma operation for a kBlockN-key block: the operation above for 80 keys, CuTe's
// selector otherwise (both operands K-major).
template <class Element, int kBlockN, int kHeadDim>
constexpr auto score_mma_op() {
  if constexpr (kBlockN == 80) {
    return cute::SM90::GMMA::SamattnMma64x80x16F32SS<Element, cute::GMMA::Major::K,
                                                     cute::GMMA::Major::K>{};
  } else {
    return cute::GMMA::ss_op_selector<
        Element, Element, float, cute::Shape<cute::_64, cute::Int<kBlockN>, cute::Int<kHeadDim>>>();
  }
}

}  // namespace samattn::hopper
