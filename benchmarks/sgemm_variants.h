// The fp32 SGEMM tile configurations measured by bench_gemm --sgemm-variants.
#pragma once

#include <cuda_runtime_api.h>

#include "samattn/gemm.h"

struct SgemmVariant {
  const char* name;
  void (*run)(const samattn::GemmParams& params, cudaStream_t stream);
};

extern const SgemmVariant kSgemmVariants[];
extern const int kSgemmVariantCount;
