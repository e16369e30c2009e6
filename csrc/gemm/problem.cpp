// Layout normalisations shared by the GEMM launchers.
#include <limits>

#include "gemm/gemm_internal.h"

namespace samattn::detail {

GemmParams transposed_problem(const GemmParams& p) {
  GemmParams t = p;
  t.m = p.n;
  t.n = p.m;
  t.a = p.b;
  t.a_row_stride = p.b_col_stride;
  t.a_col_stride = p.b_row_stride;
  t.a_batch_stride = p.b_batch_stride;
  t.b = p.a;
  t.b_row_stride = p.a_col_stride;
  t.b_col_stride = p.a_row_stride;
  t.b_batch_stride = p.a_batch_stride;
  t.c_row_stride = p.c_col_stride;
  t.c_col_stride = p.c_row_stride;
  return t;
}

GemmParams with_row_major_c(const GemmParams& p) {
  // A dimension of size 1 has no meaningful stride.
  constexpr int64_t kNone = std::numeric_limits<int64_t>::max();
  const int64_t row = p.m > 1 ? p.c_row_stride : kNone;
  const int64_t col = p.n > 1 ? p.c_col_stride : kNone;
  return row < col ? transposed_problem(p) : p;
}

bool walk_along_mn(int64_t mn, int64_t k, int64_t mn_stride, int64_t k_stride) {
  if (mn == 1) return false;
  if (k == 1) return true;
  if (k_stride == 1) return false;
  if (mn_stride == 1) return true;
  return mn_stride < k_stride;
}

}  // namespace samattn::detail
