// Internal: checks torch tensors and turns them into samattn::AttentionParams. Every failed check
// raises before anything is allocated or launched and names the argument.
#pragma once

#include <optional>
#include <string_view>

#include <ATen/core/Tensor.h>

#include "samattn/attention.h"

namespace samattn::torch_ops {

struct ForwardOptions {
  std::optional<double> scale;
  bool causal = false;
  int64_t kv_stride = 1;
  std::string_view backend = "auto";
};

// Validates the tensors query, key and value and fills everything but the out and lse pointers;
// the scalar options are checked by check_params once the output is bound.
AttentionParams make_forward_params(const at::Tensor& query, const at::Tensor& key,
                                    const at::Tensor& value, const ForwardOptions& options);

// Validates a caller-provided output (or, named `arg`, another (B, Hq, Sq, Dv) tensor such as
// dout) against the params' shape, dtype and device.
void check_output(const at::Tensor& out, const at::Tensor& query, const AttentionParams& params,
                  const char* arg = "out");

// Validates the forward's log-sum-exp: contiguous (B, Hq, Sq) in lse_dtype, on query's device.
void check_lse(const at::Tensor& lse, const at::Tensor& query, const AttentionParams& params);

void set_output(AttentionParams& params, const at::Tensor& out);

// Binds a backward problem: the forward problem with out and lse bound, dout, and the gradients
// (same shapes as query, key and value), all already checked.
AttentionBackwardParams make_backward_params(const AttentionParams& forward, const at::Tensor& dout,
                                             const at::Tensor& dq, const at::Tensor& dk,
                                             const at::Tensor& dv);

// The mask options of the torch ops (samattn/mask.h): an optional attn_mask tensor broadcastable
// to (B, Hq, Sq, Sk), the window and a Sparse Transformer pattern by name ('none', 'strided',
// 'fixed'). Checks the tensor (dtype, device, broadcastable shape) and binds it to params.mask.
struct MaskArguments {
  const std::optional<at::Tensor>& attn_mask;
  int64_t window_left = -1;
  int64_t window_right = -1;
  std::string_view sparse_pattern = "none";
  int64_t sparse_block = 0;
  int64_t sparse_summary = 0;
  // Block-sparse: a bool/uint8 (B|1, H|1, ceil(Sq / block_q), ceil(Sk / block_k)) map.
  const std::optional<at::Tensor>* block_map = nullptr;
  int64_t block_q = 128;
  int64_t block_k = 128;
  // Per-entry key lengths: an int32 (batch,) tensor on query's device (MaskOptions::cache_seqlens).
  const std::optional<at::Tensor>* cache_seqlens = nullptr;
  bool causal_lower_right = false;
  bool window_follows_causal = false;
};
void bind_mask(AttentionParams& params, const at::Tensor& query, const MaskArguments& mask);

// Varlen: binds packed (total, H, D) query/key/value and int32 cu_seqlens (checked: dtype,
// device, 1-D of batch + 1 entries, 0 first, non-decreasing, last = total tokens, no sequence
// longer than max_seqlen). The params then describe B sequences of at most max_seqlen rows.
AttentionParams make_varlen_params(const at::Tensor& query, const at::Tensor& key,
                                   const at::Tensor& value, const at::Tensor& cu_seqlens_q,
                                   const at::Tensor& cu_seqlens_k, int64_t max_seqlen_q,
                                   int64_t max_seqlen_k, const ForwardOptions& options);

// The core library's checks (options such as kv_stride and scale), raised as ValueError.
void check_params(const AttentionParams& params);

// The dtype of the log-sum-exp output: float64 for float64 inputs, float32 otherwise.
at::ScalarType lse_dtype(at::ScalarType input);

}  // namespace samattn::torch_ops
