// Fused scaled-dot-product attention: the C++ API (no torch).
//
//   out[b, h, i, :] = sum_j softmax_j(scale * q[b, h, i, :] . k[b, g(h), j, :]) * v[b, g(h), j, :]
//
// over the keys j visible to query i, where g(h) = h / (heads_q / heads_kv) maps a query head to
// its key/value head (grouped-query attention).
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>

#include <cuda_runtime_api.h>

#include "samattn/error.h"
#include "samattn/mask.h"
#include "samattn/types.h"

namespace samattn {

// Which implementation runs a call. kAuto picks the fastest one that supports the call: kHopper
// (sm_90a wgmma + TMA, fp16/bf16, on compute capability 9.0 when the build has it), else
// kTensorCore (sm80+ mma.sync), else kSimt. The environment variable SAMATTN_FORCE_SIMT=1 makes
// every call run kSimt (a debugging switch).
enum class Backend : int { kAuto, kSimt, kTensorCore, kHopper };

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
  // Element mask, sliding window, Sparse Transformer pattern, variable-length batches
  // (samattn/mask.h). Combines with causal and kv_stride: a key is visible when all allow it.
  MaskOptions mask;

  Backend backend = Backend::kAuto;

  // Split-key attention (flash-decoding) for calls whose query blocks are too few to fill the GPU,
  // e.g. decoding against a long KV cache: chunks of keys run as separate thread blocks, whose fp32
  // results one more kernel merges. 1: never (the default); 0: when the call has fewer query blocks
  // than the device runs at once and enough keys to share; n > 1: about n chunks. Only
  // float16/bfloat16 calls that the tensor-core kernels can run split (on them, also under backend
  // auto on Hopper), without causal or mask options other than an element mask and a window's right
  // edge (bottom-right causal: new queries against a cache; padded batches' masks), and only with
  // the workspace below (without it the call runs as it would with 1); any other call runs as it
  // would with 1. Calls with at most 64 query rows per kv head (query heads per kv head x
  // seqlen_q), head dim 64, 96, 128, 192 or 256, kv_stride 1, no element mask but a key mask (the
  // same for every head and query: a padded batch's) run on a kernel shaped for decoding instead,
  // which also takes bottom-right causal and per-entry key lengths (mask.cache_seqlens, read on
  // the device) and with num_splits 0 also runs unsplit, without workspace, where the (batch, kv
  // head) pairs already fill the device.
  int64_t num_splits = 1;

  // attention_forward only: device scratch memory of attention_forward_workspace_bytes(params)
  // bytes, aligned to 256 bytes, owned by the caller. The Sparse Transformer patterns use it:
  // "strided" (its residue classes run as dense views whose fp32 output and lse are merged
  // into the band's softmax) and, on the Hopper forward, "fixed" (its summary columns are
  // gathered and run as one dense call, merged into the own blocks' softmax); without it both
  // still run, masking element by element on the tensor-core kernels. A split call (num_splits)
  // keeps its chunks' fp32 outputs and lse there; without it the call runs unsplit.
  void* workspace = nullptr;
};

inline constexpr int64_t kMaxHeadDim = 256;

// The scale used when `softmax_scale` is unset.
double default_softmax_scale(int64_t head_dim);

// Checks every field without launching anything. The message of a failed status names the
// field and the expected value; it is the message attention_forward would throw.
Status can_implement(const AttentionParams& params);

// Bytes of device workspace attention_forward can use for `params` (0 for most calls; see
// AttentionParams::workspace). Depends on the shapes, dtype and options and on the current
// device (whether the Hopper forward runs the call).
size_t attention_forward_workspace_bytes(const AttentionParams& params);

// Runs attention on `stream`. Pointers are device pointers. Throws samattn::Error on invalid
// parameters (before any launch) and on CUDA errors.
void attention_forward(const AttentionParams& params, cudaStream_t stream);

// The fp64 CPU reference: same parameters, host pointers. Accumulates in double, writes `out`
// in params.dtype and `lse` in the accumulation type.
void reference_attention_forward(const AttentionParams& params);

// The backend that runs `params` on the current device (resolves kAuto), for logs and tests. A
// call that num_splits splits says kTensorCore, the kernels of its chunks when the workspace is
// given.
Backend select_backend(const AttentionParams& params);

// select_backend's name, and for a call that num_splits splits which kernel runs its chunks and
// how many (given the workspace): e.g. "tensor_core: decoding kernel, 32 key chunks". For logs
// and benchmarks; the wording may change.
std::string describe_forward(const AttentionParams& params);

