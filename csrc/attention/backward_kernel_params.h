// Internal: what the backward kernels receive, derived once on the host from
// AttentionBackwardParams.
#pragma once

#include <cstdint>

#include "attention/kernel_params.h"

namespace samattn::detail {

struct BackwardKernelParams {
  // q, k, v, out, lse and the problem, as the forward kernels see it: the k/v row strides
  // include kv_stride, so logical key n is physical row n * kv_stride.
  ForwardKernelParams fwd;
  const void* dout;
  void* dq;
  void* dk;
  void* dv;
  // Workspace: D_i = dout_i . out_i per query row, contiguous (batch, heads_q, seqlen_q) in the
  // accumulation type.
  void* delta;
  // Workspace of the tensor-core backward's atomic dQ: fp32, contiguous (batch, heads_q,
  // seqlen_q, head_dim), zeroed before the dK/dV kernel; null on the other paths.
  void* dq_accum;

  int64_t do_batch_stride, do_head_stride, do_row_stride;
  int64_t dq_batch_stride, dq_head_stride, dq_row_stride;
  // Physical rows: dk/dv rows of keys skipped by kv_stride are written too (with zeros).
  int64_t dk_batch_stride, dk_head_stride, dk_row_stride;
  int64_t dv_batch_stride, dv_head_stride, dv_row_stride;

  int64_t heads_kv;
  int64_t seqlen_k;  // physical key rows
  double scale;      // the softmax scale itself (dq and dk are scaled by it)

  // The strided pattern's parts (attention/strided_pattern.h) run as several calls of the
  // tensor-core masked dK/dV kernel that add into one fp32 dK and dV accumulator each (contiguous
  // (batch, heads_kv, seqlen_k, head_dim) for the whole problem; the strides below, in floats,
  // address logical key rows of this call's view), unscaled; null otherwise. The caller zeroes
  // the accumulators (and dq_accum) when skip_zero is set; skip_convert leaves dq, dk, dv to a
  // later call's conversion.
  float* dk_accum;
  float* dv_accum;
  int64_t acc_batch_stride, acc_head_stride, acc_row_stride;
  bool skip_zero;
  bool skip_convert;
};

}  // namespace samattn::detail
