// Fused scaled-dot-product attention: the C++ API (no torch).
//
//   out[b, h, i, :] = sum_j softmax_j(scale * q[b, h, i, :] . k[b, g(h), j, :]) * v[b, g(h), j, :]
//
// over the keys j visible to query i, where g(h) = h / (heads_q / heads_kv) maps a query head to
// its key/value head (grouped-query attention).
#pragma once

#include <cstdint>
#include <optional>

#include <cuda_runtime_api.h>

#include "samattn/error.h"
#include "samattn/types.h"

namespace samattn {

// Which implementation runs a call. kAuto picks the fastest one that supports the call. The
// environment variable SAMATTN_FORCE_SIMT=1 makes every call run kSimt (a debugging switch).
enum class Backend : int { kAuto, kSimt, kTensorCore };

const char* backend_name(Backend backend);

struct AttentionParams {
  // Inputs (B, Hq, Sq, D), (B, Hkv, Sk, D), (B, Hkv, Sk, Dv); output (B, Hq, Sq, Dv).
  // All four share `dtype`; the last dimension of each must be contiguous.
  const void* q = nullptr;
  const void* k = nullptr;
  const void* v = nullptr;
  void* out = nullptr;
  // Optional natural-log log-sum-exp of each row's scaled scores, contiguous (B, Hq, Sq).
  // Its type is the accumulation type: double for kFloat64 inputs, float otherwise.
  // A row that sees no key gets -inf (and an output row of zeros).
  void* lse = nullptr;

  DType dtype = DType::kFloat32;
  int64_t batch = 0;
  int64_t heads_q = 0;
  int64_t heads_kv = 0;
  int64_t seqlen_q = 0;
  int64_t seqlen_k = 0;
  int64_t head_dim = 0;
  int64_t head_dim_v = 0;
  Strides q_strides, k_strides, v_strides, out_strides;

  // Multiplies q.k before the softmax; unset means 1 / sqrt(head_dim).
  std::optional<double> softmax_scale;
  // SDPA semantics (top-left aligned): query i sees keys j <= i.
  bool causal = false;
  // Strided attention: query i sees only keys j with j % kv_stride == 0.
  int64_t kv_stride = 1;
  // float32 inputs only: let tensor cores compute in TF32 (10-bit mantissa). Off by default, so
  // float32 stays IEEE unless the caller opts in.
  bool allow_tf32 = false;

  Backend backend = Backend::kAuto;
};

inline constexpr int64_t kMaxHeadDim = 256;

// The scale used when `softmax_scale` is unset.
double default_softmax_scale(int64_t head_dim);

// Checks every field without launching anything. The message of a failed status names the
// field and the expected value; it is the message attention_forward would throw.
Status can_implement(const AttentionParams& params);

// Runs attention on `stream`. Pointers are device pointers. Throws samattn::Error on invalid
// parameters (before any launch) and on CUDA errors.
void attention_forward(const AttentionParams& params, cudaStream_t stream);

// The fp64 CPU reference: same parameters, host pointers. Accumulates in double, writes `out`
// in params.dtype and `lse` in the accumulation type.
void reference_attention_forward(const AttentionParams& params);

// The backend that runs `params` on the current device (resolves kAuto), for logs and tests.
Backend select_backend(const AttentionParams& params);

}  // namespace samattn
