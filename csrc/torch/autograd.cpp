// Autograd of the attention operators, registered under the dispatcher's Autograd key. A call
// records a backward node only when grad mode is on and a tensor argument requires grad;
// otherwise it goes straight to the CPU or CUDA kernel. Registered from Python with
// torch.library.register_autograd, the same formulas cost ~6 µs of host time per call without
// gradients and ~90 µs per call that records a node (benchmarks/bench_host_overhead.py, stop 49:
// benchmarks/results/cpu-2026-12-04-0b3ef93-host_overhead.json).
#include <optional>
#include <string>
#include <tuple>
#include <utility>

#include <ATen/Context.h>
#include <ATen/core/Tensor.h>
#include <torch/csrc/autograd/custom_function.h>
#include <torch/library.h>

#include "autograd_support.h"

namespace samattn::torch_ops {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;
using OptionalTensor = std::optional<at::Tensor>;

using AttentionForwardSignature = std::tuple<at::Tensor, at::Tensor>(
    const at::Tensor&, const at::Tensor&, const at::Tensor&, std::optional<double>, bool, int64_t,
    bool, c10::string_view, const OptionalTensor&, int64_t, int64_t, c10::string_view, int64_t,
    int64_t, const OptionalTensor&, int64_t, int64_t, int64_t, const OptionalTensor&, bool, bool);
using AttentionBackwardSignature = std::tuple<at::Tensor, at::Tensor, at::Tensor>(
    const at::Tensor&, const at::Tensor&, const at::Tensor&, const at::Tensor&, const at::Tensor&,
    const at::Tensor&, std::optional<double>, bool, int64_t, bool, c10::string_view,
    const OptionalTensor&, int64_t, int64_t, c10::string_view, int64_t, int64_t,
    const OptionalTensor&, int64_t, int64_t, const OptionalTensor&, bool, bool);
using AttentionForwardIntoSignature = void(const at::Tensor&, const at::Tensor&, const at::Tensor&,
                                           const at::Tensor&, std::optional<double>, bool, int64_t,
                                           c10::string_view);
using PagedForwardSignature = std::tuple<at::Tensor, at::Tensor>(
    const at::Tensor&, const at::Tensor&, const at::Tensor&, const at::Tensor&, const at::Tensor&,
    std::optional<double>, bool, bool, int64_t, bool, c10::string_view);
using VarlenForwardSignature = std::tuple<at::Tensor, at::Tensor>(
    const at::Tensor&, const at::Tensor&, const at::Tensor&, const at::Tensor&, const at::Tensor&,
    int64_t, int64_t, std::optional<double>, bool, int64_t, int64_t, bool, c10::string_view, bool,
    bool);
using VarlenBackwardSignature = std::tuple<at::Tensor, at::Tensor, at::Tensor>(
    const at::Tensor&, const at::Tensor&, const at::Tensor&, const at::Tensor&, const at::Tensor&,
    const at::Tensor&, const at::Tensor&, const at::Tensor&, int64_t, int64_t,
    std::optional<double>, bool, int64_t, int64_t, bool, bool);

const OperatorHandle<AttentionForwardSignature> attention_forward_op("samattn::attention_forward");
const OperatorHandle<AttentionBackwardSignature> attention_backward_op(
    "samattn::attention_backward");
const OperatorHandle<AttentionForwardIntoSignature> attention_forward_into_op(
    "samattn::attention_forward_into");
const OperatorHandle<PagedForwardSignature> paged_forward_op("samattn::paged_attention_forward");
const OperatorHandle<VarlenForwardSignature> varlen_forward_op("samattn::varlen_attention_forward");
const OperatorHandle<VarlenBackwardSignature> varlen_backward_op(
    "samattn::varlen_attention_backward");

const at::Tensor& or_undefined(const OptionalTensor& t) {
  static const at::Tensor undefined;
  return t.has_value() ? *t : undefined;
}

OptionalTensor optional_of(const at::Tensor& t) {
  return t.defined() ? OptionalTensor(t) : std::nullopt;
}

// dout with a contiguous last dimension, which the kernels need (the expanded gradient of
// out.sum() has stride 0 there).
at::Tensor rows_contiguous(const at::Tensor& dout) {
  return dout.stride(-1) == 1 ? dout : dout.contiguous();
}

// Keeps a node's non-tensor arguments, by name, for its backward.
void save_options(AutogradContext* ctx,
                  std::initializer_list<std::pair<const char*, c10::IValue>> options) {
  for (const auto& [name, value] : options) ctx->saved_data[name] = value;
}

// The non-tensor arguments of attention_forward, kept on the node for the backward.
struct AttentionOptions {
  std::optional<double> scale;
  bool causal;
  int64_t kv_stride;
  std::string backend;
  int64_t window_left, window_right;
  std::string sparse_pattern;
  int64_t sparse_block, sparse_summary, block_q, block_k, num_splits;
  bool causal_lower_right, window_follows_causal;

