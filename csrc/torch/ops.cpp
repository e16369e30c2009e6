// The samattn torch operators: CUDA kernels under the CUDA key, the fp64 reference under the CPU
// key; their autograd is in autograd.cpp. Shapes and dtypes of the results for torch.compile come
// from register_fake in Python.
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

// `bytes` of workspace on `like`'s device from torch's caching allocator, its address in
// *pointer; none (nullptr) when bytes is 0, as for most forward calls, which then skip an
// allocation. The tensor keeps the memory until the launch is queued; the allocator orders its
// reuse after the stream's work.
at::Tensor allocate_workspace(size_t bytes, const at::Tensor& like, void** pointer) {
  if (bytes == 0) {
    *pointer = nullptr;
    return {};
  }
  at::Tensor workspace = at::empty({static_cast<int64_t>(bytes)}, like.options().dtype(at::kByte));
  *pointer = workspace.data_ptr();
  return workspace;
}

// Runs attention with the CUDA kernels or, for CPU tensors, the fp64 reference. The CUDA
// workspace (the strided pattern's residue part) comes from torch's caching allocator.
void run_forward(AttentionParams& params, const at::Tensor& query) {
  try {
    if (query.is_cuda()) {
      const c10::cuda::CUDAGuard guard(query.device());
      const at::Tensor workspace =
          allocate_workspace(attention_forward_workspace_bytes(params), query, &params.workspace);
      attention_forward(params, at::cuda::getCurrentCUDAStream(query.device().index()));
    } else {
      reference_attention_forward(params);
    }
  } catch (const Error& error) {
    TORCH_CHECK_VALUE(false, error.what());
  }
}

