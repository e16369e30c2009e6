// samattn::gemm against cuBLAS in one process: bf16, fp16, fp32 (IEEE), tf32 and fp64 with the
// automatic kernel choice, then the sm80 mma.sync kernel forced (bf16, fp16, tf32), square sizes
// 256..8192 and skinny M = 16..128 (N = K = 8192). Row-major C = A B (A row-major; B row-major,
// or stored transposed for TF32, whose sm90 path needs k-major operands), the same layout for
// both libraries. --sgemm-variants adds every fp32 SGEMM tile configuration of
// benchmarks/sgemm_variants.cu at the large squares (the library ships one of them).
// Inputs are random in [-1, 1) (never zeros); each row is checked against cuBLAS before timing
// (a relative difference above the dtype's limit marks it WRONG and fails the run). Times are
// medians of event-timed launches, ours and cuBLAS alternating; ratio = cuBLAS time / ours.
//
//   bench_gemm [--quick] [--sgemm-variants] [--json PATH] [--reps N]
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <functional>
#include <string>
#include <vector>

#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime_api.h>

#include "samattn/gemm.h"
#include "sgemm_variants.h"

namespace {

#define CUDA_OK(call)                                                                            \
  do {                                                                                           \
    cudaError_t e_ = (call);                                                                     \
    if (e_ != cudaSuccess) {                                                                     \
      std::fprintf(stderr, "%s:%d %s: %s\n", __FILE__, __LINE__, #call, cudaGetErrorString(e_)); \
      std::exit(1);                                                                              \
    }                                                                                            \
  } while (0)
#define CUBLAS_OK(call)                                                                         \
  do {                                                                                          \
    cublasStatus_t s_ = (call);                                                                 \
    if (s_ != CUBLAS_STATUS_SUCCESS) {                                                          \
      std::fprintf(stderr, "%s:%d %s: cublas status %d\n", __FILE__, __LINE__, #call, (int)s_); \
      std::exit(1);                                                                             \
    }                                                                                           \
  } while (0)

template <typename T>
__device__ T from_float(float x);
template <>
__device__ float from_float<float>(float x) {
  return x;
}
template <>
__device__ double from_float<double>(float x) {
  return x;
}
template <>
__device__ __half from_float<__half>(float x) {
  return __float2half_rn(x);
}
template <>
__device__ __nv_bfloat16 from_float<__nv_bfloat16>(float x) {
  return __float2bfloat16_rn(x);
}

// Hash-based uniform values in [-1, 1): reproducible, and different in every element.
template <typename T>
__global__ void fill_kernel(T* p, int64_t n, uint32_t seed) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x) {
    uint32_t h = static_cast<uint32_t>(i) * 2654435761u ^ seed * 2246822519u;
    h ^= h >> 15;
    h *= 2246822519u;
    h ^= h >> 13;
    h *= 3266489917u;
    h ^= h >> 16;
    p[i] = from_float<T>(static_cast<float>(h) * (2.0f / 4294967296.0f) - 1.0f);
  }
}

template <typename T>
__device__ double to_double(T x) {
  return static_cast<double>(x);
}
template <>
__device__ double to_double<__half>(__half x) {
  return __half2float(x);
}
template <>
__device__ double to_double<__nv_bfloat16>(__nv_bfloat16 x) {
  return __bfloat162float(x);
}

// max |x - y| and max |y| over n elements (for the relative difference to cuBLAS).
template <typename T>
__global__ void diff_kernel(const T* x, const T* y, int64_t n, unsigned long long* out) {
  double d = 0, m = 0;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x) {
    const double a = to_double(x[i]), b = to_double(y[i]);
    d = fmax(d, (a != a) ? INFINITY : fabs(a - b));
    m = fmax(m, fabs(b));
  }
  // Non-negative doubles order like their bit patterns.
  atomicMax(out, static_cast<unsigned long long>(__double_as_longlong(d)));
  atomicMax(out + 1, static_cast<unsigned long long>(__double_as_longlong(m)));
}

struct Config {
  const char* name;
  samattn::DType dtype;
  bool tf32;
  cudaDataType_t cuda_type;
  cublasComputeType_t compute;
  double max_rel_diff;  // against cuBLAS, relative to max |C|: above it the row is WRONG
};

const Config kBf16 = {"bf16",      samattn::DType::kBFloat16, false,
                      CUDA_R_16BF, CUBLAS_COMPUTE_32F,        3e-2};
const Config kFp16 = {"fp16",     samattn::DType::kFloat16, false,
                      CUDA_R_16F, CUBLAS_COMPUTE_32F,       5e-3};
