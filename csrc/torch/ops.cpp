// The samattn torch operators: CUDA kernels under the CUDA key, the fp64 reference under the CPU
// key. Shapes and dtypes of the results for torch.compile come from register_fake in Python.
#include <optional>
#include <string>
#include <string_view>
#include <tuple>

#include <ATen/ATen.h>
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAGuard.h>
#include <torch/library.h>

#include "samattn/attention.h"
#include "tensor_params.h"

namespace samattn::torch_ops {
namespace {

// Runs attention with the CUDA kernels or, for CPU tensors, the fp64 reference.
void run_forward(const AttentionParams& params, const at::Tensor& query) {
  try {
    if (query.is_cuda()) {
      const c10::cuda::CUDAGuard guard(query.device());
      attention_forward(params, at::cuda::getCurrentCUDAStream(query.device().index()));
    } else {
      reference_attention_forward(params);
    }
  } catch (const Error& error) {
    TORCH_CHECK_VALUE(false, error.what());
  }
}

std::tuple<at::Tensor, at::Tensor> attention_forward_op(const at::Tensor& query,
                                                        const at::Tensor& key,
                                                        const at::Tensor& value,
                                                        std::optional<double> scale, bool causal,
                                                        int64_t kv_stride, bool return_lse,
                                                        c10::string_view backend) {
  AttentionParams params = make_forward_params(
      query, key, value,
      {scale, causal, kv_stride, std::string_view(backend.data(), backend.size())});
  at::Tensor out = at::empty({params.batch, params.heads_q, params.seqlen_q, params.head_dim_v},
                             query.options());
  at::Tensor lse =
      at::empty(return_lse ? std::vector<int64_t>{params.batch, params.heads_q, params.seqlen_q}
                           : std::vector<int64_t>{0},
                query.options().dtype(lse_dtype(query.scalar_type())));
  set_output(params, out);
  params.lse = return_lse ? lse.data_ptr() : nullptr;
  check_params(params);
  run_forward(params, query);
  return {out, lse};
}

void attention_forward_into_op(const at::Tensor& query, const at::Tensor& key,
                               const at::Tensor& value, const at::Tensor& out,
                               std::optional<double> scale, bool causal, int64_t kv_stride,
                               c10::string_view backend) {
  AttentionParams params = make_forward_params(
      query, key, value,
      {scale, causal, kv_stride, std::string_view(backend.data(), backend.size())});
  check_output(out, query, params);
  set_output(params, out);
  check_params(params);
  run_forward(params, query);
}

// Runs the backward with the CUDA kernels or, for CPU tensors, the fp64 reference. The CUDA
// workspace (D and the tensor-core backward's fp32 dQ accumulator) comes from torch's caching
// allocator, on the current stream.
void run_backward(AttentionBackwardParams& params, const at::Tensor& query) {
  try {
    if (query.is_cuda()) {
      const c10::cuda::CUDAGuard guard(query.device());
      const size_t bytes = attention_backward_workspace_bytes(params);
      const at::Tensor workspace =
          at::empty({static_cast<int64_t>(bytes)}, query.options().dtype(at::kByte));
      params.workspace = bytes > 0 ? workspace.data_ptr() : nullptr;
      attention_backward(params, at::cuda::getCurrentCUDAStream(query.device().index()));
    } else {
      reference_attention_backward(params);
    }
  } catch (const Error& error) {
    TORCH_CHECK_VALUE(false, error.what());
  }
}

// Gradients of attention_forward: dq, dk, dv shaped like query, key, value (contiguous).
// `deterministic`: bit-identical dq from run to run (the tensor-core backward then recomputes
// the probabilities in a separate dQ kernel instead of adding dQ with atomics). `backend` picks
// the backward's kernels as it picks the forward's.
std::tuple<at::Tensor, at::Tensor, at::Tensor> attention_backward_op(
    const at::Tensor& dout, const at::Tensor& query, const at::Tensor& key, const at::Tensor& value,
    const at::Tensor& out, const at::Tensor& lse, std::optional<double> scale, bool causal,
    int64_t kv_stride, bool deterministic, c10::string_view backend) {
  AttentionParams forward = make_forward_params(
      query, key, value,
      {scale, causal, kv_stride, std::string_view(backend.data(), backend.size())});
  check_output(out, query, forward, "out");
  check_output(dout, query, forward, "dout");
  check_lse(lse, query, forward);
  set_output(forward, out);
  forward.lse = lse.data_ptr();
  check_params(forward);
  at::Tensor dq = at::empty(query.sizes(), query.options());
  at::Tensor dk = at::empty(key.sizes(), key.options());
  at::Tensor dv = at::empty(value.sizes(), value.options());
  AttentionBackwardParams params = make_backward_params(forward, dout, dq, dk, dv);
  params.deterministic = deterministic;
  run_backward(params, query);
  return {dq, dk, dv};
}

// The name of the kernel family that would run this call ("simt", "tensor_core" or "hopper").
std::string selected_backend_op(const at::Tensor& query, const at::Tensor& key,
                                const at::Tensor& value, bool causal, int64_t kv_stride,
                                c10::string_view backend) {
  AttentionParams params = make_forward_params(
      query, key, value,
      {std::nullopt, causal, kv_stride, std::string_view(backend.data(), backend.size())});
  TORCH_CHECK_VALUE(query.is_cuda(),
                    "samattn: selected_backend needs CUDA tensors; CPU tensors "
                    "always run the fp64 reference");
  const c10::cuda::CUDAGuard guard(query.device());
  try {
    return backend_name(select_backend(params));
  } catch (const Error& error) {
    TORCH_CHECK_VALUE(false, error.what());
  }
}

}  // namespace

TORCH_LIBRARY(samattn, m) {
  m.def(
      "attention_forward(Tensor query, Tensor key, Tensor value, float? scale=None, "
      "bool causal=False, int kv_stride=1, bool return_lse=False, str backend='auto') "
      "-> (Tensor out, Tensor lse)");
  // Not differentiable: it writes into `out` and has no autograd formula, so `out` never carries
  // a grad_fn (samattn.self_attention, its caller, raises when x requires grad). attention_forward
  // is the differentiable op (autograd registered in samattn/_ops.py).
  m.def(
      "attention_forward_into(Tensor query, Tensor key, Tensor value, Tensor(a!) out, "
      "float? scale=None, bool causal=False, int kv_stride=1, str backend='auto') -> ()");
  m.def(
      "attention_backward(Tensor dout, Tensor query, Tensor key, Tensor value, Tensor out, "
      "Tensor lse, float? scale=None, bool causal=False, int kv_stride=1, "
      "bool deterministic=False, str backend='auto') -> (Tensor dq, Tensor dk, Tensor dv)");
  m.def(
      "selected_backend(Tensor query, Tensor key, Tensor value, bool causal=False, "
      "int kv_stride=1, str backend='auto') -> str");
}

TORCH_LIBRARY_IMPL(samattn, CUDA, m) {
  m.impl("attention_forward", &attention_forward_op);
  m.impl("attention_forward_into", &attention_forward_into_op);
  m.impl("attention_backward", &attention_backward_op);
  m.impl("selected_backend", &selected_backend_op);
}

TORCH_LIBRARY_IMPL(samattn, CPU, m) {
  m.impl("attention_forward", &attention_forward_op);
  m.impl("attention_forward_into", &attention_forward_into_op);
  m.impl("attention_backward", &attention_backward_op);
}

}  // namespace samattn::torch_ops
