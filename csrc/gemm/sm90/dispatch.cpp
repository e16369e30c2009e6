// Normalises a GEMM for the sm_90a kernels and picks the instantiation. C column-major is
// handled as its transpose, C^T = B^T A^T, which is row-major; then A and B need one unit
// stride each (a dimension of size 1 may take any stride) and TMA's alignment, which the
// CUTLASS kernel's can_implement checks along with the sizes (int32).
#include <cstdint>
#include <optional>

#include "gemm/gemm_internal.h"
#include "gemm/sm90/gemm_sm90.h"

namespace samattn::detail {
namespace {

constexpr int64_t kTmaAlignBytes = 16;

struct Normalised {
  GemmParams p;
  bool a_k_major, b_k_major;
};

std::optional<Normalised> normalise(const GemmParams& in) {
  GemmParams p = in;
  const bool c_row_major = p.c_col_stride == 1 || p.n == 1;
  const bool c_col_major = p.c_row_stride == 1 || p.m == 1;
  if (!c_row_major && !c_col_major) return std::nullopt;
  if (!c_row_major) {  // C^T = B^T A^T
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
    p = t;
  }
  p.c_col_stride = 1;
  Normalised out{p, false, false};
  GemmParams& q = out.p;
  if (q.a_col_stride == 1 || q.k == 1) {
    out.a_k_major = true;
    q.a_col_stride = 1;
  } else if (q.a_row_stride == 1 || q.m == 1) {
    q.a_row_stride = 1;
  } else {
    return std::nullopt;
  }
  if (q.b_row_stride == 1 || q.k == 1) {
    out.b_k_major = true;
    q.b_row_stride = 1;
  } else if (q.b_col_stride == 1 || q.n == 1) {
    q.b_col_stride = 1;
  } else {
    return std::nullopt;
  }
  const auto aligned = [](const void* ptr) {
    return reinterpret_cast<uintptr_t>(ptr) % kTmaAlignBytes == 0;
  };
  if (!aligned(q.a) || !aligned(q.b) || !aligned(q.c)) return std::nullopt;
  // TMA: every non-unit stride a multiple of 16 bytes, and (as the kernels' vectorised
  // epilogue and CUTLASS's own check expect) each contiguous extent too. Checked here rather
  // than left to CUTLASS's can_implement alone, so no misaligned call reaches a TMA descriptor.
  const int64_t unit = kTmaAlignBytes / dtype_size(q.dtype);
  const int64_t a_lead = out.a_k_major ? q.a_row_stride : q.a_col_stride;
  const int64_t b_lead = out.b_k_major ? q.b_col_stride : q.b_row_stride;
  const int64_t a_extent = out.a_k_major ? q.k : q.m;
  const int64_t b_extent = out.b_k_major ? q.k : q.n;
  for (const int64_t v : {a_lead, b_lead, q.c_row_stride, a_extent, b_extent, q.n}) {
    if (v % unit != 0) return std::nullopt;
  }
  // Batched: every batch stride a nonzero multiple of 16 bytes (a broadcast operand, stride
  // 0, runs on the SIMT kernel).
  if (q.batch > 1) {
    for (const int64_t stride : {q.a_batch_stride, q.b_batch_stride, q.c_batch_stride}) {
      if (stride == 0 || stride % unit != 0) return std::nullopt;
    }
  }
  const int64_t limit = int64_t{1} << 31;
  if (q.m >= limit || q.n >= limit || q.k >= limit || q.batch >= limit) return std::nullopt;
  return out;
}

template <DType kDType>
bool can_run_any(const Normalised& n) {
  using namespace sm90;
  if (n.a_k_major && n.b_k_major) return can_run<kDType, true, true>(n.p);
  if constexpr (kDType == DType::kFloat32) {
    return false;  // TF32: k-major operands only
  } else {
    if (n.a_k_major) return can_run<kDType, true, false>(n.p);
    if (n.b_k_major) return can_run<kDType, false, true>(n.p);
    return can_run<kDType, false, false>(n.p);
  }
}

template <DType kDType>
void run_any(const Normalised& n, cudaStream_t stream) {
  using namespace sm90;
  if (n.a_k_major && n.b_k_major) return run<kDType, true, true>(n.p, stream);
  if constexpr (kDType != DType::kFloat32) {
    if (n.a_k_major) return run<kDType, true, false>(n.p, stream);
    if (n.b_k_major) return run<kDType, false, true>(n.p, stream);
    return run<kDType, false, false>(n.p, stream);
  }
}

}  // namespace

bool sm90_gemm_supports(const GemmParams& params) {
  const bool tensor_core_dtype = params.dtype == DType::kFloat16 ||
                                 params.dtype == DType::kBFloat16 ||
                                 (params.dtype == DType::kFloat32 && params.allow_tf32);
  if (!tensor_core_dtype) return false;
  const std::optional<Normalised> n = normalise(params);
  if (!n) return false;
  switch (params.dtype) {
    case DType::kFloat16:
      return can_run_any<DType::kFloat16>(*n);
    case DType::kBFloat16:
      return can_run_any<DType::kBFloat16>(*n);
    case DType::kFloat32:
      return can_run_any<DType::kFloat32>(*n);
    default:
      return false;
  }
}

void launch_sm90_gemm(const GemmParams& params, cudaStream_t stream) {
  const std::optional<Normalised> n = normalise(params);
  switch (params.dtype) {
    case DType::kFloat16:
      return run_any<DType::kFloat16>(*n, stream);
    case DType::kBFloat16:
      return run_any<DType::kBFloat16>(*n, stream);
    case DType::kFloat32:
      return run_any<DType::kFloat32>(*n, stream);
    default:
      return;
  }
}

}  // namespace samattn::detail
