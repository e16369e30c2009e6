// fp64 CPU references of gemm() and softmax(): the oracles of the tests and the CPU torch ops.
#include <cmath>
#include <limits>
#include <vector>

#include "common/host_float.h"
#include "samattn/gemm.h"

namespace samattn {

void reference_gemm(const GemmParams& params) {
  GemmParams p = params;
  p.backend = GemmBackend::kAuto;  // the reference has no kernel families to choose from
  const Status status = can_implement_gemm(p);
  if (!status.ok()) throw Error(status.message());
  if (p.m == 0 || p.n == 0) return;  // nothing to write (and A or B may be empty)
  for (int64_t l = 0; l < p.batch; ++l) {
    // This batch's A (m x k) and B^T (n x k) as contiguous doubles, converted once rather than
    // per product (the same sums: the conversion is exact and their order is kept).
    const std::vector<double> a = detail::rows_as_double(p.a, p.dtype, l * p.a_batch_stride,
                                                         p.a_row_stride, p.m, p.k, p.a_col_stride);
    const std::vector<double> b_t = detail::rows_as_double(
        p.b, p.dtype, l * p.b_batch_stride, p.b_col_stride, p.n, p.k, p.b_row_stride);
    for (int64_t i = 0; i < p.m; ++i) {
      for (int64_t j = 0; j < p.n; ++j) {
        double sum = 0.0;
        for (int64_t q = 0; q < p.k; ++q) sum += a[i * p.k + q] * b_t[j * p.k + q];
        const int64_t c_offset = l * p.c_batch_stride + i * p.c_row_stride + j * p.c_col_stride;
        // beta == 0 never reads C, so a NaN there does not propagate (BLAS semantics).
        double value = p.alpha * sum;
        if (p.beta != 0.0) value += p.beta * detail::load_as_double(p.c, c_offset, p.dtype);
        detail::store_from_double(p.c, c_offset, p.dtype, value);
      }
    }
  }
}

void reference_softmax(const SoftmaxParams& p) {
  const Status status = can_implement_softmax(p);
  if (!status.ok()) throw Error(status.message());
  std::vector<double> row(p.cols);
  for (int64_t l = 0; l < p.batch; ++l) {
    for (int64_t i = 0; i < p.rows; ++i) {
      const int64_t visible = p.causal ? std::min(p.cols, i + 1) : p.cols;
      double max = -std::numeric_limits<double>::infinity();
      for (int64_t j = 0; j < visible; ++j) {
        row[j] = p.scale * detail::load_as_double(
                               p.in, l * p.in_batch_stride + i * p.in_row_stride + j, p.dtype);
        max = std::max(max, row[j]);
      }
      double sum = 0.0;
      for (int64_t j = 0; j < visible; ++j) {
        row[j] = std::exp(row[j] - max);
        sum += row[j];
      }
      const int64_t out_row = l * p.out_batch_stride + i * p.out_row_stride;
      for (int64_t j = 0; j < p.cols; ++j) {
        detail::store_from_double(p.out, out_row + j, p.dtype, j < visible ? row[j] / sum : 0.0);
      }
    }
  }
}

}  // namespace samattn
