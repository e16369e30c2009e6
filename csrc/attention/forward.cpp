// attention_forward: validate, derive the kernel parameters once, pick a backend, launch.
#include <cmath>
#include <cstdlib>
#include <cstring>

#include "attention/kernel_params.h"
#include "attention/simt/forward_launch.h"
#include "attention/tensor_core/forward_launch.h"
#include "attention/validate.h"
#include "common/check.h"
#include "samattn/attention.h"

namespace samattn {
namespace {

detail::ForwardKernelParams make_kernel_params(const AttentionParams& p) {
  detail::ForwardKernelParams k{};
  k.q = p.q;
  k.k = p.k;
  k.v = p.v;
  k.out = p.out;
  k.lse = p.lse;
  k.q_batch_stride = p.q_strides.batch;
  k.q_head_stride = p.q_strides.head;
  k.q_row_stride = p.q_strides.seq;
  k.k_batch_stride = p.k_strides.batch;
  k.k_head_stride = p.k_strides.head;
  k.k_row_stride = p.k_strides.seq * p.kv_stride;
  k.v_batch_stride = p.v_strides.batch;
  k.v_head_stride = p.v_strides.head;
  k.v_row_stride = p.v_strides.seq * p.kv_stride;
  k.o_batch_stride = p.out_strides.batch;
  k.o_head_stride = p.out_strides.head;
  k.o_row_stride = p.out_strides.seq;
  k.batch = p.batch;
  k.heads_q = p.heads_q;
  k.group_size = p.heads_q / p.heads_kv;
  k.seqlen_q = p.seqlen_q;
  k.kept_keys = detail::strided_key_count(p);
  k.kv_stride = p.kv_stride;
  k.head_dim = static_cast<int>(p.head_dim);
  k.head_dim_v = static_cast<int>(p.head_dim_v);
  k.scale_log2 = detail::resolved_softmax_scale(p) * M_LOG2E;
  k.causal = p.causal;
  return k;
}

// Read on every call, so tests and users can flip it at run time.
bool simt_forced_by_environment() {
  const char* value = std::getenv("SAMATTN_FORCE_SIMT");
  return value != nullptr && std::strcmp(value, "1") == 0;
}

}  // namespace

Backend select_backend(const AttentionParams& params) {
  if (params.backend == Backend::kSimt || simt_forced_by_environment()) return Backend::kSimt;
  const Status tensor_core = tensor_core::supports(params);
  if (params.backend == Backend::kTensorCore) {
    SAMATTN_CHECK(tensor_core.ok(), tensor_core.message());
    return Backend::kTensorCore;
  }
  return tensor_core.ok() ? Backend::kTensorCore : Backend::kSimt;
}

void attention_forward(const AttentionParams& params, cudaStream_t stream) {
  detail::validate_forward_params(params);
  if (detail::output_rows(params) == 0) return;
  const Backend backend = select_backend(params);
  const detail::ForwardKernelParams kernel_params = make_kernel_params(params);
  if (backend == Backend::kTensorCore) {
    tensor_core::dispatch_forward(params.dtype, kernel_params, stream);
  } else {
    simt::dispatch_forward(params.dtype, kernel_params, stream);
  }
}

}  // namespace samattn
