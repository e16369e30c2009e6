// General matrix multiply and the row softmax: the C++ API (no torch).
//
//   C[l] = alpha * A[l] B[l] + beta * C[l]   for every batch index l,
//
// with A[l] of M x K, B[l] of K x N and C[l] of M x N, each addressed through element strides, so
// transposes and any leading dimension are strides rather than flags:
//   A[l](i, p) = a[l * a_batch_stride + i * a_row_stride + p * a_col_stride]  (B and C alike).
#pragma once

#include <cstdint>

#include <cuda_runtime_api.h>

#include "samattn/error.h"
#include "samattn/types.h"

namespace samattn {

// Which kernel family runs a GEMM. kAuto picks the fastest that supports the call: kSm90
// (sm_90a wgmma + TMA: float16/bfloat16, or float32 with allow_tf32 and both operands
// k-major; compute capability 9.0, TMA-aligned layouts), else kSm80 (mma.sync tensor cores,
// the same dtypes, any layout, compute capability 8.0+), else kSimt (CUDA cores, every dtype;
// float32 stays IEEE unless allow_tf32). Forcing kSm80 or kSm90 on a call or device they
// cannot run is an error; forcing kSimt always works.
enum class GemmBackend : int { kAuto, kSimt, kSm80, kSm90 };

// "auto", "simt", "sm80", "sm90".
const char* gemm_backend_name(GemmBackend backend);

struct GemmParams {
  const void* a = nullptr;
  const void* b = nullptr;
  // Read only when beta != 0: with beta == 0 C may hold anything (NaN included).
  void* c = nullptr;

  // A, B and C share `dtype`. float16/bfloat16 and float32 accumulate in float, float64 in
  // double; C is written in `dtype`.
  DType dtype = DType::kFloat32;
  int64_t m = 0, n = 0, k = 0;
  int64_t batch = 1;

  // Element strides, >= 0 (0 broadcasts A or B). C's strides must not make two of its
  // elements share an address.
  int64_t a_row_stride = 0, a_col_stride = 0, a_batch_stride = 0;
  int64_t b_row_stride = 0, b_col_stride = 0, b_batch_stride = 0;
  int64_t c_row_stride = 0, c_col_stride = 0, c_batch_stride = 0;

  double alpha = 1.0;
  double beta = 0.0;
  // float32 only: let tensor cores compute in TF32 (10-bit mantissa inputs). Off by default, so
  // float32 stays IEEE unless the caller opts in.
  bool allow_tf32 = false;
  GemmBackend backend = GemmBackend::kAuto;
};

// Row-major contiguous params for C = A B with A (M x K), B (K x N), C (M x N) (batch 1).
GemmParams make_row_major_gemm(DType dtype, const void* a, const void* b, void* c, int64_t m,
                               int64_t n, int64_t k);

// Checks every field without launching anything; a failed status names the field and the
// expected value, as gemm() would throw it. A forced kSm80/kSm90 backend is also checked
// against the current device and the layout (which needs a CUDA device).
Status can_implement_gemm(const GemmParams& params);

// Runs the GEMM on `stream` (device pointers). Throws samattn::Error on invalid parameters
// (before any launch) and on CUDA errors.
void gemm(const GemmParams& params, cudaStream_t stream);

// The kernel gemm() runs for `params` on the current device: "sm90_wgmma", "sm80_mma",
// "simt" or "simt_fp64" (for logs, tests and benchmarks). Throws as gemm() would.
const char* selected_gemm_kernel(const GemmParams& params);

// The fp64 CPU reference: host pointers, same parameters. Accumulates in double and rounds the
// result to `dtype` once.
void reference_gemm(const GemmParams& params);

// ---------------------------------------------------------------------------------------------
// Row softmax: out[l](i, j) = softmax_j(scale * in[l](i, j)) over the visible columns j of row
// i (all of them, or j <= i when causal: top-left aligned, as in attention). Hidden columns get
// 0. Columns are contiguous (stride 1); float16/bfloat16/float32 compute in float, float64 in
// double; the result is written in `dtype`.
struct SoftmaxParams {
  const void* in = nullptr;
  void* out = nullptr;
  DType dtype = DType::kFloat32;
  int64_t batch = 1, rows = 0, cols = 0;
  int64_t in_row_stride = 0, in_batch_stride = 0;
  int64_t out_row_stride = 0, out_batch_stride = 0;
  double scale = 1.0;
  bool causal = false;
};

Status can_implement_softmax(const SoftmaxParams& params);
void softmax(const SoftmaxParams& params, cudaStream_t stream);
void reference_softmax(const SoftmaxParams& params);

}  // namespace samattn