const Config kFp32 = {"fp32",     samattn::DType::kFloat32, false,
                      CUDA_R_32F, CUBLAS_COMPUTE_32F,       1e-4};
const Config kTf32 = {"tf32",     samattn::DType::kFloat32,     true,
                      CUDA_R_32F, CUBLAS_COMPUTE_32F_FAST_TF32, 5e-3};
const Config kFp64 = {"fp64",     samattn::DType::kFloat64, false,
                      CUDA_R_64F, CUBLAS_COMPUTE_64F,       1e-12};

// What we time for a row: samattn::gemm with a backend, or one SGEMM tile configuration.
struct Ours {
  std::string label;  // "auto", "sm80", or the SGEMM variant's name
  samattn::GemmBackend backend;
  const SgemmVariant* variant;  // null: samattn::gemm
};

struct Shape {
  int64_t m, n, k;
  const char* kind;
};

struct Result {
  std::string dtype, kind, backend, kernel;
  int64_t m, n, k;
  double ours_ms, cublas_ms, max_rel_diff;
  bool wrong;
};

double median(std::vector<float> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

template <typename T>
void fill(void* p, int64_t n, uint32_t seed) {
  fill_kernel<T><<<1024, 256>>>(static_cast<T*>(p), n, seed);
  CUDA_OK(cudaGetLastError());
}

template <typename T>
double rel_diff(const void* x, const void* y, int64_t n) {
  unsigned long long* d;
  CUDA_OK(cudaMalloc(&d, 2 * sizeof(unsigned long long)));
  CUDA_OK(cudaMemset(d, 0, 2 * sizeof(unsigned long long)));
  diff_kernel<T><<<1024, 256>>>(static_cast<const T*>(x), static_cast<const T*>(y), n, d);
  CUDA_OK(cudaGetLastError());
  unsigned long long h[2];
  CUDA_OK(cudaMemcpy(h, d, sizeof(h), cudaMemcpyDeviceToHost));
  CUDA_OK(cudaFree(d));
  double dd, mm;
  std::memcpy(&dd, &h[0], 8);
  std::memcpy(&mm, &h[1], 8);
  return mm > 0 ? dd / mm : dd;
}

Result run_one(cublasHandle_t handle, const Config& cfg, const Ours& who, const Shape& s,
               int reps) {
  const int64_t m = s.m, n = s.n, k = s.k;
  const bool b_k_major = cfg.tf32;  // TF32 tensor cores read k-major operands
  const int esize = samattn::dtype_size(cfg.dtype);
  void *a, *b, *c_ours, *c_ref;
  CUDA_OK(cudaMalloc(&a, m * k * esize));
  CUDA_OK(cudaMalloc(&b, k * n * esize));
  CUDA_OK(cudaMalloc(&c_ours, m * n * esize));
  CUDA_OK(cudaMalloc(&c_ref, m * n * esize));
  switch (cfg.dtype) {
    case samattn::DType::kBFloat16:
      fill<__nv_bfloat16>(a, m * k, 1);
      fill<__nv_bfloat16>(b, k * n, 2);
      break;
    case samattn::DType::kFloat16:
      fill<__half>(a, m * k, 1);
      fill<__half>(b, k * n, 2);
      break;
    case samattn::DType::kFloat32:
      fill<float>(a, m * k, 1);
      fill<float>(b, k * n, 2);
      break;
    case samattn::DType::kFloat64:
      fill<double>(a, m * k, 1);
      fill<double>(b, k * n, 2);
      break;
  }
  CUDA_OK(cudaMemset(c_ours, 0xff, m * n * esize));  // NaN: every element must be written
  samattn::GemmParams p = samattn::make_row_major_gemm(cfg.dtype, a, b, c_ours, m, n, k);
  if (b_k_major) {
    p.b_row_stride = 1;
    p.b_col_stride = k;
  }
  p.allow_tf32 = cfg.tf32;
  p.backend = who.backend;
  const std::string kernel = who.variant != nullptr ? std::string("sgemm_") + who.variant->name
                                                    : samattn::selected_gemm_kernel(p);

  // Row-major C = A B is column-major C^T = B^T A^T.
  const double alpha64 = 1.0, beta64 = 0.0;
  const float alpha32 = 1.0f, beta32 = 0.0f;
  const bool f64 = cfg.dtype == samattn::DType::kFloat64;
  const void* alpha = f64 ? static_cast<const void*>(&alpha64) : &alpha32;
  const void* beta = f64 ? static_cast<const void*>(&beta64) : &beta32;
  auto cublas = [&] {
    CUBLAS_OK(cublasGemmEx(handle, b_k_major ? CUBLAS_OP_T : CUBLAS_OP_N, CUBLAS_OP_N, n, m, k,
                           alpha, b, cfg.cuda_type, b_k_major ? k : n, a, cfg.cuda_type, k, beta,
                           c_ref, cfg.cuda_type, n, cfg.compute, CUBLAS_GEMM_DEFAULT));
  };
  auto ours = [&] {
    if (who.variant != nullptr) {
      who.variant->run(p, nullptr);
    } else {
      samattn::gemm(p, nullptr);
    }
  };

  ours();
  cublas();
  CUDA_OK(cudaDeviceSynchronize());
  double diff = 0;
  switch (cfg.dtype) {
    case samattn::DType::kBFloat16:
      diff = rel_diff<__nv_bfloat16>(c_ours, c_ref, m * n);
      break;
    case samattn::DType::kFloat16:
      diff = rel_diff<__half>(c_ours, c_ref, m * n);
      break;
    case samattn::DType::kFloat32:
      diff = rel_diff<float>(c_ours, c_ref, m * n);
      break;
    case samattn::DType::kFloat64:
      diff = rel_diff<double>(c_ours, c_ref, m * n);
      break;
  }

  cudaEvent_t start, stop;
  CUDA_OK(cudaEventCreate(&start));
  CUDA_OK(cudaEventCreate(&stop));
  auto time = [&](auto&& fn) {
    CUDA_OK(cudaEventRecord(start));
    fn();
    CUDA_OK(cudaEventRecord(stop));
    CUDA_OK(cudaEventSynchronize(stop));
    float ms = 0;
    CUDA_OK(cudaEventElapsedTime(&ms, start, stop));
    return ms;
  };
  for (int w = 0; w < 3; ++w) {
    ours();
    cublas();
  }
  // Repeat until the budget of reps or ~0.3 s per library, whichever comes first.
  std::vector<float> t_ours, t_cublas;
  float spent = 0;
  for (int r = 0; r < reps && (r < 5 || spent < 600.0f); ++r) {
    t_ours.push_back(time(ours));
    t_cublas.push_back(time(cublas));
    spent += t_ours.back() + t_cublas.back();
  }
  CUDA_OK(cudaEventDestroy(start));
  CUDA_OK(cudaEventDestroy(stop));
  for (void* ptr : {a, b, c_ours, c_ref}) CUDA_OK(cudaFree(ptr));
  const bool wrong = !(diff <= cfg.max_rel_diff);  // NaN is wrong too
  return {cfg.name, s.kind,         who.label,        kernel, m,    n,
          k,        median(t_ours), median(t_cublas), diff,   wrong};
}

}  // namespace

