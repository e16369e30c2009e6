// Internal: the sm_90a GEMM instantiations (no CUTLASS here, so the dispatcher compiles fast).
// Each is defined in its own generated translation unit (gemm_sm90_instance.cu.in).
#pragma once

#include <cuda_runtime_api.h>

#include "samattn/gemm.h"

namespace samattn::detail::sm90 {

// Problems normalised to a row-major C; kAKMajor: A has a unit column (k) stride, else a unit
// row stride; kBKMajor: B has a unit row (k) stride, else a unit column stride.
template <DType kDType, bool kAKMajor, bool kBKMajor>
bool can_run(const GemmParams& p);
template <DType kDType, bool kAKMajor, bool kBKMajor>
void run(const GemmParams& p, cudaStream_t stream);

#define SAMATTN_SM90_GEMM_DECLARE(DTYPE, AK, BK)           \
  template <>                                              \
  bool can_run<DType::DTYPE, AK, BK>(const GemmParams& p); \
  template <>                                              \
  void run<DType::DTYPE, AK, BK>(const GemmParams& p, cudaStream_t stream);
SAMATTN_SM90_GEMM_DECLARE(kFloat16, true, true)
SAMATTN_SM90_GEMM_DECLARE(kFloat16, true, false)
SAMATTN_SM90_GEMM_DECLARE(kFloat16, false, true)
SAMATTN_SM90_GEMM_DECLARE(kFloat16, false, false)
SAMATTN_SM90_GEMM_DECLARE(kBFloat16, true, true)
SAMATTN_SM90_GEMM_DECLARE(kBFloat16, true, false)
SAMATTN_SM90_GEMM_DECLARE(kBFloat16, false, true)
SAMATTN_SM90_GEMM_DECLARE(kBFloat16, false, false)
// TF32 wgmma reads both operands k-major from shared memory: one instantiation.
SAMATTN_SM90_GEMM_DECLARE(kFloat32, true, true)
#undef SAMATTN_SM90_GEMM_DECLARE

}  // namespace samattn::detail::sm90
