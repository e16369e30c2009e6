// Argument checks of gemm() and softmax(): every message names the field and the expected value.
#include <cmath>
#include <cstdlib>
#include <string>

#include "common/check.h"
#include "gemm/gemm_internal.h"
#include "samattn/gemm.h"

namespace samattn {
namespace {

bool valid_dtype(DType dtype) {
  return dtype == DType::kFloat64 || dtype == DType::kFloat32 || dtype == DType::kFloat16 ||
         dtype == DType::kBFloat16;
}

// The largest offset an operand of `rows` x `cols` (x batch) reaches, for the overflow check.
bool offsets_fit(int64_t batch, int64_t rows, int64_t cols, int64_t bs, int64_t rs, int64_t cs) {
  const long double top = static_cast<long double>(batch - 1) * bs +
                          static_cast<long double>(rows - 1) * rs +
                          static_cast<long double>(cols - 1) * cs;
  return top < 9.0e18L;
}

// True when the rows x cols (x batch) elements at these strides never share an address: one
// of the two matrix strides is the fastest and the other steps over a whole line of it, and
// each batch steps over a whole matrix.
bool distinct_elements(int64_t batch, int64_t rows, int64_t cols, int64_t bs, int64_t rs,
                       int64_t cs) {
  const int64_t r = rows > 1 ? rs : 0, c = cols > 1 ? cs : 0;
  bool matrix_ok;
  if (rows > 1 && cols > 1) {
    matrix_ok = (c >= 1 && r >= c * cols) || (r >= 1 && c >= r * rows);
  } else if (rows > 1) {
    matrix_ok = r >= 1;
  } else if (cols > 1) {
    matrix_ok = c >= 1;
  } else {
    matrix_ok = true;
  }
  if (!matrix_ok) return false;
  if (batch <= 1) return true;
  const int64_t extent = (rows - 1) * (rows > 1 ? rs : 0) + (cols - 1) * (cols > 1 ? cs : 0) + 1;
  return bs >= extent;
}

}  // namespace

GemmParams make_row_major_gemm(DType dtype, const void* a, const void* b, void* c, int64_t m,
                               int64_t n, int64_t k) {
  GemmParams p;
  p.dtype = dtype;
  p.a = a;
  p.b = b;
  p.c = c;
  p.m = m;
  p.n = n;
  p.k = k;
  p.a_row_stride = k;
  p.a_col_stride = 1;
  p.a_batch_stride = m * k;
  p.b_row_stride = n;
  p.b_col_stride = 1;
  p.b_batch_stride = k * n;
  p.c_row_stride = n;
  p.c_col_stride = 1;
  p.c_batch_stride = m * n;
  return p;
}

Status can_implement_gemm(const GemmParams& p) {
  using detail::concat;
  auto fail = [](std::string message) { return Status::failure("samattn: " + message); };
  if (!valid_dtype(p.dtype)) {
    return fail(concat("dtype ", static_cast<int>(p.dtype),
                       " is not one of float64, float32, float16, bfloat16"));
  }
  if (p.m < 1) return fail(concat("m must be >= 1, got ", p.m));
  if (p.n < 1) return fail(concat("n must be >= 1, got ", p.n));
  if (p.k < 1) return fail(concat("k must be >= 1, got ", p.k));
  if (p.batch < 1) return fail(concat("batch must be >= 1, got ", p.batch));
  if (p.a == nullptr) return fail("a must not be null");
  if (p.b == nullptr) return fail("b must not be null");
  if (p.c == nullptr) return fail("c must not be null");
  const int64_t strides[] = {p.a_row_stride, p.a_col_stride, p.a_batch_stride,
                             p.b_row_stride, p.b_col_stride, p.b_batch_stride,
                             p.c_row_stride, p.c_col_stride, p.c_batch_stride};
  const char* names[] = {"a_row_stride", "a_col_stride", "a_batch_stride",
                         "b_row_stride", "b_col_stride", "b_batch_stride",
                         "c_row_stride", "c_col_stride", "c_batch_stride"};
  for (int i = 0; i < 9; ++i) {
    if (strides[i] < 0) return fail(concat(names[i], " must be >= 0, got ", strides[i]));
  }
  if (!offsets_fit(p.batch, p.m, p.k, p.a_batch_stride, p.a_row_stride, p.a_col_stride) ||
      !offsets_fit(p.batch, p.k, p.n, p.b_batch_stride, p.b_row_stride, p.b_col_stride) ||
      !offsets_fit(p.batch, p.m, p.n, p.c_batch_stride, p.c_row_stride, p.c_col_stride)) {
    return fail("an element offset of a, b or c does not fit in int64");
  }
  if (!distinct_elements(p.batch, p.m, p.n, p.c_batch_stride, p.c_row_stride, p.c_col_stride)) {
    return fail(concat("c strides (batch ", p.c_batch_stride, ", row ", p.c_row_stride, ", col ",
                       p.c_col_stride, ") make elements of the ", p.batch, " x ", p.m, " x ", p.n,
                       " output overlap"));
  }
  if (!std::isfinite(p.alpha)) return fail(concat("alpha must be finite, got ", p.alpha));
  if (!std::isfinite(p.beta)) return fail(concat("beta must be finite, got ", p.beta));
  if (p.allow_tf32 && p.dtype != DType::kFloat32) {
    return fail(concat("allow_tf32 applies to float32 only, got dtype ", dtype_name(p.dtype)));
  }
  const int backend = static_cast<int>(p.backend);
  if (backend < static_cast<int>(GemmBackend::kAuto) ||
      backend > static_cast<int>(GemmBackend::kSm90)) {
    return fail(concat("backend ", backend, " is not one of auto, simt, sm80, sm90"));
  }
  const bool tensor_core_dtype = p.dtype == DType::kFloat16 || p.dtype == DType::kBFloat16 ||
                                 (p.dtype == DType::kFloat32 && p.allow_tf32);
  if ((p.backend == GemmBackend::kSm80 || p.backend == GemmBackend::kSm90) && !tensor_core_dtype) {
    return fail(concat("backend ", gemm_backend_name(p.backend),
                       " runs float16, bfloat16 or float32 with allow_tf32 (tensor cores), got ",
                       dtype_name(p.dtype),
                       p.dtype == DType::kFloat32 ? " without allow_tf32" : ""));
  }
  return detail::forced_gemm_backend_status(p);
}

Status can_implement_softmax(const SoftmaxParams& p) {
  using detail::concat;
  auto fail = [](std::string message) { return Status::failure("samattn: " + message); };
  if (!valid_dtype(p.dtype)) {
    return fail(concat("dtype ", static_cast<int>(p.dtype),
                       " is not one of float64, float32, float16, bfloat16"));
  }
  if (p.batch < 1) return fail(concat("batch must be >= 1, got ", p.batch));
  if (p.rows < 1) return fail(concat("rows must be >= 1, got ", p.rows));
  if (p.cols < 1) return fail(concat("cols must be >= 1, got ", p.cols));
  if (p.in == nullptr) return fail("in must not be null");
  if (p.out == nullptr) return fail("out must not be null");
  if (p.in_row_stride < 0 || p.in_batch_stride < 0) {
    return fail(concat("in strides must be >= 0, got row ", p.in_row_stride, ", batch ",
                       p.in_batch_stride));
  }
  if (!distinct_elements(p.batch, p.rows, p.cols, p.out_batch_stride, p.out_row_stride, 1)) {
    return fail(concat("out strides (batch ", p.out_batch_stride, ", row ", p.out_row_stride,
                       ") make elements of the ", p.batch, " x ", p.rows, " x ", p.cols,
                       " output overlap"));
  }
  if (!std::isfinite(p.scale)) return fail(concat("scale must be finite, got ", p.scale));
  return Status::success();
}

}  // namespace samattn
