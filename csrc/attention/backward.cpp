// attention_backward: validate, derive the kernel parameters once, launch D = rowsum(dout * out)
// and then the Hopper backward (fp16/bf16 on sm_90a), the tensor-core backward (fp16/bf16 on
// sm80+) or the SIMT backward (dK/dV, then dQ).
#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>

#include "attention/backward_kernel_params.h"
#include "attention/cache_seqlens.h"
#include "attention/hopper/backward_launch.h"
#include "attention/simt/backward_launch.h"
#include "attention/strided_pattern.h"
#include "attention/tensor_core/backward_launch.h"
#include "attention/validate.h"
#include "attention/varlen.h"
#include "common/check.h"
#include "samattn/attention.h"

namespace samattn {
namespace {

constexpr size_t kWorkspaceAlignment = 256;

size_t round_up(size_t bytes) {
  return (bytes + kWorkspaceAlignment - 1) / kWorkspaceAlignment * kWorkspaceAlignment;
}

// Read on every call, as in the forward, so tests and users can flip it at run time.
bool simt_forced_by_environment() {
  const char* value = std::getenv("SAMATTN_FORCE_SIMT");
  return value != nullptr && std::strcmp(value, "1") == 0;
}

// The tensor-core and Hopper backwards' non-deterministic dQ sums into an fp32 accumulator with
// atomics. Decided from the shapes, dtype and options alone (no device query) so the workspace
// size is a pure function of the parameters; a call that then runs on SIMT leaves it unused.
bool wants_dq_accumulator(const AttentionBackwardParams& bp) {
  return !bp.deterministic && bp.forward.backend != Backend::kSimt &&
         (tensor_core::backward_has_kernel(bp.forward) || hopper::backward_has_kernel(bp.forward));
}

size_t delta_bytes(const AttentionParams& p) {
  const size_t accumulator = p.dtype == DType::kFloat64 ? sizeof(double) : sizeof(float);
  return round_up(static_cast<size_t>(detail::output_rows(p)) * accumulator);
}

// The tensor-core backward's accumulator has the lse's rows; the Hopper backward's pads each
// head's rows to whole query blocks (hopper/backward_config.h): room for either backend the
// call may take.
size_t dq_accumulator_bytes(const AttentionBackwardParams& bp) {
  if (!wants_dq_accumulator(bp)) return 0;
  const AttentionParams& p = bp.forward;
  int64_t rows = detail::output_rows(p);
  const bool may_run_hopper = p.backend == Backend::kAuto || p.backend == Backend::kHopper;
  if (may_run_hopper && hopper::backward_has_kernel(p) && !p.mask.any()) {
    rows = std::max(rows,
                    p.batch * p.heads_q * hopper::backward_dq_accum_rows(p.seqlen_q, p.head_dim));
  }
  return round_up(static_cast<size_t>(rows) * static_cast<size_t>(p.head_dim) * sizeof(float));
}

// kSimt or SAMATTN_FORCE_SIMT=1: SIMT. kHopper / kTensorCore: that backward or an error saying
// why not. kAuto: the Hopper backward where it supports the call, else the tensor-core backward
// where it does, else SIMT. The Hopper backward takes no mask options or varlen yet: such calls
// (kHopper asked for included, as in the forward) go to the tensor-core backward where it can.
Backend resolve_backward_backend(const AttentionBackwardParams& bp) {
  const Backend asked = bp.forward.backend;
  if (asked == Backend::kSimt || simt_forced_by_environment()) return Backend::kSimt;
  if (!bp.forward.mask.any() && (asked == Backend::kHopper || asked == Backend::kAuto)) {
    const Status hopper = hopper::backward_supports(bp);
    if (asked == Backend::kHopper) SAMATTN_CHECK(hopper.ok(), hopper.message());
    if (hopper.ok()) return Backend::kHopper;
  }
  const Status status = tensor_core::backward_supports(bp);
  if (asked == Backend::kTensorCore) SAMATTN_CHECK(status.ok(), status.message());
  return status.ok() ? Backend::kTensorCore : Backend::kSimt;
}

detail::BackwardKernelParams make_backward_kernel_params(const AttentionBackwardParams& bp) {
  const AttentionParams& p = bp.forward;
  detail::BackwardKernelParams k{};
  k.fwd = detail::make_forward_kernel_params(p);

  k.dout = bp.dout;
  k.dq = bp.dq;
  k.dk = bp.dk;
  k.dv = bp.dv;
  k.delta = bp.workspace;
  k.do_batch_stride = bp.dout_strides.batch;
  k.do_head_stride = bp.dout_strides.head;
  k.do_row_stride = bp.dout_strides.seq;
  k.dq_batch_stride = bp.dq_strides.batch;
  k.dq_head_stride = bp.dq_strides.head;
  k.dq_row_stride = bp.dq_strides.seq;
  k.dk_batch_stride = bp.dk_strides.batch;
  k.dk_head_stride = bp.dk_strides.head;
  k.dk_row_stride = bp.dk_strides.seq;
  k.dv_batch_stride = bp.dv_strides.batch;
  k.dv_head_stride = bp.dv_strides.head;
  k.dv_row_stride = bp.dv_strides.seq;
  k.heads_kv = p.heads_kv;
  k.seqlen_k = p.seqlen_k;
  k.scale = detail::resolved_softmax_scale(p);
  return k;
}

}  // namespace

Backend select_backward_backend(const AttentionBackwardParams& params) {
  if (params.forward.mask.has_cache_seqlens()) {
    return resolve_backward_backend(detail::entry_sizing_backward_params(params));
  }
  return resolve_backward_backend(params);
}

size_t attention_backward_workspace_bytes(const AttentionBackwardParams& params) {
  // Per-entry key lengths run one backward per batch entry (cache_seqlens.h), in stream order
  // on one workspace.
  if (params.forward.mask.has_cache_seqlens()) {
    return attention_backward_workspace_bytes(detail::entry_sizing_backward_params(params));
  }
  const AttentionParams& p = params.forward;
  if (p.batch <= 0 || p.heads_q <= 0 || p.seqlen_q <= 0) return 0;
  const size_t strided =
      p.backend == Backend::kSimt ? 0 : detail::strided_backward_workspace_bytes(params);
  return delta_bytes(p) + dq_accumulator_bytes(params) + strided;
}

void attention_backward(const AttentionBackwardParams& params, cudaStream_t stream) {
  detail::validate_backward_params(params);
  detail::validate_backward_launch(params);
  const AttentionParams& p = params.forward;
  if (p.batch == 0 || (p.seqlen_q == 0 && p.seqlen_k == 0)) return;
  if (p.mask.has_cache_seqlens()) {
    detail::per_entry_backward(params, stream);
    return;
  }
  const Backend backend = resolve_backward_backend(params);
  if (p.mask.is_varlen() && backend == Backend::kSimt) {
    // The SIMT kernels take one dense sequence at a time (attention/varlen.h), after one host
    // read of cu_seqlens; the workspace is reused in stream order.
    for (const detail::VarlenSequence& s : detail::read_varlen_sequences(p, stream)) {
      if (s.seqlen_q == 0 && s.seqlen_k == 0) continue;
      detail::BackwardKernelParams kernel_params =
          make_backward_kernel_params(detail::sequence_backward_params(params, s));
      kernel_params.fwd.lse_batch_stride = 0;
      kernel_params.fwd.lse_head_stride = p.mask.total_q;  // lse is (Hq, total_q)
      simt::dispatch_backward(p.dtype, kernel_params, stream);
    }
    return;
  }
  // Varlen on the tensor cores: one launch per kernel, cu_seqlens read on the device.
  detail::BackwardKernelParams kernel_params = make_backward_kernel_params(params);
  if (backend == Backend::kSimt) {
    simt::dispatch_backward(p.dtype, kernel_params, stream);
    return;
  }
  if (dq_accumulator_bytes(params) > 0) {
    kernel_params.dq_accum = static_cast<unsigned char*>(params.workspace) + delta_bytes(p);
  }
  // D is only read for rows that see a key.
  if (kernel_params.fwd.kept_keys > 0 && p.seqlen_q > 0) {
    switch (p.dtype) {
      case DType::kFloat16:
        simt::launch_backward_preprocess<DType::kFloat16>(kernel_params, stream);
        break;
      case DType::kBFloat16:
        simt::launch_backward_preprocess<DType::kBFloat16>(kernel_params, stream);
        break;
      default:
        SAMATTN_CHECK(false, "the ", backend_name(backend), " backward got dtype ",
                      dtype_name(p.dtype));
    }
  }
  if (backend == Backend::kHopper) {
    hopper::dispatch_backward(p.dtype, kernel_params, stream);
    return;
  }
  // The strided pattern: its residue classes and band as separate parts (strided_pattern.h).
  if (kernel_params.dq_accum != nullptr && detail::strided_backward_applies(params)) {
    detail::strided_backward(params, kernel_params,
                             static_cast<unsigned char*>(params.workspace) + delta_bytes(p) +
                                 dq_accumulator_bytes(params),
                             stream);
    return;
  }
  tensor_core::dispatch_backward(p.dtype, kernel_params, stream);
}

}  // namespace samattn
