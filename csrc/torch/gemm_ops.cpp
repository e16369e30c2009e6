// The GEMM and row-softmax torch operators: CUDA kernels under the CUDA key, the fp64 reference
// under the CPU key. A separate TORCH_LIBRARY_FRAGMENT of the samattn namespace.
#include <string>
#include <string_view>
#include <vector>

#include <ATen/ATen.h>
#include <ATen/MemoryOverlap.h>
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAGuard.h>
#include <torch/library.h>

#include "common/check.h"
#include "samattn/gemm.h"
#include "torch_checks.h"

namespace samattn::torch_ops {
namespace {

// Checks a and b (2-D (M, K) x (K, N) or 3-D batched) and returns the output's shape.
std::vector<int64_t> check_operands(const at::Tensor& a, const at::Tensor& b) {
  SAMATTN_CHECK_VALUE(a.defined(), "a must be a tensor, got None");
  SAMATTN_CHECK_VALUE(b.defined(), "b must be a tensor, got None");
  to_dtype(a.scalar_type(), "a");
  SAMATTN_CHECK_TYPE(b.scalar_type() == a.scalar_type(), "b dtype (",
                     c10::toString(b.scalar_type()), ") must match a dtype (",
                     c10::toString(a.scalar_type()), ")");
  SAMATTN_CHECK_VALUE(a.device().is_cuda() || a.device().is_cpu(),
                      "a must be on a CUDA device or the CPU, got ", a.device().str());
  SAMATTN_CHECK_VALUE(b.device() == a.device(), "b is on ", b.device().str(), " but a is on ",
                      a.device().str(), "; both operands must be on one device");
  SAMATTN_CHECK_VALUE(!a.is_sparse() && !b.is_sparse(), "a and b must be dense tensors");
  SAMATTN_CHECK_VALUE(a.dim() == 2 || a.dim() == 3,
                      "a must be 2-D (M, K) or 3-D (batch, M, K), got shape ",
                      shape_list(a.sizes()));
  SAMATTN_CHECK_VALUE(b.dim() == a.dim(), "b must have a's rank (", a.dim(), "-D), got shape ",
                      shape_list(b.sizes()));
  const int64_t k = a.size(-1);
  SAMATTN_CHECK_VALUE(b.size(-2) == k, "b.shape[-2] (", b.size(-2), ") must equal a.shape[-1] (", k,
                      "): the inner (K) dimensions of a ", shape_list(a.sizes()), " and b ",
                      shape_list(b.sizes()), " differ");
  if (a.dim() == 3) {
    SAMATTN_CHECK_VALUE(b.size(0) == a.size(0), "batch sizes differ: a ", a.size(0), ", b ",
                        b.size(0));
    return {a.size(0), a.size(1), b.size(2)};
  }
  return {a.size(0), b.size(1)};
}

void check_out(const at::Tensor& out, const at::Tensor& a, const std::vector<int64_t>& shape) {
  SAMATTN_CHECK_VALUE(out.defined(), "out must be a tensor, got None");
  SAMATTN_CHECK_TYPE(out.scalar_type() == a.scalar_type(), "out dtype (",
                     c10::toString(out.scalar_type()), ") must match a dtype (",
                     c10::toString(a.scalar_type()), ")");
  SAMATTN_CHECK_VALUE(out.device() == a.device(), "out is on ", out.device().str(), " but a is on ",
                      a.device().str());
  SAMATTN_CHECK_VALUE(out.sizes() == at::IntArrayRef(shape), "out must have shape ",
                      shape_list(shape), ", got ", shape_list(out.sizes()));
}

// Strides of the last two dimensions, and of the first for 3-D tensors (0 for 2-D).
void strides_of(const at::Tensor& t, int64_t& row, int64_t& col, int64_t& batch) {
  row = t.stride(-2);
  col = t.stride(-1);
  batch = t.dim() == 3 ? t.stride(0) : 0;
}

GemmBackend to_gemm_backend(c10::string_view backend) {
  const std::string_view name(backend.data(), backend.size());
  if (name == "auto") return GemmBackend::kAuto;
  if (name == "simt") return GemmBackend::kSimt;
  if (name == "sm80") return GemmBackend::kSm80;
  if (name == "sm90") return GemmBackend::kSm90;
  SAMATTN_CHECK_VALUE(false, "backend must be one of 'auto', 'simt', 'sm80', 'sm90', got '", name,
                      "'");
}

// The GemmParams of C = A B over checked operands (2-D or batched 3-D, any strides).
GemmParams bind_gemm(const at::Tensor& a, const at::Tensor& b, const at::Tensor& out) {
  GemmParams p;
  p.dtype = to_dtype(a.scalar_type(), "a");
  p.a = a.data_ptr();
  p.b = b.data_ptr();
  p.c = out.data_ptr();
  p.batch = a.dim() == 3 ? a.size(0) : 1;
  p.m = a.size(-2);
  p.k = a.size(-1);
  p.n = b.size(-1);
  strides_of(a, p.a_row_stride, p.a_col_stride, p.a_batch_stride);
  strides_of(b, p.b_row_stride, p.b_col_stride, p.b_batch_stride);
  strides_of(out, p.c_row_stride, p.c_col_stride, p.c_batch_stride);
  return p;
}

void run_gemm(const at::Tensor& a, const at::Tensor& b, const at::Tensor& out, double alpha,
              double beta, bool allow_tf32, c10::string_view backend) {
  GemmParams p = bind_gemm(a, b, out);
  p.alpha = alpha;
  p.beta = beta;
  p.allow_tf32 = allow_tf32 && p.dtype == DType::kFloat32;
  const GemmBackend chosen = to_gemm_backend(backend);  // the name is checked on every device
  // CPU tensors run the fp64 reference, which has no kernel families to choose from.
  p.backend = a.is_cuda() ? chosen : GemmBackend::kAuto;
  if (out.numel() == 0) return;
  if (p.k == 0) {  // an empty sum: C = beta * C
    if (beta == 0.0) {
      out.zero_();
    } else {
      out.mul_(beta);
    }
    return;
  }
  const Status status = can_implement_gemm(p);
  TORCH_CHECK_VALUE(status.ok(), status.message());
  try {
    if (a.is_cuda()) {
      const c10::cuda::CUDAGuard guard(a.device());
      gemm(p, at::cuda::getCurrentCUDAStream(a.device().index()));
    } else {
      reference_gemm(p);
    }
  } catch (const Error& error) {
    TORCH_CHECK_VALUE(false, error.what());
  }
}

at::Tensor gemm_op(const at::Tensor& a, const at::Tensor& b, double alpha, bool allow_tf32,
                   c10::string_view backend) {
  const std::vector<int64_t> shape = check_operands(a, b);
  at::Tensor out = at::empty(shape, a.options());
  run_gemm(a, b, out, alpha, 0.0, allow_tf32, backend);
  return out;
}

void gemm_out_op(const at::Tensor& a, const at::Tensor& b, const at::Tensor& out, double alpha,
                 double beta, bool allow_tf32, c10::string_view backend) {
  const std::vector<int64_t> shape = check_operands(a, b);
  check_out(out, a, shape);
  at::assert_no_overlap(out, a);  // C is written while A and B are still read
  at::assert_no_overlap(out, b);
  run_gemm(a, b, out, alpha, beta, allow_tf32, backend);
}

// Softmax over the last dimension; `causal` hides column j > i of each (rows, cols) matrix of
// the last two dimensions. Returns a contiguous tensor of x's shape and dtype.
at::Tensor softmax_op(const at::Tensor& x, double scale, bool causal) {
  SAMATTN_CHECK_VALUE(x.defined(), "x must be a tensor, got None");
  const DType dtype = to_dtype(x.scalar_type(), "x");
  SAMATTN_CHECK_VALUE(x.device().is_cuda() || x.device().is_cpu(),
                      "x must be on a CUDA device or the CPU, got ", x.device().str());
  SAMATTN_CHECK_VALUE(x.dim() >= 1, "x must have at least 1 dimension");
  SAMATTN_CHECK_VALUE(!causal || x.dim() >= 2,
                      "causal softmax needs x with at least 2 dimensions (rows, cols), got shape ",
                      shape_list(x.sizes()));
  at::Tensor out = at::empty(x.sizes(), x.options().memory_format(at::MemoryFormat::Contiguous));
  if (x.numel() == 0) return out;
  const int64_t cols = x.size(-1);
  const int64_t rows = x.dim() >= 2 ? x.size(-2) : 1;
  at::Tensor x3 = x.reshape({-1, rows, cols});
  if (x3.stride(2) != 1) x3 = x3.contiguous();
  SoftmaxParams p;
  p.in = x3.data_ptr();
  p.out = out.data_ptr();
  p.dtype = dtype;
  p.batch = x3.size(0);
  p.rows = rows;
  p.cols = cols;
  p.in_row_stride = x3.stride(1);
  p.in_batch_stride = x3.stride(0);
  p.out_row_stride = cols;
  p.out_batch_stride = rows * cols;
  p.scale = scale;
  p.causal = causal;
  const Status status = can_implement_softmax(p);
  TORCH_CHECK_VALUE(status.ok(), status.message());
  try {
    if (x.is_cuda()) {
      const c10::cuda::CUDAGuard guard(x.device());
      softmax(p, at::cuda::getCurrentCUDAStream(x.device().index()));
    } else {
      reference_softmax(p);
    }
  } catch (const Error& error) {
    TORCH_CHECK_VALUE(false, error.what());
  }
  return out;
}

std::string gemm_kernel_op(const at::Tensor& a, const at::Tensor& b, bool allow_tf32,
                           c10::string_view backend) {
  const std::vector<int64_t> shape = check_operands(a, b);
  TORCH_CHECK_VALUE(a.is_cuda(),
                    "samattn: gemm_kernel needs CUDA tensors; CPU tensors run "
                    "the fp64 reference");
  const at::Tensor out = at::empty(shape, a.options());
  GemmParams p = bind_gemm(a, b, out);
  p.allow_tf32 = allow_tf32 && p.dtype == DType::kFloat32;
  p.backend = to_gemm_backend(backend);
  const c10::cuda::CUDAGuard guard(a.device());
  try {
    return selected_gemm_kernel(p);
  } catch (const Error& error) {
    TORCH_CHECK_VALUE(false, error.what());
  }
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(samattn, m) {
  m.def(
      "gemm(Tensor a, Tensor b, float alpha=1.0, bool allow_tf32=False, str backend='auto') -> "
      "Tensor");
  m.def(
      "gemm_out(Tensor a, Tensor b, Tensor(a!) out, float alpha=1.0, float beta=0.0, "
      "bool allow_tf32=False, str backend='auto') -> ()");
  m.def("softmax(Tensor x, float scale=1.0, bool causal=False) -> Tensor");
  m.def("gemm_kernel(Tensor a, Tensor b, bool allow_tf32=False, str backend='auto') -> str");
}

TORCH_LIBRARY_IMPL(samattn, CUDA, m) {
  m.impl("gemm", &gemm_op);
  m.impl("gemm_out", &gemm_out_op);
  m.impl("softmax", &softmax_op);
  m.impl("gemm_kernel", &gemm_kernel_op);
}

TORCH_LIBRARY_IMPL(samattn, CPU, m) {
  m.impl("gemm", &gemm_op);
  m.impl("gemm_out", &gemm_out_op);
  m.impl("softmax", &softmax_op);
}

}  // namespace samattn::torch_ops
