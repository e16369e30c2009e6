// Row softmax: one block per row. Each thread keeps a running (max, sum of exp) pair over its
// strided share of the row (the online-softmax update, so the row is read once for both
// statistics); the pairs are merged with warp shuffles, then across warps through shared
// memory; a second pass writes exp(x - max) / sum. Rows are independent, so any batch x rows
// grid works; causal rows see columns j <= i.
#include <cstdint>
#include <type_traits>

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "common/check.h"
#include "common/cuda_check.h"
#include "common/element_of.cuh"
#include "gemm/gemm_internal.h"

namespace samattn::detail {
namespace {

constexpr int kSoftmaxThreads = 256;
constexpr int kWarp = 32;

__device__ __forceinline__ float load(const float* p) { return *p; }
__device__ __forceinline__ double load(const double* p) { return *p; }
__device__ __forceinline__ float load(const __half* p) { return __half2float(*p); }
__device__ __forceinline__ float load(const __nv_bfloat16* p) { return __bfloat162float(*p); }
__device__ __forceinline__ void store(float* p, float x) { *p = x; }
__device__ __forceinline__ void store(double* p, double x) { *p = x; }
__device__ __forceinline__ void store(__half* p, float x) { *p = __float2half_rn(x); }
__device__ __forceinline__ void store(__nv_bfloat16* p, float x) { *p = __float2bfloat16_rn(x); }

// Merges two (max, sum) pairs: sums are rescaled to the larger max. An empty pair has max
// -inf and sum 0 and leaves the other unchanged.
template <typename Acc>
__device__ __forceinline__ void merge(Acc& m, Acc& s, Acc m2, Acc s2) {
  const Acc top = m > m2 ? m : m2;
  if (top == -INFINITY) return;
  s = s * exp(m - top) + s2 * exp(m2 - top);
  m = top;
}

template <typename T, typename Acc>
__global__ void __launch_bounds__(kSoftmaxThreads) softmax_kernel(const SoftmaxParams p) {
  const int64_t row = blockIdx.x;
  const int64_t l = blockIdx.y;
  const T* in = static_cast<const T*>(p.in) + l * p.in_batch_stride + row * p.in_row_stride;
  T* out = static_cast<T*>(p.out) + l * p.out_batch_stride + row * p.out_row_stride;
  const int64_t visible = p.causal ? (row + 1 < p.cols ? row + 1 : p.cols) : p.cols;
  const Acc scale = static_cast<Acc>(p.scale);

  Acc m = -INFINITY, s = 0;
  for (int64_t j = threadIdx.x; j < visible; j += blockDim.x) {
    const Acc x = scale * load(in + j);
    if (x > m) {
      s = s * exp(m - x) + Acc(1);
      m = x;
    } else {
      s += exp(x - m);
    }
  }
  for (int offset = kWarp / 2; offset > 0; offset /= 2) {
    merge(m, s, __shfl_xor_sync(0xffffffffu, m, offset), __shfl_xor_sync(0xffffffffu, s, offset));
  }
  __shared__ Acc warp_m[kSoftmaxThreads / kWarp], warp_s[kSoftmaxThreads / kWarp];
  const int warp = threadIdx.x / kWarp, lane = threadIdx.x % kWarp;
  if (lane == 0) {
    warp_m[warp] = m;
    warp_s[warp] = s;
  }
  __syncthreads();
  m = warp_m[0];
  s = warp_s[0];
  for (int w = 1; w < kSoftmaxThreads / kWarp; ++w) merge(m, s, warp_m[w], warp_s[w]);
  const Acc inv = Acc(1) / s;
  for (int64_t j = threadIdx.x; j < p.cols; j += blockDim.x) {
    const Acc value = j < visible ? exp(scale * load(in + j) - m) * inv : Acc(0);
    store(out + j, value);
  }
}

template <DType kDType>
void launch_typed(const SoftmaxParams& p, cudaStream_t stream) {
  using T = typename ElementOf<kDType>::type;
  using Acc = std::conditional_t<kDType == DType::kFloat64, double, float>;
  SAMATTN_CHECK(p.rows <= 0x7fffffff && p.batch <= 65535, "softmax rows (", p.rows,
                ") must be < 2^31 and batch (", p.batch, ") <= 65535");
  const dim3 grid(static_cast<unsigned>(p.rows), static_cast<unsigned>(p.batch));
  softmax_kernel<T, Acc><<<grid, kSoftmaxThreads, 0, stream>>>(p);
  SAMATTN_CHECK_LAUNCH();
}

}  // namespace

void launch_softmax(const SoftmaxParams& p, cudaStream_t stream) {
  switch (p.dtype) {
    case DType::kFloat64:
      return launch_typed<DType::kFloat64>(p, stream);
    case DType::kFloat32:
      return launch_typed<DType::kFloat32>(p, stream);
    case DType::kFloat16:
      return launch_typed<DType::kFloat16>(p, stream);
    case DType::kBFloat16:
      return launch_typed<DType::kBFloat16>(p, stream);
  }
}

}  // namespace samattn::detail
