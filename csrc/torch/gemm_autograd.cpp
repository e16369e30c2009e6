// Autograd of the GEMM and row-softmax operators, registered under the dispatcher's Autograd key
// (gemm_out, which writes into out, refuses to be recorded). Without it torch's fallback for an
// operator with no autograd kernel let gradients through samattn.gemm and samattn.softmax silently
// go missing (None, with a deprecation warning).
// gemm's gradients are GEMMs themselves (run by the same operator, so on the GPU by samattn's
// kernels); softmax's is a few elementwise torch operations in float32 (float64 for float64).
#include <ATen/core/Tensor.h>
#include <torch/csrc/autograd/custom_function.h>
#include <torch/library.h>

#include "autograd_support.h"

namespace samattn::torch_ops {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

using GemmSignature = at::Tensor(const at::Tensor&, const at::Tensor&, double, bool,
                                 c10::string_view);
using GemmOutSignature = void(const at::Tensor&, const at::Tensor&, const at::Tensor&, double,
                              double, bool, c10::string_view);
using SoftmaxSignature = at::Tensor(const at::Tensor&, double, bool);

const OperatorHandle<GemmSignature> gemm_op("samattn::gemm");
const OperatorHandle<GemmOutSignature> gemm_out_op("samattn::gemm_out");
const OperatorHandle<SoftmaxSignature> softmax_op("samattn::softmax");

// C = alpha A B (2-D, or batched 3-D): dA = alpha dC B^T, dB = alpha A^T dC, each only when
// asked for. The transposes are views (the operator takes any strides). allow_tf32 carries over;
// the backend does not: a transposed operand may not suit a forced kernel family, so the
// gradients take the fastest that fits ("auto"), which keeps float32 IEEE unless allow_tf32.
class Gemm : public torch::autograd::Function<Gemm> {
 public:
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& a, const at::Tensor& b,
                            double alpha, bool allow_tf32, c10::string_view backend) {
    const at::AutoDispatchBelowADInplaceOrView below_autograd;
    ctx->save_for_backward({a, b});
    ctx->saved_data["alpha"] = alpha;
    ctx->saved_data["allow_tf32"] = allow_tf32;
    return gemm_op().call(a, b, alpha, allow_tf32, backend);
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const variable_list saved = ctx->get_saved_variables();
    const at::Tensor &a = saved[0], &b = saved[1];
    const double alpha = ctx->saved_data["alpha"].toDouble();
    const bool allow_tf32 = ctx->saved_data["allow_tf32"].toBool();
    // The expanded gradient of c.sum() has stride 0, which no tensor-core layout takes.
    const at::Tensor dc =
        grads[0].is_non_overlapping_and_dense() ? grads[0] : grads[0].contiguous();
    at::Tensor da, db;
    if (ctx->needs_input_grad(0)) {
      da = gemm_op().call(dc, b.transpose(-1, -2), alpha, allow_tf32, "auto");
    }
    if (ctx->needs_input_grad(1)) {
      db = gemm_op().call(a.transpose(-1, -2), dc, alpha, allow_tf32, "auto");
    }
    return {da, db, at::Tensor(), at::Tensor(), at::Tensor()};
  }
};

// y = softmax(scale x) over the last dimension (causal: hidden columns 0):
// dx = scale y (dy - sum(dy y)), hidden columns (y = 0) getting 0.
class Softmax : public torch::autograd::Function<Softmax> {
 public:
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, double scale, bool causal) {
    const at::AutoDispatchBelowADInplaceOrView below_autograd;
    at::Tensor y = softmax_op().call(x, scale, causal);
    ctx->save_for_backward({y});
    ctx->saved_data["scale"] = scale;
    return y;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const at::Tensor y = ctx->get_saved_variables()[0];
    const double scale = ctx->saved_data["scale"].toDouble();
    const at::ScalarType accumulate = y.scalar_type() == at::kDouble ? at::kDouble : at::kFloat;
    const at::Tensor y_acc = y.to(accumulate);
    const at::Tensor dy = grads[0].to(accumulate);
    const at::Tensor dx = y_acc.mul(dy.sub(dy.mul(y_acc).sum(-1, /*keepdim=*/true))).mul(scale);
    return {dx.to(y.scalar_type()), at::Tensor(), at::Tensor()};
  }
};

at::Tensor gemm_autograd(const at::Tensor& a, const at::Tensor& b, double alpha, bool allow_tf32,
                         c10::string_view backend) {
  if (!records_graph({&a, &b})) {
    const at::AutoDispatchBelowADInplaceOrView below_autograd;
    return gemm_op().call(a, b, alpha, allow_tf32, backend);
  }
  return Gemm::apply(a, b, alpha, allow_tf32, backend);
}

// out's version counter moves with the write, so that autograd sees a tensor it saved change.
void gemm_out_autograd(const at::Tensor& a, const at::Tensor& b, const at::Tensor& out,
                       double alpha, double beta, bool allow_tf32, c10::string_view backend) {
  refuse_gradients({&a, &b, &out}, "gemm with out=", "samattn.gemm(a, b) without out=");
  const at::AutoDispatchBelowAutograd below_autograd;
  gemm_out_op().call(a, b, out, alpha, beta, allow_tf32, backend);
  torch::autograd::impl::bump_version(out);
}

at::Tensor softmax_autograd(const at::Tensor& x, double scale, bool causal) {
  if (!records_graph({&x})) {
    const at::AutoDispatchBelowADInplaceOrView below_autograd;
    return softmax_op().call(x, scale, causal);
  }
  return Softmax::apply(x, scale, causal);
}

}  // namespace

TORCH_LIBRARY_IMPL(samattn, Autograd, m) {
  m.impl("gemm", &gemm_autograd);
  m.impl("gemm_out", &gemm_out_autograd);
  m.impl("softmax", &softmax_autograd);
}

}  // namespace samattn::torch_ops
