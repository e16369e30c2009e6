// Internal: the launchers behind gemm() and softmax(), one per kernel family.
#pragma once

#include <cstdint>

#include <cuda_runtime_api.h>

#include "samattn/gemm.h"

namespace samattn::detail {

// CUDA-core GEMM for every dtype and every stride pattern (float64 accumulates in double, the
// others in float; float32 runs the SGEMM of csrc/gemm/simt where it fits). Always available.
void launch_simt_gemm(const GemmParams& params, cudaStream_t stream);

// True when the sm_90a wgmma/TMA kernels can run `params` on the current device: fp16/bf16 (or
// float32 with allow_tf32), C with a unit stride, A and B with a unit stride each, 16-byte
// aligned pointers and leading/batch strides. Defined only with SAMATTN_HAVE_SM90.
bool sm90_gemm_supports(const GemmParams& params);
// Runs a call that sm90_gemm_supports accepted.
void launch_sm90_gemm(const GemmParams& params, cudaStream_t stream);

// True when the sm80 mma.sync kernel can run `params` (float16/bfloat16, or float32 with
// allow_tf32; any strides; m, n, k < 2^31; at most 65535 batches), whatever the device.
bool sm80_gemm_supports(const GemmParams& params);
// Runs a call that sm80_gemm_supports accepted (compute capability 8.0+).
void launch_sm80_gemm(const GemmParams& params, cudaStream_t stream);

// The CUDA-core float32 SGEMM (csrc/gemm/simt): runs float32 calls inside its size limits.
void launch_sgemm(const GemmParams& params, cudaStream_t stream);

// Whether a forced kSm80/kSm90 backend can run `params` on the current device (success for
// kAuto and kSimt); the message names the backend and what it needs.
Status forced_gemm_backend_status(const GemmParams& params);

void launch_softmax(const SoftmaxParams& params, cudaStream_t stream);

// C^T = B^T A^T: the same product with A and B swapped and C transposed.
GemmParams transposed_problem(const GemmParams& params);
// `params`, transposed when C's row stride is the smaller one, so that C's column stride is
// (where C has a unit stride) 1 and the epilogue writes along rows.
GemmParams with_row_major_c(const GemmParams& params);
// True when an mn x k operand with these element strides is best read along mn (its mn stride
// is 1, or the smaller one); a dimension of size 1 is never the one walked along.
bool walk_along_mn(int64_t mn, int64_t k, int64_t mn_stride, int64_t k_stride);

}  // namespace samattn::detail