std::tuple<at::Tensor, at::Tensor> attention_forward_op(
    const at::Tensor& query, const at::Tensor& key, const at::Tensor& value,
    std::optional<double> scale, bool causal, int64_t kv_stride, bool return_lse,
    c10::string_view backend, const std::optional<at::Tensor>& attn_mask, int64_t window_left,
    int64_t window_right, c10::string_view sparse_pattern, int64_t sparse_block,
    int64_t sparse_summary, const std::optional<at::Tensor>& block_map, int64_t block_q,
    int64_t block_k, int64_t num_splits, const std::optional<at::Tensor>& cache_seqlens,
    bool causal_lower_right, bool window_follows_causal) {
  AttentionParams params = make_forward_params(
      query, key, value,
      {scale, causal, kv_stride, std::string_view(backend.data(), backend.size())});
  bind_mask(
      params, query,
      {attn_mask, window_left, window_right,
       std::string_view(sparse_pattern.data(), sparse_pattern.size()), sparse_block, sparse_summary,
       &block_map, block_q, block_k, &cache_seqlens, causal_lower_right, window_follows_causal});
  params.num_splits = num_splits;
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
// workspace (D and the tensor-core or Hopper backward's fp32 dQ accumulator) comes from torch's
// caching allocator, on the current stream.
void run_backward(AttentionBackwardParams& params, const at::Tensor& query) {
  try {
    if (query.is_cuda()) {
      const c10::cuda::CUDAGuard guard(query.device());
      const at::Tensor workspace =
          allocate_workspace(attention_backward_workspace_bytes(params), query, &params.workspace);
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
    int64_t kv_stride, bool deterministic, c10::string_view backend,
    const std::optional<at::Tensor>& attn_mask, int64_t window_left, int64_t window_right,
    c10::string_view sparse_pattern, int64_t sparse_block, int64_t sparse_summary,
    const std::optional<at::Tensor>& block_map, int64_t block_q, int64_t block_k,
    const std::optional<at::Tensor>& cache_seqlens, bool causal_lower_right,
    bool window_follows_causal) {
  AttentionParams forward = make_forward_params(
      query, key, value,
      {scale, causal, kv_stride, std::string_view(backend.data(), backend.size())});
  bind_mask(
      forward, query,
      {attn_mask, window_left, window_right,
       std::string_view(sparse_pattern.data(), sparse_pattern.size()), sparse_block, sparse_summary,
       &block_map, block_q, block_k, &cache_seqlens, causal_lower_right, window_follows_causal});
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

// A paged KV cache (vLLM's and FlashAttention's layout): key_cache and value_cache are pools
// (num_pages, page_size, Hkv, D|Dv); block_table (B, pages per entry) int32 lists entry b's
// pages; cache_seqlens (B,) int32 its keys. query (B, Hq, Sq, D). The decoding kernel reads the
// pages in place; a CUDA call it does not take reads a dense copy gathered here with the table
// clamped to the pool, as the kernel clamps it; on the CPU the reference gathers the pages
// itself and checks the table. Forward only.
std::tuple<at::Tensor, at::Tensor> paged_forward_op(
    const at::Tensor& query, const at::Tensor& key_cache, const at::Tensor& value_cache,
    const at::Tensor& block_table, const at::Tensor& cache_seqlens, std::optional<double> scale,
    bool causal, bool causal_lower_right, int64_t num_splits, bool return_lse,
    c10::string_view backend) {
  for (const auto& [t, arg] :
       {std::pair{&key_cache, "key_cache"}, std::pair{&value_cache, "value_cache"}}) {
    TORCH_CHECK_VALUE(t->dim() == 4 && t->size(0) >= 1, "samattn: ", arg,
                      " must be a 4-D pool (num_pages >= 1, page_size, heads_kv, head_dim), got "
                      "shape ",
                      t->sizes());
  }
  TORCH_CHECK_VALUE(
      value_cache.size(0) == key_cache.size(0) && value_cache.size(1) == key_cache.size(1),
      "samattn: value_cache's pages (", value_cache.sizes(), ") must match key_cache's (",
      key_cache.sizes(), ")");
  TORCH_CHECK_VALUE(block_table.scalar_type() == at::kInt && block_table.dim() == 2 &&
                        block_table.size(0) == query.size(0) &&
                        block_table.device() == query.device() &&
                        (block_table.size(1) <= 1 || block_table.stride(1) == 1),
                    "samattn: block_table must be an int32 (batch = ", query.size(0),
                    ", pages per entry) tensor on query's device, contiguous in its last "
                    "dimension, got ",
                    block_table.scalar_type(), " of shape ", block_table.sizes());
  const int64_t batch = query.size(0), page_size = key_cache.size(1);
  // make_forward_params' checks on (B, Hkv, page_size, D) views of the first page.
  const auto first_page = [&](const at::Tensor& pool) {
    return pool.select(0, 0).transpose(0, 1).unsqueeze(0).expand(
        {batch, pool.size(2), pool.size(1), pool.size(3)});
  };
  const ForwardOptions options{scale, causal, 1, std::string_view(backend.data(), backend.size())};
  AttentionParams params =
      make_forward_params(query, first_page(key_cache), first_page(value_cache), options);
  const std::optional<at::Tensor> lengths(cache_seqlens);
  bind_mask(params, query,
            {std::nullopt, -1, -1, "none", 0, 0, nullptr, 128, 128, &lengths, causal_lower_right});
  params.seqlen_k = block_table.size(1) * page_size;
  params.k = key_cache.data_ptr();
  params.v = value_cache.data_ptr();
  params.k_strides = Strides{key_cache.stride(0), key_cache.stride(2), key_cache.stride(1)};
  params.v_strides = Strides{value_cache.stride(0), value_cache.stride(2), value_cache.stride(1)};
  params.mask.block_table = block_table.data_ptr<int32_t>();
  params.mask.block_table_stride = block_table.stride(0);
  params.mask.page_size = page_size;
  params.mask.num_pages = key_cache.size(0);
  params.num_splits = num_splits;
  at::Tensor out =
      at::empty({batch, params.heads_q, params.seqlen_q, params.head_dim_v}, query.options());
  at::Tensor lse =
      at::empty(return_lse ? std::vector<int64_t>{batch, params.heads_q, params.seqlen_q}
                           : std::vector<int64_t>{0},
                query.options().dtype(lse_dtype(query.scalar_type())));
  set_output(params, out);
  params.lse = return_lse ? lse.data_ptr() : nullptr;
  check_params(params);
  bool in_place = !query.is_cuda();  // the CPU reference gathers the pages itself
  if (query.is_cuda()) {
    const c10::cuda::CUDAGuard guard(query.device());
    try {
      select_backend(params);  // refuses a paged call off the decoding kernel
      in_place = true;
    } catch (const Error&) {
    }
  }
  if (in_place) {
    run_forward(params, query);
    return {out, lse};
  }
  const auto dense = [&](const at::Tensor& pool) {
    const at::Tensor pages = block_table.clamp(0, pool.size(0) - 1).flatten().to(at::kLong);
    return pool.index_select(0, pages)
        .view({batch, block_table.size(1) * page_size, pool.size(2), pool.size(3)})
        .transpose(1, 2);
  };
  return attention_forward_op(query, dense(key_cache), dense(value_cache), scale, causal, 1,
                              return_lse, backend, std::nullopt, -1, -1, "none", 0, 0, std::nullopt,
                              128, 128, num_splits, cache_seqlens, causal_lower_right, false);
}

// Varlen (packed) forward: query (total_q, Hq, D), key/value (total_k, Hkv, D|Dv), int32
// cu_seqlens of batch + 1 entries. Returns out (total_q, Hq, Dv) and lse (Hq, total_q) (or an
// empty lse when return_lse is false).
std::tuple<at::Tensor, at::Tensor> varlen_forward_op(
    const at::Tensor& query, const at::Tensor& key, const at::Tensor& value,
    const at::Tensor& cu_seqlens_q, const at::Tensor& cu_seqlens_k, int64_t max_seqlen_q,
    int64_t max_seqlen_k, std::optional<double> scale, bool causal, int64_t window_left,
    int64_t window_right, bool return_lse, c10::string_view backend, bool causal_lower_right,
    bool window_follows_causal) {
  AttentionParams params =
      make_varlen_params(query, key, value, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
                         {scale, causal, 1, std::string_view(backend.data(), backend.size())});
  params.mask.window_left = window_left;
  params.mask.window_right = window_right;
  params.mask.causal_lower_right = causal_lower_right;
  params.mask.window_follows_causal = window_follows_causal;
  at::Tensor out = at::empty({query.size(0), query.size(1), value.size(2)}, query.options());
  at::Tensor lse = at::empty(
      return_lse ? std::vector<int64_t>{query.size(1), query.size(0)} : std::vector<int64_t>{0},
      query.options().dtype(lse_dtype(query.scalar_type())));
  params.out = out.data_ptr();
  params.out_strides = Strides{0, out.stride(1), out.stride(0)};
  params.lse = return_lse ? lse.data_ptr() : nullptr;
  check_params(params);
  run_forward(params, query);
  return {out, lse};
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> varlen_backward_op(
    const at::Tensor& dout, const at::Tensor& query, const at::Tensor& key, const at::Tensor& value,
    const at::Tensor& out, const at::Tensor& lse, const at::Tensor& cu_seqlens_q,
    const at::Tensor& cu_seqlens_k, int64_t max_seqlen_q, int64_t max_seqlen_k,
    std::optional<double> scale, bool causal, int64_t window_left, int64_t window_right,
    bool causal_lower_right, bool window_follows_causal) {
  AttentionParams forward =
      make_varlen_params(query, key, value, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
                         {scale, causal, 1, "auto"});
  forward.mask.window_left = window_left;
  forward.mask.window_right = window_right;
  forward.mask.causal_lower_right = causal_lower_right;
  forward.mask.window_follows_causal = window_follows_causal;
  const std::vector<int64_t> out_shape{query.size(0), query.size(1), value.size(2)};
  for (const auto& [t, arg] : {std::pair{&out, "out"}, std::pair{&dout, "dout"}}) {
    TORCH_CHECK_VALUE(t->scalar_type() == query.scalar_type() && t->device() == query.device() &&
                          t->sizes() == at::IntArrayRef(out_shape) &&
                          (t->numel() == 0 || t->stride(2) == 1),
                      "samattn: ", arg, " must be a ", c10::toString(query.scalar_type()),
                      " tensor of shape (total_q, heads_q, head_dim_v) on query's device, "
                      "contiguous in its last dimension");
  }
  TORCH_CHECK_VALUE(lse.scalar_type() == lse_dtype(query.scalar_type()) &&
                        lse.device() == query.device() && lse.dim() == 2 &&
                        lse.size(0) == query.size(1) && lse.size(1) == query.size(0) &&
                        lse.is_contiguous(),
                    "samattn: lse must be the forward's contiguous (heads_q, total_q) log-sum-exp "
                    "(return_lse=True)");
  forward.out = out.data_ptr();
  forward.out_strides = Strides{0, out.stride(1), out.stride(0)};
  forward.lse = lse.data_ptr();
  check_params(forward);
  at::Tensor dq = at::empty(query.sizes(), query.options());
  at::Tensor dk = at::empty(key.sizes(), key.options());
  at::Tensor dv = at::empty(value.sizes(), value.options());
  AttentionBackwardParams params;
  params.forward = forward;
  params.dout = dout.data_ptr();
  params.dout_strides = Strides{0, dout.stride(1), dout.stride(0)};
  params.dq = dq.data_ptr();
  params.dk = dk.data_ptr();
  params.dv = dv.data_ptr();
  params.dq_strides = Strides{0, dq.stride(1), dq.stride(0)};
  params.dk_strides = Strides{0, dk.stride(1), dk.stride(0)};
  params.dv_strides = Strides{0, dv.stride(1), dv.stride(0)};
  run_backward(params, query);
  return {dq, dk, dv};
}

// Strides of a contiguous (batch, heads, seqlen, dim) tensor, as the ops allocate their outputs.
Strides contiguous_strides(int64_t heads, int64_t seqlen, int64_t dim) {
  return Strides{heads * seqlen * dim, seqlen * dim, dim};
}

// The name of the kernel family that would run this call ("simt", "tensor_core" or "hopper";
// with detail, describe_forward's text), for the output attention_forward allocates:
// contiguous (batch, heads_q, seqlen_q, head_dim_v), as aligned as query.
std::string selected_backend_op(const at::Tensor& query, const at::Tensor& key,
                                const at::Tensor& value, bool causal, int64_t kv_stride,
                                c10::string_view backend,
                                const std::optional<at::Tensor>& attn_mask, int64_t window_left,
                                int64_t window_right, c10::string_view sparse_pattern,
                                int64_t sparse_block, int64_t sparse_summary,
                                const std::optional<at::Tensor>& block_map, int64_t block_q,
                                int64_t block_k, int64_t num_splits, bool detail,
                                const std::optional<at::Tensor>& cache_seqlens,
                                bool causal_lower_right, bool window_follows_causal) {
  AttentionParams params = make_forward_params(
      query, key, value,
      {std::nullopt, causal, kv_stride, std::string_view(backend.data(), backend.size())});
  bind_mask(
      params, query,
      {attn_mask, window_left, window_right,
       std::string_view(sparse_pattern.data(), sparse_pattern.size()), sparse_block, sparse_summary,
       &block_map, block_q, block_k, &cache_seqlens, causal_lower_right, window_follows_causal});
  params.num_splits = num_splits;
  TORCH_CHECK_VALUE(query.is_cuda(),
                    "samattn: selected_backend needs CUDA tensors; CPU tensors "
                    "always run the fp64 reference");
  params.out = query.data_ptr();
  params.out_strides = contiguous_strides(params.heads_q, params.seqlen_q, params.head_dim_v);
  const c10::cuda::CUDAGuard guard(query.device());
  try {
    return detail ? describe_forward(params) : backend_name(select_backend(params));
  } catch (const Error& error) {
    TORCH_CHECK_VALUE(false, error.what());
  }
}

// The kernel family attention_backward would run for these tensors ("simt", "tensor_core" or
// "hopper"), for out, dout and the gradients laid out as the ops allocate them: contiguous, as
// aligned as query, key and value.
std::string selected_backward_backend_op(const at::Tensor& query, const at::Tensor& key,
                                         const at::Tensor& value, bool causal, int64_t kv_stride,
                                         c10::string_view backend) {
  AttentionParams forward = make_forward_params(
      query, key, value,
      {std::nullopt, causal, kv_stride, std::string_view(backend.data(), backend.size())});
  TORCH_CHECK_VALUE(query.is_cuda(),
                    "samattn: selected_backend needs CUDA tensors; CPU tensors "
                    "always run the fp64 reference");
  const Strides rows_q = contiguous_strides(forward.heads_q, forward.seqlen_q, forward.head_dim_v);
  forward.out = query.data_ptr();
  forward.out_strides = rows_q;
  AttentionBackwardParams params;
  params.forward = forward;
  params.dout = query.data_ptr();
  params.dout_strides = rows_q;
  params.dq = query.data_ptr();
  params.dq_strides = contiguous_strides(forward.heads_q, forward.seqlen_q, forward.head_dim);
  params.dk = key.data_ptr();
  params.dk_strides = contiguous_strides(forward.heads_kv, forward.seqlen_k, forward.head_dim);
  params.dv = value.data_ptr();
  params.dv_strides = contiguous_strides(forward.heads_kv, forward.seqlen_k, forward.head_dim_v);
  const c10::cuda::CUDAGuard guard(query.device());
  try {
    return backend_name(select_backward_backend(params));
  } catch (const Error& error) {
    TORCH_CHECK_VALUE(false, error.what());
  }
}

}  // namespace

TORCH_LIBRARY(samattn, m) {
  m.def(
      "attention_forward(Tensor query, Tensor key, Tensor value, float? scale=None, "
      "bool causal=False, int kv_stride=1, bool return_lse=False, str backend='auto', "
      "Tensor? attn_mask=None, int window_left=-1, int window_right=-1, "
      "str sparse_pattern='none', int sparse_block=0, int sparse_summary=0, "
      "Tensor? block_map=None, int block_q=128, int block_k=128, int num_splits=1, "
      "Tensor? cache_seqlens=None, bool causal_lower_right=False, "
      "bool window_follows_causal=False) -> (Tensor out, Tensor lse)");
  // Not differentiable: it writes into `out`, and its autograd kernel (autograd.cpp) raises
  // when autograd would record it. attention_forward is the differentiable op.
  m.def(
      "attention_forward_into(Tensor query, Tensor key, Tensor value, Tensor(a!) out, "
      "float? scale=None, bool causal=False, int kv_stride=1, str backend='auto') -> ()");
  m.def(
      "attention_backward(Tensor dout, Tensor query, Tensor key, Tensor value, Tensor out, "
      "Tensor lse, float? scale=None, bool causal=False, int kv_stride=1, "
      "bool deterministic=False, str backend='auto', Tensor? attn_mask=None, int window_left=-1, "
      "int window_right=-1, str sparse_pattern='none', int sparse_block=0, "
      "int sparse_summary=0, Tensor? block_map=None, int block_q=128, int block_k=128, "
      "Tensor? cache_seqlens=None, bool causal_lower_right=False, "
      "bool window_follows_causal=False) -> (Tensor dq, Tensor dk, Tensor dv)");
  // Not differentiable: its autograd kernel (autograd.cpp) raises when autograd would record it.
  m.def(
      "paged_attention_forward(Tensor query, Tensor key_cache, Tensor value_cache, "
      "Tensor block_table, Tensor cache_seqlens, float? scale=None, bool causal=False, "
      "bool causal_lower_right=False, int num_splits=1, bool return_lse=False, "
      "str backend='auto') -> (Tensor out, Tensor lse)");
  m.def(
      "varlen_attention_forward(Tensor query, Tensor key, Tensor value, Tensor cu_seqlens_q, "
      "Tensor cu_seqlens_k, int max_seqlen_q, int max_seqlen_k, float? scale=None, "
      "bool causal=False, int window_left=-1, int window_right=-1, bool return_lse=False, "
      "str backend='auto', bool causal_lower_right=False, bool window_follows_causal=False) "
      "-> (Tensor out, Tensor lse)");
  m.def(
      "varlen_attention_backward(Tensor dout, Tensor query, Tensor key, Tensor value, "
      "Tensor out, Tensor lse, Tensor cu_seqlens_q, Tensor cu_seqlens_k, int max_seqlen_q, "
      "int max_seqlen_k, float? scale=None, bool causal=False, int window_left=-1, "
      "int window_right=-1, bool causal_lower_right=False, bool window_follows_causal=False) "
      "-> (Tensor dq, Tensor dk, Tensor dv)");
  m.def(
      "selected_backend(Tensor query, Tensor key, Tensor value, bool causal=False, "
      "int kv_stride=1, str backend='auto', Tensor? attn_mask=None, int window_left=-1, "
      "int window_right=-1, str sparse_pattern='none', int sparse_block=0, "
      "int sparse_summary=0, Tensor? block_map=None, int block_q=128, int block_k=128, "
      "int num_splits=1, bool detail=False, Tensor? cache_seqlens=None, "
      "bool causal_lower_right=False, bool window_follows_causal=False) -> str");
  m.def(
      "selected_backward_backend(Tensor query, Tensor key, Tensor value, bool causal=False, "
      "int kv_stride=1, str backend='auto') -> str");
}

TORCH_LIBRARY_IMPL(samattn, CUDA, m) {
  m.impl("attention_forward", &attention_forward_op);
  m.impl("paged_attention_forward", &paged_forward_op);
  m.impl("varlen_attention_forward", &varlen_forward_op);
  m.impl("varlen_attention_backward", &varlen_backward_op);
  m.impl("attention_forward_into", &attention_forward_into_op);
  m.impl("attention_backward", &attention_backward_op);
  m.impl("selected_backend", &selected_backend_op);
  m.impl("selected_backward_backend", &selected_backward_backend_op);
}

TORCH_LIBRARY_IMPL(samattn, CPU, m) {
  m.impl("attention_forward", &attention_forward_op);
  m.impl("paged_attention_forward", &paged_forward_op);
  m.impl("varlen_attention_forward", &varlen_forward_op);
  m.impl("varlen_attention_backward", &varlen_backward_op);
  m.impl("attention_forward_into", &attention_forward_into_op);
  m.impl("attention_backward", &attention_backward_op);
}

}  // namespace samattn::torch_ops
