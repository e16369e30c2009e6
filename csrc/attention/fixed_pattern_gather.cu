// The fixed pattern's summary columns gathered into consecutive rows (fixed_pattern.h): a copy
// of c / l of the keys and values, in 16-byte units where the tensors allow it.
#include <algorithm>
#include <cstdint>

#include "attention/fixed_pattern.h"
#include "common/check.h"
#include "common/cuda_check.h"
#include "common/device.h"

namespace samattn::detail {
namespace {

constexpr int kThreads = 256;

// Unit: the copy's element (uint4: 16 bytes, or a single element of the tensor's size).
// blockIdx.y picks the tensor (0: keys, 1: values).
template <typename Unit>
__global__ void __launch_bounds__(kThreads) gather_summary_kernel(const SummaryGather g) {
  const int which = static_cast<int>(blockIdx.y);
  const int64_t unit_bytes = sizeof(Unit);
  const int64_t units_per_row = g.dim[which] * g.element_bytes / unit_bytes;
  const int64_t total = g.batch * g.heads * g.rows * units_per_row;
  const Strides s = g.src_strides[which];
  const char* src = static_cast<const char*>(g.src[which]);
  Unit* dst = static_cast<Unit*>(g.dst[which]);
  for (int64_t i = blockIdx.x * int64_t{kThreads} + threadIdx.x; i < total;
       i += int64_t{gridDim.x} * kThreads) {
    const int64_t unit = i % units_per_row;
    const int64_t row = i / units_per_row;  // (b * heads + h) * rows + s
    const int64_t summary = row % g.rows;
    const int64_t bh = row / g.rows;
    const int64_t b = bh / g.heads, h = bh % g.heads;
    const int64_t key = summary_key_row(summary, g.l, g.c);
    const int64_t element = b * s.batch + h * s.head + key * s.seq;
    dst[i] = reinterpret_cast<const Unit*>(src + element * g.element_bytes)[unit];
  }
}

bool aligned16(const void* pointer, const Strides& s, int64_t dim, int element_bytes) {
  return reinterpret_cast<uintptr_t>(pointer) % 16 == 0 && (s.batch * element_bytes) % 16 == 0 &&
         (s.head * element_bytes) % 16 == 0 && (s.seq * element_bytes) % 16 == 0 &&
         (dim * element_bytes) % 16 == 0;
}

// One launch for both tensors (blockIdx.y), sized for the wider one's units.
template <typename Unit>
void launch_gather(const SummaryGather& g, cudaStream_t stream) {
  const int64_t max_dim = std::max(g.dim[0], g.dim[1]);
  const int64_t units =
      g.batch * g.heads * g.rows * (max_dim * g.element_bytes / static_cast<int64_t>(sizeof(Unit)));
  const dim3 grid(grid_stride_blocks(units, kThreads), 2);
  gather_summary_kernel<Unit><<<grid, kThreads, 0, stream>>>(g);
  SAMATTN_CHECK_LAUNCH();
}

}  // namespace

void gather_summary_rows(const SummaryGather& g, cudaStream_t stream) {
  const int64_t rows = g.batch * g.heads * g.rows;
  if (rows == 0) return;
  bool vector = true;
  for (int t = 0; t < 2; ++t) {
    vector = vector && aligned16(g.src[t], g.src_strides[t], g.dim[t], g.element_bytes) &&
             reinterpret_cast<uintptr_t>(g.dst[t]) % 16 == 0;
  }
  if (vector) {
    launch_gather<uint4>(g, stream);
  } else {
    SAMATTN_CHECK(g.element_bytes == 2, "gather_summary_rows: 16-bit elements expected, got ",
                  g.element_bytes, " bytes");
    launch_gather<uint16_t>(g, stream);
  }
}

}  // namespace samattn::detail
