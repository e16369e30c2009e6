// Normalises a GEMM for the sm80 mma.sync kernel and picks the dtype's instantiation. A
// column-major-like C runs as C^T = B^T A^T; each operand is walked along its unit (or
// smaller) stride, with cp.async when that stride is 1 and every 16-byte chunk is aligned,
// else with scalar loads, so any strides work (tail chunks load element-wise either way).
#include <cstdint>

#include "common/check.h"
#include "gemm/gemm_internal.h"
#include "gemm/sm80/gemm_sm80.h"

namespace samattn::detail {
namespace {

constexpr int kTile = 128;  // the kernel's output tile (sm80::kTileMN)
constexpr int64_t kMaxBatch = 65535;
constexpr int kChunkBytes = 16;

bool aligned(const void* p, int bytes) { return reinterpret_cast<uintptr_t>(p) % bytes == 0; }

}  // namespace

sm80::OperandArgs sm80::make_operand(const void* ptr, int64_t mn, int64_t k, int64_t mn_stride,
                                     int64_t k_stride, int64_t batch, int64_t batch_stride,
                                     int elem_bytes) {
  // A dimension of extent 1 has no meaningful stride: 0 keeps it out of the alignment rule.
  if (mn == 1) mn_stride = 0;
  if (k == 1) k_stride = 0;
  if (batch == 1) batch_stride = 0;
  sm80::OperandArgs op{ptr, mn_stride, k_stride, batch_stride, false, false};
  op.mn_major = walk_along_mn(mn, k, mn_stride, k_stride);
  const int64_t fast_extent = op.mn_major ? mn : k;
  int64_t& fast = op.mn_major ? op.mn_stride : op.k_stride;
  if (fast_extent == 1) fast = 1;  // a single element along the walk: any stride reads it
  const int64_t line = op.mn_major ? op.k_stride : op.mn_stride;
  const int64_t chunk = kChunkBytes / elem_bytes;
  op.async =
      fast == 1 && line % chunk == 0 && op.batch_stride % chunk == 0 && aligned(ptr, kChunkBytes);
  return op;
}

bool sm80_gemm_supports(const GemmParams& p) {
  const bool tensor_core_dtype = p.dtype == DType::kFloat16 || p.dtype == DType::kBFloat16 ||
                                 (p.dtype == DType::kFloat32 && p.allow_tf32);
  const int64_t limit = int64_t{1} << 31;
  const int64_t tiles = ((p.m + kTile - 1) / kTile) * ((p.n + kTile - 1) / kTile);
  return tensor_core_dtype && p.m < limit && p.n < limit && p.k < limit && tiles < limit &&
         p.batch <= kMaxBatch;
}

void launch_sm80_gemm(const GemmParams& params, cudaStream_t stream) {
  const GemmParams p = with_row_major_c(params);
  const int elem_bytes = dtype_size(p.dtype);
  sm80::GemmArgs args{};
  args.a = sm80::make_operand(p.a, p.m, p.k, p.a_row_stride, p.a_col_stride, p.batch,
                              p.a_batch_stride, elem_bytes);
  args.b = sm80::make_operand(p.b, p.n, p.k, p.b_col_stride, p.b_row_stride, p.batch,
                              p.b_batch_stride, elem_bytes);
  args.c = p.c;
  args.c_rs = p.m == 1 ? 0 : p.c_row_stride;
  args.c_cs = p.n == 1 ? 1 : p.c_col_stride;
  args.c_bs = p.batch == 1 ? 0 : p.c_batch_stride;
  args.m = static_cast<int>(p.m);
  args.n = static_cast<int>(p.n);
  args.k = static_cast<int>(p.k);
  args.tiles_m = static_cast<int>((p.m + kTile - 1) / kTile);
  args.tiles_n = static_cast<int>((p.n + kTile - 1) / kTile);
  args.alpha = static_cast<float>(p.alpha);
  args.beta = static_cast<float>(p.beta);
  args.c_pairs =
      args.c_cs == 1 && args.c_rs % 2 == 0 && args.c_bs % 2 == 0 && aligned(p.c, 2 * elem_bytes);
  switch (p.dtype) {
    case DType::kFloat16:
      return sm80::launch<DType::kFloat16>(args, p.batch, stream);
    case DType::kBFloat16:
      return sm80::launch<DType::kBFloat16>(args, p.batch, stream);
    case DType::kFloat32:
      return sm80::launch<DType::kFloat32>(args, p.batch, stream);
    default:
      SAMATTN_CHECK(false, "the sm80 GEMM runs float16, bfloat16 and TF32, got ",
                    dtype_name(p.dtype));
  }
}

}  // namespace samattn::detail
