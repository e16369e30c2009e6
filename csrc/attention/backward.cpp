// attention_backward: validate, derive the kernel parameters once, launch the SIMT backward
// (D = rowsum(dout * out), then dK/dV, then dQ).
#include <cmath>

#include "attention/backward_kernel_params.h"
#include "attention/simt/backward_launch.h"
#include "attention/validate.h"
#include "attention/varlen.h"
#include "samattn/attention.h"

namespace samattn {
namespace {

constexpr size_t kWorkspaceAlignment = 256;

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

size_t attention_backward_workspace_bytes(const AttentionBackwardParams& params) {
  const AttentionParams& p = params.forward;
  if (p.batch <= 0 || p.heads_q <= 0 || p.seqlen_q <= 0) return 0;
  const size_t accumulator = p.dtype == DType::kFloat64 ? sizeof(double) : sizeof(float);
  const size_t bytes = static_cast<size_t>(detail::output_rows(p)) * accumulator;
  return (bytes + kWorkspaceAlignment - 1) / kWorkspaceAlignment * kWorkspaceAlignment;
}

void attention_backward(const AttentionBackwardParams& params, cudaStream_t stream) {
  detail::validate_backward_params(params);
  detail::validate_backward_launch(params);
  const AttentionParams& p = params.forward;
  if (p.batch == 0 || (p.seqlen_q == 0 && p.seqlen_k == 0)) return;
  if (!p.mask.is_varlen()) {
    simt::dispatch_backward(p.dtype, make_backward_kernel_params(params), stream);
    return;
  }
  // One dense sequence at a time (attention/varlen.h); the workspace is reused in stream order.
  for (const detail::VarlenSequence& s : detail::read_varlen_sequences(p, stream)) {
    if (s.seqlen_q == 0 && s.seqlen_k == 0) continue;
    detail::BackwardKernelParams kernel_params =
        make_backward_kernel_params(detail::sequence_backward_params(params, s));
    kernel_params.fwd.lse_batch_stride = 0;
    kernel_params.fwd.lse_head_stride = p.mask.total_q;  // lse is (Hq, total_q)
    simt::dispatch_backward(p.dtype, kernel_params, stream);
  }
}

}  // namespace samattn
