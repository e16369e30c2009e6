// attention_forward: validate, derive the kernel parameters once, pick a backend, launch.
#include <cstdlib>
#include <cstring>
#include <string>

#include "attention/cache_seqlens.h"
#include "attention/decode.h"
#include "attention/fixed_pattern.h"
#include "attention/hopper/forward_launch.h"
#include "attention/kernel_params.h"
#include "attention/key_split.h"
#include "attention/simt/forward_launch.h"
#include "attention/strided_pattern.h"
#include "attention/tensor_core/forward_launch.h"
#include "attention/validate.h"
#include "attention/varlen.h"
#include "common/check.h"
#include "samattn/attention.h"

namespace samattn {
namespace {

// Read on every call, so tests and users can flip it at run time.
bool simt_forced_by_environment() {
  const char* value = std::getenv("SAMATTN_FORCE_SIMT");
  return value != nullptr && std::strcmp(value, "1") == 0;
}

// Whether select_backend may pick the Hopper forward: neither SIMT nor the tensor-core kernels
// were asked for.
bool hopper_allowed(const AttentionParams& params) {
  return params.backend != Backend::kSimt && params.backend != Backend::kTensorCore &&
         !simt_forced_by_environment();
}

// The split-key forward (key_split.h) the call runs: its chunks run on the tensor-core kernels,
// so neither SIMT nor the Hopper forward may have been asked for. parts() == 0: no split.
detail::KeySplit key_split_of(const AttentionParams& params) {
  const bool unsplit = params.num_splits == 1 && !params.mask.has_cache_seqlens();
  if (unsplit || params.backend == Backend::kSimt || params.backend == Backend::kHopper ||
      simt_forced_by_environment()) {
    return {};
  }
  return detail::key_split_for(params);
}

// Whether per-entry key lengths run one call per batch entry (cache_seqlens.h): everywhere but
// on the decoding kernel.
bool runs_per_entry(const AttentionParams& params, const detail::KeySplit& split) {
  return params.mask.has_cache_seqlens() && !split.on_decode_kernel;
}

// A paged KV cache runs on the decoding kernel only: throws, naming the reason, where it does
// not run `params` (`split`: its key_split_of).
void check_paged_call(const AttentionParams& params, const detail::KeySplit& split) {
  if (!params.mask.is_paged() || detail::output_rows(params) == 0) return;
  if (split.on_decode_kernel) return;
  const char* prefix = "a paged KV cache (mask.block_table) runs on the decoding kernel only; ";
  SAMATTN_CHECK(params.backend == Backend::kAuto || params.backend == Backend::kTensorCore, prefix,
                "backend ", backend_name(params.backend), " was asked for");
  SAMATTN_CHECK(!simt_forced_by_environment(), prefix, "SAMATTN_FORCE_SIMT=1 forces SIMT");
  const Status takes = detail::decode_kernel_takes(params);
  SAMATTN_CHECK(takes.ok(), prefix, takes.message());
  const Status tensor_core = tensor_core::supports(params);
  SAMATTN_CHECK(tensor_core.ok(), prefix, tensor_core.message());
  SAMATTN_CHECK(false, prefix, "its blocks do not fit this device's shared memory");
}

}  // namespace

Backend select_backend(const AttentionParams& params) {
  const detail::KeySplit split = key_split_of(params);
  check_paged_call(params, split);
  if (params.backend == Backend::kSimt || simt_forced_by_environment()) return Backend::kSimt;
  if (runs_per_entry(params, split)) return select_backend(detail::entry_sizing_params(params));
  if (split.parts() > 0) return Backend::kTensorCore;
  // The fixed pattern runs mostly on the Hopper forward through its decomposition.
  const bool hopper_ok =
      hopper_allowed(params) &&
      (hopper::supports(params).ok() || detail::fixed_decomposition_status(params).ok());
  if (params.backend == Backend::kHopper && (hopper_ok || !params.mask.any())) {
    SAMATTN_CHECK(hopper_ok, hopper::supports(params).message());
    return Backend::kHopper;
  }
  if (hopper_ok) return Backend::kHopper;
  // Masks and sparse patterns (which the Hopper forward declines, even when asked for; it takes
  // a sliding window and varlen with kv_stride 1) run on the tensor-core masked kernel for
  // float16/bfloat16, else on SIMT.
  const Status tensor_core = tensor_core::supports(params);
  if (params.backend == Backend::kTensorCore) {
    SAMATTN_CHECK(tensor_core.ok(), tensor_core.message());
    return Backend::kTensorCore;
  }
  return tensor_core.ok() ? Backend::kTensorCore : Backend::kSimt;
}

std::string describe_forward(const AttentionParams& params) {
  const detail::KeySplit split = key_split_of(params);
  check_paged_call(params, split);
  if (runs_per_entry(params, split)) {
    return describe_forward(detail::entry_sizing_params(params)) +
           ", one call per batch entry (cache_seqlens)";
  }
  if (split.parts() == 0) return backend_name(select_backend(params));
  const char* chunks = split.parts() == 1 ? " key chunk" : " key chunks";
  return detail::concat(backend_name(Backend::kTensorCore), ": ",
                        split.on_decode_kernel ? "decoding kernel" : "split", ", ", split.parts(),
                        chunks);
}

size_t attention_forward_workspace_bytes(const AttentionParams& params) {
  const detail::KeySplit split = key_split_of(params);
  check_paged_call(params, split);
  if (runs_per_entry(params, split)) {
    return attention_forward_workspace_bytes(detail::entry_sizing_params(params));
  }
  switch (params.mask.pattern) {
    case SparsePattern::kStrided:
      return params.backend == Backend::kSimt ? 0 : detail::strided_forward_workspace_bytes(params);
    case SparsePattern::kFixed:  // when select_backend picks the Hopper forward for it
      return hopper_allowed(params) ? detail::fixed_forward_workspace_bytes(params) : 0;
    case SparsePattern::kNone:
      break;
  }
  return detail::split_needs_workspace(split) ? detail::key_split_workspace_bytes(params, split)
                                              : 0;
}

namespace {

void launch(Backend backend, DType dtype, const detail::ForwardKernelParams& kernel_params,
            cudaStream_t stream) {
  if (backend == Backend::kHopper) {
    hopper::dispatch_forward(dtype, kernel_params, stream);
  } else if (backend == Backend::kTensorCore) {
    tensor_core::dispatch_forward(dtype, kernel_params, stream);
  } else {
    simt::dispatch_forward(dtype, kernel_params, stream);
  }
}

// The SIMT kernels take varlen one dense sequence at a time, after one host read of cu_seqlens.
void simt_varlen_forward(const AttentionParams& params, cudaStream_t stream) {
  for (const detail::VarlenSequence& s : detail::read_varlen_sequences(params, stream)) {
    if (s.seqlen_q == 0) continue;
    const AttentionParams sub = detail::sequence_params(params, s);
    detail::ForwardKernelParams kernel_params = detail::make_forward_kernel_params(sub);
    kernel_params.lse_batch_stride = 0;
    kernel_params.lse_head_stride = params.mask.total_q;  // lse is (Hq, total_q)
    simt::dispatch_forward(params.dtype, kernel_params, stream);
  }
}

}  // namespace

void attention_forward(const AttentionParams& params, cudaStream_t stream) {
  detail::validate_forward_params(params);
  if (detail::output_rows(params) == 0) return;
  const detail::KeySplit split = key_split_of(params);
  check_paged_call(params, split);
  if (runs_per_entry(params, split)) {
    detail::per_entry_forward(params, stream);
    return;
  }
  // A split call, when its workspace was given (or, on the decoding kernel, with one chunk that
  // needs none); without one it runs as with num_splits 1.
  if (split.parts() > 0) {
    if (split.on_decode_kernel && (params.workspace != nullptr || split.parts() == 1)) {
      detail::decode_forward(params, split, stream);
      return;
    }
    if (params.workspace != nullptr) {
      detail::key_split_forward(params, split, stream);
      return;
    }
    AttentionParams unsplit = params;
    unsplit.num_splits = 1;
    attention_forward(unsplit, stream);
    return;
  }
  const Backend backend = select_backend(params);
  if (params.mask.is_varlen() && backend == Backend::kSimt) {
    simt_varlen_forward(params, stream);
    return;
  }
  // The fixed pattern's decomposition, when its workspace was given (without one the fixed
  // pattern runs on the tensor-core masked kernel).
  if (backend == Backend::kHopper && params.mask.pattern == SparsePattern::kFixed) {
    if (params.workspace != nullptr) {
      detail::fixed_forward(params, stream);
    } else {
      tensor_core::dispatch_forward(params.dtype, detail::make_forward_kernel_params(params),
                                    stream);
    }
    return;
  }
  // The strided pattern's decomposition, when its workspace (if it needs one) was given.
  if (backend == Backend::kTensorCore && detail::strided_decomposition_applies(params) &&
      (params.workspace != nullptr || detail::strided_forward_workspace_bytes(params) == 0)) {
    detail::strided_forward(params, stream);
    return;
  }
  launch(backend, params.dtype, detail::make_forward_kernel_params(params), stream);
}

}  // namespace samattn
