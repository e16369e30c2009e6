// Internal: the launchers behind gemm() and softmax(), one per kernel family.
#pragma once

#include <cuda_runtime_api.h>

#include "samattn/gemm.h"

namespace samattn::detail {

// CUDA-core GEMM for every dtype and every stride pattern (float64 accumulates in double, the
// others in float). Always available.
void launch_simt_gemm(const GemmParams& params, cudaStream_t stream);

// True when the sm_90a wgmma/TMA kernels can run `params` on the current device: fp16/bf16 (or
// float32 with allow_tf32), C with a unit stride, A and B with a unit stride each, 16-byte
// aligned pointers and leading/batch strides. Defined only with SAMATTN_HAVE_SM90.
bool sm90_gemm_supports(const GemmParams& params);
// Runs a call that sm90_gemm_supports accepted.
void launch_sm90_gemm(const GemmParams& params, cudaStream_t stream);

void launch_softmax(const SoftmaxParams& params, cudaStream_t stream);

}  // namespace samattn::detail