// ---------------------------------------------------------------------------------------------
// Backward: the gradients of a scalar loss with respect to q, k and v, given dout = dL/dout.
//
//   P = softmax(scale * q k^T) over the visible keys, D_i = dout_i . out_i,
//   dv = P^T dout,  dS = P * (dout v^T - D),  dq = scale * dS k,  dk = scale * dS^T q,
//
// with dk and dv summed over the query heads of each group (grouped-query attention). Keys that
// no query sees (rows j with j % kv_stride != 0, and keys hidden by the causal mask from every
// query) get zero gradients, and so do query rows that see no key; every element of dq, dk and
// dv is written.
struct AttentionBackwardParams {
  // The forward problem: shapes, strides, dtype and options, plus q, k, v, out and lse. out and
  // lse are those the forward wrote (lse is required by attention_backward; the reference
  // recomputes the probabilities and ignores it). D is computed from `out` as given.
  // forward.backend also picks the backward's kernels: kAuto runs the Hopper backward (sm_90a
  // wgmma + TMA) for float16/bfloat16 with equal head dims of 64, 96, 128, 192 or 256 on compute
  // capability 9.0 (no mask options), else the tensor-core backward for float16/bfloat16 on
  // sm80+ with equal head dims of 32, 64, 96, 128, 192 or 256 (16-byte aligned pointers and
  // strides; with mask options and varlen, its masked kernels), else the SIMT kernels; kSimt (or
  // SAMATTN_FORCE_SIMT=1) forces SIMT; kHopper and kTensorCore throw, naming the reason, when
  // that backward cannot run. select_backward_backend() reports the choice.
  AttentionParams forward;

  // dL/dout, (B, Hq, Sq, Dv) in forward.dtype, last dimension contiguous.
  const void* dout = nullptr;
  Strides dout_strides;
  // Outputs in forward.dtype, shaped like q, k and v; last dimension contiguous.
  void* dq = nullptr;
  void* dk = nullptr;
  void* dv = nullptr;
  Strides dq_strides, dk_strides, dv_strides;

  // Device scratch memory of attention_backward_workspace_bytes(params) bytes (may be null when
  // that is zero), aligned to 256 bytes, owned by the caller, so callers with a caching
  // allocator keep allocations out of the library. Only used during the call.
  void* workspace = nullptr;

  // Requests bit-identical results from run to run. The SIMT backward uses no atomics and is
  // always deterministic. The tensor-core and Hopper backwards sum dK and dV in a fixed order,
  // but by default (false, as in FlashAttention-2) add each key block's share of dQ into an fp32
  // workspace with atomics, whose order varies (dq can differ in the last bits between runs);
  // true runs a separate dQ kernel (the tensor-core backward's, on both paths) that recomputes
  // the probabilities per query block instead (no atomics, no dQ workspace, about one more
  // forward's worth of work).
  bool deterministic = false;
};

// The backend attention_backward runs for `params` on the current device (resolves kAuto; kSimt,
// kTensorCore or kHopper), for logs and tests. Throws samattn::Error, naming the reason, where
// forward.backend forces a backward that cannot run the call.
Backend select_backward_backend(const AttentionBackwardParams& params);

// Bytes of device workspace attention_backward needs for `params` (0 when there is nothing to
// compute): D (one value per query row) and, when the tensor-core or Hopper backward may run
// with deterministic = false, their fp32 dQ accumulator (batch * heads_q * seqlen_q * head_dim
// floats; where backend kAuto or kHopper may take the Hopper backward, seqlen_q rounded up to
// whole 64- or 128-row blocks).
// Depends only on the shapes, dtype, backend and deterministic (not on the device).
size_t attention_backward_workspace_bytes(const AttentionBackwardParams& params);

// Checks every field, including the workspace, without launching anything; the message of a
// failed status names the field, as attention_backward would throw it.
Status can_implement_backward(const AttentionBackwardParams& params);

// Computes dq, dk and dv on `stream`: the Hopper or tensor-core kernels for float16/bfloat16
// where they apply (see forward.backend), else the CUDA-core (SIMT) kernels, for every dtype
// (float16, bfloat16 and float32 accumulate in float, float64 in double). Pointers are device
// pointers. Throws samattn::Error on invalid parameters (before any launch) and CUDA errors.
void attention_backward(const AttentionBackwardParams& params, cudaStream_t stream);

// The fp64 CPU reference of the backward: host pointers, same parameters (lse and workspace are
// not used). Recomputes the probabilities in double from q and k, writes dq, dk, dv in dtype.
void reference_attention_backward(const AttentionBackwardParams& params);

}  // namespace samattn
