// CUDA-core GEMM for float64, float16/bfloat16 and the float32 calls beyond the SGEMM's size
// limits (csrc/gemm/simt has the fast float32 kernel): a block computes a BM x BN tile of C
// from BK-deep slices of A and B staged in double-buffered shared memory (A stored transposed,
// k-major, so both operands are read as contiguous vectors along m and n); each thread owns a TM x
// TN register tile split into two halves 64 (or BM/2) rows apart, so the threads of a warp read
// consecutive 16-byte vectors without bank conflicts. Global loads for the next slice are issued
// into registers before the current slice's FMAs and stored to the other buffer afterwards (one
// barrier per slice). Any strides work: the loader walks each operand along its smaller stride,
// with vector loads when that stride is 1 and the addresses are aligned, and bounds checks on every
// tail.
#include <cstdint>
#include <type_traits>

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "common/check.h"
#include "common/cuda_check.h"
#include "common/element_of.cuh"
#include "gemm/gemm_internal.h"
#include "gemm/simt/sgemm_args.h"

namespace samattn::detail {
namespace {

struct SimtArgs {
  const void* a;
  const void* b;
  void* c;
  int64_t m, n, k;
  int64_t a_rs, a_cs, a_bs, b_rs, b_cs, b_bs, c_rs, c_cs, c_bs;
  double alpha, beta;
  bool a_k_fast;      // A is walked along k (its column stride is the smaller one)
  bool b_n_fast;      // B is walked along n
  bool a_vec, b_vec;  // vector loads are aligned (fast stride 1, aligned pointers and strides)
};

template <typename T>
__device__ __forceinline__ float to_acc(T x, float) {
  return static_cast<float>(x);
}
__device__ __forceinline__ float to_acc(__half x, float) { return __half2float(x); }
__device__ __forceinline__ float to_acc(__nv_bfloat16 x, float) { return __bfloat162float(x); }
__device__ __forceinline__ double to_acc(double x, double) { return x; }

template <typename T>
__device__ __forceinline__ T from_acc(float x);
template <>
__device__ __forceinline__ float from_acc<float>(float x) {
  return x;
}
template <>
__device__ __forceinline__ __half from_acc<__half>(float x) {
  return __float2half_rn(x);
}
template <>
__device__ __forceinline__ __nv_bfloat16 from_acc<__nv_bfloat16>(float x) {
  return __float2bfloat16_rn(x);
}
__device__ __forceinline__ double from_acc_d(double x) { return x; }

template <typename T, int L>
struct alignas(sizeof(T) * L) Vec {
  T v[L];
};

// Loads the L consecutive elements (along the fast dimension) that start at fast index `f0` of
// line `s` (slow index), into `out` converted to Acc; zero outside the operand.
template <typename T, typename Acc, int L>
__device__ __forceinline__ void load_run(const T* base, int64_t slow, int64_t slow_extent,
                                         int64_t slow_stride, int64_t fast0, int64_t fast_extent,
                                         int64_t fast_stride, bool vec, Acc (&out)[L]) {
  if (slow < slow_extent && vec && fast0 + L <= fast_extent) {
    const Vec<T, L> v = *reinterpret_cast<const Vec<T, L>*>(base + slow * slow_stride + fast0);
#pragma unroll
    for (int l = 0; l < L; ++l) out[l] = to_acc(v.v[l], Acc{});
    return;
  }
#pragma unroll
  for (int l = 0; l < L; ++l) {
    const int64_t f = fast0 + l;
    out[l] = (slow < slow_extent && f < fast_extent)
                 ? to_acc(base[slow * slow_stride + f * fast_stride], Acc{})
                 : Acc(0);
  }
}

template <typename T, typename Acc, int BM, int BN, int BK, int TM, int TN>
__global__ void __launch_bounds__((BM / TM) * (BN / TN)) simt_gemm_kernel(const SimtArgs args) {
  constexpr int kThreads = (BM / TM) * (BN / TN);
  constexpr int kThreadsN = BN / TN;
  constexpr int LA = BM * BK / kThreads;  // A elements each thread loads per slice
  constexpr int LB = BN * BK / kThreads;
  static_assert(LA >= 1 && LB >= 1 && BK % LA == 0 && BK % LB == 0, "loader split");
  static_assert(TM % 2 == 0 && TN % 2 == 0, "register tile halves");
  __shared__ __align__(16) Acc As[2][BK][BM];
  __shared__ __align__(16) Acc Bs[2][BK][BN];

  const int tid = threadIdx.x;
  const int64_t l = blockIdx.z;
  const int64_t row0 = static_cast<int64_t>(blockIdx.y) * BM;
  const int64_t col0 = static_cast<int64_t>(blockIdx.x) * BN;
  const T* a = static_cast<const T*>(args.a) + l * args.a_bs;
  const T* b = static_cast<const T*>(args.b) + l * args.b_bs;

  // This thread's share of a slice: LA consecutive elements along A's fast dimension.
  // k-fast: line = row (BM lines of BK); m-fast: line = k (BK lines of BM).
  const int a_e = tid * LA;
  const int a_line = args.a_k_fast ? a_e / BK : a_e / BM;
  const int a_pos = args.a_k_fast ? a_e % BK : a_e % BM;
  const int b_e = tid * LB;
  const int b_line = args.b_n_fast ? b_e / BN : b_e / BK;
  const int b_pos = args.b_n_fast ? b_e % BN : b_e % BK;

  Acc ra[LA], rb[LB];
  auto load_slice = [&](int64_t k0) {
    if (args.a_k_fast) {  // line = row of A, fast = k
      load_run<T, Acc, LA>(a, row0 + a_line, args.m, args.a_rs, k0 + a_pos, args.k, args.a_cs,
                           args.a_vec, ra);
    } else {  // line = k, fast = row
      load_run<T, Acc, LA>(a, k0 + a_line, args.k, args.a_cs, row0 + a_pos, args.m, args.a_rs,
                           args.a_vec, ra);
    }
    if (args.b_n_fast) {  // line = k, fast = col
      load_run<T, Acc, LB>(b, k0 + b_line, args.k, args.b_rs, col0 + b_pos, args.n, args.b_cs,
                           args.b_vec, rb);
    } else {  // line = col of B, fast = k
      load_run<T, Acc, LB>(b, col0 + b_line, args.n, args.b_cs, k0 + b_pos, args.k, args.b_rs,
                           args.b_vec, rb);
    }
  };
  auto store_slice = [&](int buf) {
#pragma unroll
    for (int i = 0; i < LA; ++i) {
      if (args.a_k_fast) {
        As[buf][a_pos + i][a_line] = ra[i];
      } else {
        As[buf][a_line][a_pos + i] = ra[i];
      }
    }
#pragma unroll
    for (int i = 0; i < LB; ++i) {
      if (args.b_n_fast) {
        Bs[buf][b_line][b_pos + i] = rb[i];
      } else {
        Bs[buf][b_pos + i][b_line] = rb[i];
      }
    }
  };

  const int ty = tid / kThreadsN, tx = tid % kThreadsN;
  constexpr int kHalfM = TM / 2, kHalfN = TN / 2;
  Acc acc[TM][TN];
#pragma unroll
  for (int i = 0; i < TM; ++i)
#pragma unroll
    for (int j = 0; j < TN; ++j) acc[i][j] = Acc(0);

  const int64_t slices = (args.k + BK - 1) / BK;
  load_slice(0);
  store_slice(0);
  __syncthreads();
  for (int64_t s = 0; s < slices; ++s) {
    const int buf = static_cast<int>(s & 1);
    if (s + 1 < slices) load_slice((s + 1) * BK);
#pragma unroll
    for (int kk = 0; kk < BK; ++kk) {
      Acc fa[TM], fb[TN];
#pragma unroll
      for (int i = 0; i < kHalfM; ++i) {
        fa[i] = As[buf][kk][ty * kHalfM + i];
        fa[kHalfM + i] = As[buf][kk][BM / 2 + ty * kHalfM + i];
      }
#pragma unroll
      for (int j = 0; j < kHalfN; ++j) {
        fb[j] = Bs[buf][kk][tx * kHalfN + j];
        fb[kHalfN + j] = Bs[buf][kk][BN / 2 + tx * kHalfN + j];
      }
#pragma unroll
      for (int i = 0; i < TM; ++i)
#pragma unroll
        for (int j = 0; j < TN; ++j) acc[i][j] = fma(fa[i], fb[j], acc[i][j]);
    }
    if (s + 1 < slices) store_slice(buf ^ 1);
    __syncthreads();
  }

  // Epilogue: alpha * acc (+ beta * C, read only when beta != 0), bounds-checked.
  T* c = static_cast<T*>(args.c) + l * args.c_bs;
  const Acc alpha = static_cast<Acc>(args.alpha), beta = static_cast<Acc>(args.beta);
  const bool read_c = args.beta != 0.0;
#pragma unroll
  for (int i = 0; i < TM; ++i) {
    const int64_t r = row0 + (i < kHalfM ? ty * kHalfM + i : BM / 2 + ty * kHalfM + i - kHalfM);
    if (r >= args.m) continue;
#pragma unroll
    for (int j = 0; j < TN; ++j) {
      const int64_t cc = col0 + (j < kHalfN ? tx * kHalfN + j : BN / 2 + tx * kHalfN + j - kHalfN);
      if (cc >= args.n) continue;
      T* dst = c + r * args.c_rs + cc * args.c_cs;
      Acc value = alpha * acc[i][j];
      if (read_c) value = fma(beta, to_acc(*dst, Acc{}), value);
      if constexpr (std::is_same_v<T, double>) {
        *dst = from_acc_d(value);
      } else {
        *dst = from_acc<T>(value);
      }
    }
  }
}

bool aligned(const void* p, int bytes) { return reinterpret_cast<uintptr_t>(p) % bytes == 0; }

template <DType kDType>
void launch_typed(const GemmParams& p, cudaStream_t stream) {
  using T = typename ElementOf<kDType>::type;
  // fp64: 64 x 64 tiles, 4 x 4 per thread (double registers are twice the size; 256 threads).
  // Others: 128 x 128 x 8 tiles, 8 x 8 per thread (the classic SGEMM register tiling).
  constexpr bool kDouble = kDType == DType::kFloat64;
  using Acc = std::conditional_t<kDouble, double, float>;
  constexpr int BM = kDouble ? 64 : 128, BN = BM, BK = 8, TM = kDouble ? 4 : 8, TN = TM;
  constexpr int kThreads = (BM / TM) * (BN / TN);
  constexpr int LA = BM * BK / kThreads, LB = BN * BK / kThreads;

  SimtArgs args{p.a,
                p.b,
                p.c,
                p.m,
                p.n,
                p.k,
                p.a_row_stride,
                p.a_col_stride,
                p.a_batch_stride,
                p.b_row_stride,
                p.b_col_stride,
                p.b_batch_stride,
                p.c_row_stride,
                p.c_col_stride,
                p.c_batch_stride,
                p.alpha,
                p.beta,
                false,
                false,
                false,
                false};
  // Walk each operand along its unit (or smaller) stride; a size-1 dimension's stride is
  // meaningless, so a K x 1 or 1 x K operand is walked along its longer side.
  args.a_k_fast = p.m == 1 || (p.k > 1 && p.a_col_stride <= p.a_row_stride);
  args.b_n_fast = p.k == 1 || (p.n > 1 && p.b_col_stride <= p.b_row_stride);
  const int64_t a_fast = args.a_k_fast ? p.a_col_stride : p.a_row_stride;
  const int64_t a_slow = args.a_k_fast ? p.a_row_stride : p.a_col_stride;
  const int64_t b_fast = args.b_n_fast ? p.b_col_stride : p.b_row_stride;
  const int64_t b_slow = args.b_n_fast ? p.b_row_stride : p.b_col_stride;
  const int va = LA * static_cast<int>(sizeof(T)), vb = LB * static_cast<int>(sizeof(T));
  args.a_vec = a_fast == 1 && a_slow % LA == 0 && p.a_batch_stride % LA == 0 && aligned(p.a, va);
  args.b_vec = b_fast == 1 && b_slow % LB == 0 && p.b_batch_stride % LB == 0 && aligned(p.b, vb);

  const dim3 grid(static_cast<unsigned>((p.n + BN - 1) / BN),
                  static_cast<unsigned>((p.m + BM - 1) / BM), static_cast<unsigned>(p.batch));
  SAMATTN_CHECK(grid.y <= 65535 && grid.z <= 65535, "m (", p.m, ") and batch (", p.batch,
                ") must give at most 65535 row tiles and batches");
  simt_gemm_kernel<T, Acc, BM, BN, BK, TM, TN><<<grid, kThreads, 0, stream>>>(args);
  SAMATTN_CHECK_LAUNCH();
}

}  // namespace

void launch_simt_gemm(const GemmParams& p, cudaStream_t stream) {
  switch (p.dtype) {
    case DType::kFloat64:
      return launch_typed<DType::kFloat64>(p, stream);
    case DType::kFloat32:
      if (simt::sgemm_supports(p)) return launch_sgemm(p, stream);
      return launch_typed<DType::kFloat32>(p, stream);
    case DType::kFloat16:
      return launch_typed<DType::kFloat16>(p, stream);
    case DType::kBFloat16:
      return launch_typed<DType::kBFloat16>(p, stream);
  }
}

}  // namespace samattn::detail