int main(int argc, char** argv) {
  bool quick = false, variants = false;
  std::string json;
  int reps = 50;
  for (int i = 1; i < argc; ++i) {
    if (!std::strcmp(argv[i], "--quick")) {
      quick = true;
    } else if (!std::strcmp(argv[i], "--sgemm-variants")) {
      variants = true;
    } else if (!std::strcmp(argv[i], "--json") && i + 1 < argc) {
      json = argv[++i];
    } else if (!std::strcmp(argv[i], "--reps") && i + 1 < argc) {
      reps = std::atoi(argv[++i]);
    } else {
      std::fprintf(stderr, "usage: %s [--quick] [--sgemm-variants] [--json PATH] [--reps N]\n",
                   argv[0]);
      return 2;
    }
  }
  std::vector<Shape> shapes;
  const std::vector<int64_t> squares = quick
                                           ? std::vector<int64_t>{1024, 4096, 8192}
                                           : std::vector<int64_t>{256, 512, 1024, 2048, 4096, 8192};
  for (int64_t s : squares) shapes.push_back({s, s, s, "square"});
  for (int64_t m : {16, 32, 64, 128}) {
    if (quick && (m == 32 || m == 64)) continue;
    shapes.push_back({m, 8192, 8192, "skinny"});
  }
  // (dtype, what we run, shapes): the automatic choice in every dtype, the sm80 kernel forced
  // in its dtypes, and the SGEMM tile configurations at the large squares.
  struct Group {
    Config cfg;
    Ours who;
    std::vector<Shape> shapes;
  };
  const Ours automatic{"auto", samattn::GemmBackend::kAuto, nullptr};
  const Ours sm80{"sm80", samattn::GemmBackend::kSm80, nullptr};
  std::vector<Group> groups;
  for (const Config& cfg : {kBf16, kFp16, kFp32, kTf32, kFp64}) {
    std::vector<Shape> list;
    for (const Shape& s : shapes) {
      // fp64 SIMT: 8192^3 alone is ~1 TFLOP; keep it to 4096 and below.
      if (cfg.dtype == samattn::DType::kFloat64 && s.m * s.n * s.k > 4096LL * 4096 * 4096) continue;
      list.push_back(s);
    }
    groups.push_back({cfg, automatic, list});
  }
  for (const Config& cfg : {kBf16, kFp16, kTf32}) groups.push_back({cfg, sm80, shapes});
  if (variants) {
    std::vector<Shape> large;
    for (int64_t s : {4096, 8192}) large.push_back({s, s, s, "square"});
    for (int v = 0; v < kSgemmVariantCount; ++v) {
      const SgemmVariant& variant = kSgemmVariants[v];
      groups.push_back({kFp32, {variant.name, samattn::GemmBackend::kSimt, &variant}, large});
    }
  }

  cudaDeviceProp prop;
  CUDA_OK(cudaGetDeviceProperties(&prop, 0));
  cublasHandle_t handle;
  CUBLAS_OK(cublasCreate(&handle));
  std::vector<Result> results;
  std::printf("device %s; median of event-timed launches; ratio = cuBLAS time / ours\n", prop.name);
  std::printf("%-5s %-6s %6s %6s %6s %-34s %9s %9s %7s %9s\n", "dtype", "kind", "M", "N", "K",
              "kernel", "ours TF/s", "cuBLAS", "ratio", "rel diff");
  int wrong = 0;
  for (const Group& group : groups) {
    for (const Shape& s : group.shapes) {
      const Result r = run_one(handle, group.cfg, group.who, s, reps);
      results.push_back(r);
      wrong += r.wrong;
      const double flop = 2.0 * r.m * r.n * r.k;
      std::printf("%-5s %-6s %6lld %6lld %6lld %-34s %9.1f %9.1f %7.3f %9.2e%s\n", r.dtype.c_str(),
                  r.kind.c_str(), (long long)r.m, (long long)r.n, (long long)r.k, r.kernel.c_str(),
                  flop / r.ours_ms * 1e-9, flop / r.cublas_ms * 1e-9, r.cublas_ms / r.ours_ms,
                  r.max_rel_diff, r.wrong ? "  WRONG" : "");
      std::fflush(stdout);
    }
  }
  CUBLAS_OK(cublasDestroy(handle));
  if (!json.empty()) {
    FILE* f = std::fopen(json.c_str(), "w");
    if (!f) {
      std::fprintf(stderr, "cannot write %s\n", json.c_str());
      return 1;
    }
    const char* commit = std::getenv("SAMATTN_COMMIT");
    const std::time_t now = std::time(nullptr);
    char date[sizeof "2026-01-01T00:00:00Z"];
    std::strftime(date, sizeof date, "%Y-%m-%dT%H:%M:%SZ", std::gmtime(&now));
    std::fprintf(f, "{\n  \"benchmark\": \"bench_gemm\",\n  \"device\": \"%s\",\n", prop.name);
    std::fprintf(f, "  \"commit\": \"%s\",\n  \"date\": \"%s\",\n  \"quick\": %s,\n",
                 commit ? commit : "unknown", date, quick ? "true" : "false");
    std::fprintf(f, "  \"results\": [\n");
    for (size_t i = 0; i < results.size(); ++i) {
      const Result& r = results[i];
      const double flop = 2.0 * r.m * r.n * r.k;
      std::fprintf(
          f,
          "    {\"dtype\": \"%s\", \"kind\": \"%s\", \"m\": %lld, \"n\": %lld, \"k\": %lld, "
          "\"backend\": \"%s\", \"kernel\": \"%s\", \"ours_ms\": %.5f, \"cublas_ms\": %.5f, "
          "\"ours_tflops\": %.2f, \"cublas_tflops\": %.2f, \"ratio\": %.4f, "
          "\"max_rel_diff\": %.3e, \"wrong\": %s}%s\n",
          r.dtype.c_str(), r.kind.c_str(), (long long)r.m, (long long)r.n, (long long)r.k,
          r.backend.c_str(), r.kernel.c_str(), r.ours_ms, r.cublas_ms, flop / r.ours_ms * 1e-9,
          flop / r.cublas_ms * 1e-9, r.cublas_ms / r.ours_ms, r.max_rel_diff,
          r.wrong ? "true" : "false", i + 1 < results.size() ? "," : "");
    }
    std::fprintf(f, "  ]\n}\n");
    std::fclose(f);
    std::printf("wrong %d of %zu rows; wrote %s\n", wrong, results.size(), json.c_str());
  }
  if (wrong > 0) std::printf("%d rows differ from cuBLAS beyond the dtype's limit\n", wrong);
  return wrong > 0 ? 1 : 0;
}