  void save(AutogradContext* ctx) const {
    save_options(ctx, {{"scale", scale},
                       {"causal", causal},
                       {"kv_stride", kv_stride},
                       {"backend", backend},
                       {"window_left", window_left},
                       {"window_right", window_right},
                       {"sparse_pattern", sparse_pattern},
                       {"sparse_block", sparse_block},
                       {"sparse_summary", sparse_summary},
                       {"block_q", block_q},
                       {"block_k", block_k},
                       {"num_splits", num_splits},
                       {"causal_lower_right", causal_lower_right},
                       {"window_follows_causal", window_follows_causal}});
  }
  static AttentionOptions load(AutogradContext* ctx) {
    auto& data = ctx->saved_data;
    return {data["scale"].toOptional<double>(),
            data["causal"].toBool(),
            data["kv_stride"].toInt(),
            data["backend"].toStringRef(),
            data["window_left"].toInt(),
            data["window_right"].toInt(),
            data["sparse_pattern"].toStringRef(),
            data["sparse_block"].toInt(),
            data["sparse_summary"].toInt(),
            data["block_q"].toInt(),
            data["block_k"].toInt(),
            data["num_splits"].toInt(),
            data["causal_lower_right"].toBool(),
            data["window_follows_causal"].toBool()};
  }
};

// attention_forward's 21 arguments, in the schema's order (ops.cpp).
constexpr size_t kAttentionForwardArguments = 21;

class AttentionForward : public torch::autograd::Function<AttentionForward> {
 public:
  static variable_list forward(AutogradContext* ctx, const at::Tensor& query, const at::Tensor& key,
                               const at::Tensor& value, std::optional<double> scale, bool causal,
                               int64_t kv_stride, bool return_lse, c10::string_view backend,
                               const OptionalTensor& attn_mask, int64_t window_left,
                               int64_t window_right, c10::string_view sparse_pattern,
                               int64_t sparse_block, int64_t sparse_summary,
                               const OptionalTensor& block_map, int64_t block_q, int64_t block_k,
                               int64_t num_splits, const OptionalTensor& cache_seqlens,
                               bool causal_lower_right, bool window_follows_causal) {
    const at::AutoDispatchBelowADInplaceOrView below_autograd;
    auto [out, lse] = attention_forward_op().call(
        query, key, value, scale, causal, kv_stride, return_lse, backend, attn_mask, window_left,
        window_right, sparse_pattern, sparse_block, sparse_summary, block_map, block_q, block_k,
        num_splits, cache_seqlens, causal_lower_right, window_follows_causal);
    ctx->save_for_backward({query, key, value, out, lse, or_undefined(attn_mask),
                            or_undefined(block_map), or_undefined(cache_seqlens)});
    ctx->mark_non_differentiable({lse});
    AttentionOptions{scale,
                     causal,
                     kv_stride,
                     std::string(backend),
                     window_left,
                     window_right,
                     std::string(sparse_pattern),
                     sparse_block,
                     sparse_summary,
                     block_q,
                     block_k,
                     num_splits,
                     causal_lower_right,
                     window_follows_causal}
        .save(ctx);
    return {out, lse};
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const variable_list saved = ctx->get_saved_variables();
    const at::Tensor &query = saved[0], &key = saved[1], &value = saved[2], &out = saved[3];
    at::Tensor lse = saved[4];
    const OptionalTensor attn_mask = optional_of(saved[5]), block_map = optional_of(saved[6]),
                         cache_seqlens = optional_of(saved[7]);
    const AttentionOptions o = AttentionOptions::load(ctx);
    if (lse.dim() != 3) {  // the forward ran with return_lse=False: recompute it
      lse = std::get<1>(attention_forward_op().call(
          query, key, value, o.scale, o.causal, o.kv_stride, true, o.backend, attn_mask,
          o.window_left, o.window_right, o.sparse_pattern, o.sparse_block, o.sparse_summary,
          block_map, o.block_q, o.block_k, o.num_splits, cache_seqlens, o.causal_lower_right,
          o.window_follows_causal));
    }
    // torch.use_deterministic_algorithms(True) selects the atomic-free dQ kernels (bit-identical
    // dq across runs); the forward's backend picks the backward's.
    auto [dq, dk, dv] = attention_backward_op().call(
        rows_contiguous(grads[0]), query, key, value, out, lse, o.scale, o.causal, o.kv_stride,
        at::globalContext().deterministicAlgorithms(), o.backend, attn_mask, o.window_left,
        o.window_right, o.sparse_pattern, o.sparse_block, o.sparse_summary, block_map, o.block_q,
        o.block_k, cache_seqlens, o.causal_lower_right, o.window_follows_causal);
    variable_list input_grads(kAttentionForwardArguments);  // undefined: no gradient
    input_grads[0] = dq;
    input_grads[1] = dk;
    input_grads[2] = dv;
    return input_grads;
  }
};

// varlen_attention_forward's 15 arguments, in the schema's order (ops.cpp).
constexpr size_t kVarlenForwardArguments = 15;

class VarlenForward : public torch::autograd::Function<VarlenForward> {
 public:
  static variable_list forward(AutogradContext* ctx, const at::Tensor& query, const at::Tensor& key,
                               const at::Tensor& value, const at::Tensor& cu_seqlens_q,
                               const at::Tensor& cu_seqlens_k, int64_t max_seqlen_q,
                               int64_t max_seqlen_k, std::optional<double> scale, bool causal,
                               int64_t window_left, int64_t window_right, bool return_lse,
                               c10::string_view backend, bool causal_lower_right,
                               bool window_follows_causal) {
    const at::AutoDispatchBelowADInplaceOrView below_autograd;
    auto [out, lse] = varlen_forward_op().call(
        query, key, value, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, scale, causal,
        window_left, window_right, return_lse, backend, causal_lower_right, window_follows_causal);
    ctx->save_for_backward({query, key, value, out, lse, cu_seqlens_q, cu_seqlens_k});
    ctx->mark_non_differentiable({lse});
    save_options(ctx, {{"max_seqlen_q", max_seqlen_q},
                       {"max_seqlen_k", max_seqlen_k},
                       {"scale", scale},
                       {"causal", causal},
                       {"window_left", window_left},
                       {"window_right", window_right},
                       {"backend", std::string(backend)},
                       {"causal_lower_right", causal_lower_right},
                       {"window_follows_causal", window_follows_causal}});
    return {out, lse};
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const variable_list saved = ctx->get_saved_variables();
    const at::Tensor &query = saved[0], &key = saved[1], &value = saved[2], &out = saved[3];
    const at::Tensor &cu_seqlens_q = saved[5], &cu_seqlens_k = saved[6];
    at::Tensor lse = saved[4];
    auto& data = ctx->saved_data;
    const int64_t max_seqlen_q = data["max_seqlen_q"].toInt();
    const int64_t max_seqlen_k = data["max_seqlen_k"].toInt();
    const std::optional<double> scale = data["scale"].toOptional<double>();
    const bool causal = data["causal"].toBool();
    const int64_t window_left = data["window_left"].toInt();
    const int64_t window_right = data["window_right"].toInt();
    const bool causal_lower_right = data["causal_lower_right"].toBool();
    const bool window_follows_causal = data["window_follows_causal"].toBool();
    if (lse.dim() != 2) {  // the forward ran with return_lse=False: recompute it
      lse = std::get<1>(varlen_forward_op().call(
          query, key, value, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, scale, causal,
          window_left, window_right, true, data["backend"].toStringRef(), causal_lower_right,
          window_follows_causal));
    }
    auto [dq, dk, dv] = varlen_backward_op().call(
        rows_contiguous(grads[0]), query, key, value, out, lse, cu_seqlens_q, cu_seqlens_k,
        max_seqlen_q, max_seqlen_k, scale, causal, window_left, window_right, causal_lower_right,
        window_follows_causal);
    variable_list input_grads(kVarlenForwardArguments);
    input_grads[0] = dq;
    input_grads[1] = dk;
    input_grads[2] = dv;
    return input_grads;
  }
};

// The backward operators are differentiable only to say that their own gradient is not
// implemented: without a node, autograd would treat them as constants (zeros) when a caller
// differentiates the gradients (autograd.grad(..., create_graph=True)).
template <typename Signature>
class NoDoubleBackward : public torch::autograd::Function<NoDoubleBackward<Signature>> {
 public:
  template <typename... Args>
  static variable_list forward(AutogradContext*, const c10::TypedOperatorHandle<Signature>& op,
                               Args&&... args) {
    const at::AutoDispatchBelowADInplaceOrView below_autograd;
    auto [dq, dk, dv] = op.call(std::forward<Args>(args)...);
    return {dq, dk, dv};
  }
  static variable_list backward(AutogradContext*, variable_list) {
    TORCH_CHECK(false,
                "samattn: double backward (differentiating attention_backward, e.g. after "
                "autograd.grad(..., create_graph=True)) is not supported");
    return {};
  }
};

std::tuple<at::Tensor, at::Tensor> attention_forward_autograd(
    const at::Tensor& query, const at::Tensor& key, const at::Tensor& value,
    std::optional<double> scale, bool causal, int64_t kv_stride, bool return_lse,
    c10::string_view backend, const OptionalTensor& attn_mask, int64_t window_left,
    int64_t window_right, c10::string_view sparse_pattern, int64_t sparse_block,
    int64_t sparse_summary, const OptionalTensor& block_map, int64_t block_q, int64_t block_k,
    int64_t num_splits, const OptionalTensor& cache_seqlens, bool causal_lower_right,
    bool window_follows_causal) {
  // attn_mask counts: it gets no gradient, but the output still joins the graph, as in torch.
  if (!records_graph({&query, &key, &value, &or_undefined(attn_mask)})) {
    const at::AutoDispatchBelowADInplaceOrView below_autograd;
    return attention_forward_op().call(
        query, key, value, scale, causal, kv_stride, return_lse, backend, attn_mask, window_left,
        window_right, sparse_pattern, sparse_block, sparse_summary, block_map, block_q, block_k,
        num_splits, cache_seqlens, causal_lower_right, window_follows_causal);
  }
  const variable_list outputs = AttentionForward::apply(
      query, key, value, scale, causal, kv_stride, return_lse, backend, attn_mask, window_left,
      window_right, sparse_pattern, sparse_block, sparse_summary, block_map, block_q, block_k,
      num_splits, cache_seqlens, causal_lower_right, window_follows_causal);
  return {outputs[0], outputs[1]};
}

std::tuple<at::Tensor, at::Tensor> varlen_forward_autograd(
    const at::Tensor& query, const at::Tensor& key, const at::Tensor& value,
    const at::Tensor& cu_seqlens_q, const at::Tensor& cu_seqlens_k, int64_t max_seqlen_q,
    int64_t max_seqlen_k, std::optional<double> scale, bool causal, int64_t window_left,
    int64_t window_right, bool return_lse, c10::string_view backend, bool causal_lower_right,
    bool window_follows_causal) {
  if (!records_graph({&query, &key, &value})) {
    const at::AutoDispatchBelowADInplaceOrView below_autograd;
    return varlen_forward_op().call(query, key, value, cu_seqlens_q, cu_seqlens_k, max_seqlen_q,
                                    max_seqlen_k, scale, causal, window_left, window_right,
                                    return_lse, backend, causal_lower_right, window_follows_causal);
  }
  const variable_list outputs = VarlenForward::apply(
      query, key, value, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, scale, causal,
      window_left, window_right, return_lse, backend, causal_lower_right, window_follows_causal);
  return {outputs[0], outputs[1]};
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> attention_backward_autograd(
    const at::Tensor& dout, const at::Tensor& query, const at::Tensor& key, const at::Tensor& value,
    const at::Tensor& out, const at::Tensor& lse, std::optional<double> scale, bool causal,
    int64_t kv_stride, bool deterministic, c10::string_view backend,
    const OptionalTensor& attn_mask, int64_t window_left, int64_t window_right,
    c10::string_view sparse_pattern, int64_t sparse_block, int64_t sparse_summary,
    const OptionalTensor& block_map, int64_t block_q, int64_t block_k,
    const OptionalTensor& cache_seqlens, bool causal_lower_right, bool window_follows_causal) {
  const auto& op = attention_backward_op();
  if (!records_graph({&dout, &query, &key, &value, &out, &or_undefined(attn_mask)})) {
    const at::AutoDispatchBelowADInplaceOrView below_autograd;
    return op.call(dout, query, key, value, out, lse, scale, causal, kv_stride, deterministic,
                   backend, attn_mask, window_left, window_right, sparse_pattern, sparse_block,
                   sparse_summary, block_map, block_q, block_k, cache_seqlens, causal_lower_right,
                   window_follows_causal);
  }
  const variable_list grads = NoDoubleBackward<AttentionBackwardSignature>::apply(
      op, dout, query, key, value, out, lse, scale, causal, kv_stride, deterministic, backend,
      attn_mask, window_left, window_right, sparse_pattern, sparse_block, sparse_summary, block_map,
      block_q, block_k, cache_seqlens, causal_lower_right, window_follows_causal);
  return {grads[0], grads[1], grads[2]};
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> varlen_backward_autograd(
    const at::Tensor& dout, const at::Tensor& query, const at::Tensor& key, const at::Tensor& value,
    const at::Tensor& out, const at::Tensor& lse, const at::Tensor& cu_seqlens_q,
    const at::Tensor& cu_seqlens_k, int64_t max_seqlen_q, int64_t max_seqlen_k,
    std::optional<double> scale, bool causal, int64_t window_left, int64_t window_right,
    bool causal_lower_right, bool window_follows_causal) {
  const auto& op = varlen_backward_op();
  if (!records_graph({&dout, &query, &key, &value, &out})) {
    const at::AutoDispatchBelowADInplaceOrView below_autograd;
    return op.call(dout, query, key, value, out, lse, cu_seqlens_q, cu_seqlens_k, max_seqlen_q,
                   max_seqlen_k, scale, causal, window_left, window_right, causal_lower_right,
                   window_follows_causal);
  }
  const variable_list grads = NoDoubleBackward<VarlenBackwardSignature>::apply(
      op, dout, query, key, value, out, lse, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
      scale, causal, window_left, window_right, causal_lower_right, window_follows_causal);
  return {grads[0], grads[1], grads[2]};
}

// out's version counter moves with the write, so that autograd sees a tensor it saved change.
void attention_forward_into_autograd(const at::Tensor& query, const at::Tensor& key,
                                     const at::Tensor& value, const at::Tensor& out,
                                     std::optional<double> scale, bool causal, int64_t kv_stride,
                                     c10::string_view backend) {
  refuse_gradients({&query, &key, &value, &out}, "attention_forward_into",
                   "samattn.attention (which returns a new tensor)");
  const at::AutoDispatchBelowAutograd below_autograd;
  attention_forward_into_op().call(query, key, value, out, scale, causal, kv_stride, backend);
  torch::autograd::impl::bump_version(out);
}

// Inference only: a paged cache's pages may be shared between entries, so gradients would have
// to scatter-add into them.
std::tuple<at::Tensor, at::Tensor> paged_forward_autograd(
    const at::Tensor& query, const at::Tensor& key_cache, const at::Tensor& value_cache,
    const at::Tensor& block_table, const at::Tensor& cache_seqlens, std::optional<double> scale,
    bool causal, bool causal_lower_right, int64_t num_splits, bool return_lse,
    c10::string_view backend) {
  TORCH_CHECK(!records_graph({&query, &key_cache, &value_cache}),
              "samattn: paged_attention_forward is not differentiable (inference only); for "
              "gradients call samattn.attention on a dense cache with cache_seqlens");
  const at::AutoDispatchBelowADInplaceOrView below_autograd;
  return paged_forward_op().call(query, key_cache, value_cache, block_table, cache_seqlens, scale,
                                 causal, causal_lower_right, num_splits, return_lse, backend);
}

}  // namespace

TORCH_LIBRARY_IMPL(samattn, Autograd, m) {
  m.impl("paged_attention_forward", &paged_forward_autograd);
  m.impl("attention_forward", &attention_forward_autograd);
  m.impl("attention_forward_into", &attention_forward_into_autograd);
  m.impl("varlen_attention_forward", &varlen_forward_autograd);
  m.impl("attention_backward", &attention_backward_autograd);
  m.impl("varlen_attention_backward", &varlen_backward_autograd);
}

}  // namespace samattn::torch_ops
