// Host side of the fp32 SGEMM: which calls it takes and how they are normalised for it.
#include "gemm/simt/sgemm_args.h"

#include <cstdint>

#include "gemm/gemm_internal.h"

namespace samattn::detail::simt {
namespace {

constexpr int kVectorElems = 4;  // one 16-byte float4
constexpr int64_t kMaxGridYZ = 65535;

bool aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

// 16-byte vectors along the fast dimension line up when the fast stride is 1 and every other
// stride keeps whole vectors.
bool vectors_align(const void* base, int64_t fast_stride, int64_t slow_stride,
                   int64_t batch_stride) {
  return fast_stride == 1 && slow_stride % kVectorElems == 0 && batch_stride % kVectorElems == 0 &&
         aligned16(base);
}

}  // namespace

bool sgemm_supports(const GemmParams& p) {
  const int64_t limit = int64_t{1} << 31;
  return p.dtype == DType::kFloat32 && p.m < limit && p.n < limit && p.k < limit &&
         (p.m + kSgemmMaxBlockM - 1) / kSgemmMaxBlockM <= kMaxGridYZ &&
         (p.n + kSgemmMaxBlockM - 1) / kSgemmMaxBlockM <= kMaxGridYZ && p.batch <= kMaxGridYZ;
}

SgemmArgs make_sgemm_args(const GemmParams& params) {
  const GemmParams p = with_row_major_c(params);
  SgemmArgs args{};
  args.a = static_cast<const float*>(p.a);
  args.b = static_cast<const float*>(p.b);
  args.c = static_cast<float*>(p.c);
  args.m = static_cast<int>(p.m);
  args.n = static_cast<int>(p.n);
  args.k = static_cast<int>(p.k);
  args.a_rs = p.a_row_stride;
  args.a_cs = p.a_col_stride;
  args.a_bs = p.a_batch_stride;
  args.b_rs = p.b_row_stride;
  args.b_cs = p.b_col_stride;
  args.b_bs = p.b_batch_stride;
  args.c_rs = p.c_row_stride;
  args.c_cs = p.c_col_stride;
  args.c_bs = p.c_batch_stride;
  args.alpha = static_cast<float>(p.alpha);
  args.beta = static_cast<float>(p.beta);
  args.a_m_fast = walk_along_mn(p.m, p.k, p.a_row_stride, p.a_col_stride);
  args.b_k_fast = !walk_along_mn(p.n, p.k, p.b_col_stride, p.b_row_stride);
  args.a_vec = args.a_m_fast ? vectors_align(p.a, p.a_row_stride, p.a_col_stride, p.a_batch_stride)
                             : vectors_align(p.a, p.a_col_stride, p.a_row_stride, p.a_batch_stride);
  args.b_vec = args.b_k_fast ? vectors_align(p.b, p.b_row_stride, p.b_col_stride, p.b_batch_stride)
                             : vectors_align(p.b, p.b_col_stride, p.b_row_stride, p.b_batch_stride);
  args.c_vec = vectors_align(p.c, p.c_col_stride, p.c_row_stride, p.c_batch_stride);
  return args;
}

}  // namespace samattn::detail::simt
