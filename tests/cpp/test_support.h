// Test helpers: attention problems with random host data in any dtype, tolerances derived from
// the dtype, and device buffers for the GPU tests.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <numeric>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include "common/host_float.h"
#include "samattn/attention.h"

namespace samattn::testing {

inline bool gpu_available() {
  int count = 0;
  return cudaGetDeviceCount(&count) == cudaSuccess && count > 0;
}

#define SKIP_WITHOUT_GPU()                                                   \
  do {                                                                       \
    if (!::samattn::testing::gpu_available()) GTEST_SKIP() << "no CUDA GPU"; \
  } while (0)

// Elements stored as raw bytes of `dtype`, read and written as double.
struct HostTensor {
  DType dtype = DType::kFloat32;
  std::vector<unsigned char> bytes;

  HostTensor() = default;
  HostTensor(DType type, int64_t count) : dtype(type), bytes(count * dtype_size(type)) {}
  int64_t size() const { return static_cast<int64_t>(bytes.size()) / dtype_size(dtype); }
  void* data() { return bytes.data(); }
  const void* data() const { return bytes.data(); }

  double get(int64_t i) const { return detail::load_as_double(bytes.data(), i, dtype); }
  void set(int64_t i, double value) { detail::store_from_double(bytes.data(), i, dtype, value); }
  // All bytes 0xff: a NaN in every floating-point format, so unwritten elements are caught.
  void poison() { std::memset(bytes.data(), 0xff, bytes.size()); }
};

inline void fill_random(HostTensor& t, uint64_t seed) {
  std::mt19937_64 engine(seed);
  std::normal_distribution<double> normal(0.0, 1.0);
  for (int64_t i = 0; i < t.size(); ++i) t.set(i, normal(engine));
}

struct Shape {
  int64_t batch = 2, heads_q = 2, heads_kv = 2, seqlen_q = 33, seqlen_k = 47;
  int64_t head_dim = 32, head_dim_v = 32;
};

// One test configuration: a shape and the forward options.
struct Scenario {
  std::string name;
  Shape shape;
  bool causal = false;
  int64_t kv_stride = 1;
  bool seq_major = false;
  double scale = 0;  // 0: default 1/sqrt(head_dim)

  uint64_t seed() const { return std::hash<std::string>{}(name); }

  void apply_options(AttentionParams& p) const {
    p.causal = causal;
    p.kv_stride = kv_stride;
    if (scale != 0) p.softmax_scale = scale;
  }
};

// One scenario in one dtype: the parameter of the GPU suites.
struct Case {
  Scenario scenario;
  DType dtype;
};

// Every scenario of `scenarios` in every dtype of `dtypes`, dtype-major.
template <typename Scenarios>
std::vector<Case> cases_in(std::initializer_list<DType> dtypes, const Scenarios& scenarios) {
  std::vector<Case> cases;
  for (DType dtype : dtypes) {
    for (const Scenario& s : scenarios) cases.push_back({s, dtype});
  }
  return cases;
}

inline void PrintTo(const Case& c, std::ostream* os) {
  *os << dtype_name(c.dtype) << "/" << c.scenario.name;
}

// The gtest name of a case: "<dtype>_<scenario>".
inline std::string case_name(const ::testing::TestParamInfo<Case>& info) {
  return std::string(dtype_name(info.param.dtype)) + "_" + info.param.scenario.name;
}

// `x` rounded to `dtype` (to nearest, ties to even) and read back as a double.
inline double round_to_dtype(DType dtype, double x) {
  unsigned char bytes[8];
  detail::store_from_double(bytes, 0, dtype, x);
  return detail::load_as_double(bytes, 0, dtype);
}

// A problem whose tensors live in host memory. `seq_major` stores (B, S, H, D) and views it as
// (B, H, S, D) through strides, as in a model that never transposes.
struct Problem {
  Shape shape;
  DType dtype;
  HostTensor q, k, v, out;
  std::vector<double> lse;  // filled by the reference when requested
  AttentionParams params;

  Problem(const Shape& s, DType type, bool seq_major = false, uint64_t seed = 1)
      : shape(s), dtype(type) {
    q = HostTensor(type, s.batch * s.heads_q * s.seqlen_q * s.head_dim);
    k = HostTensor(type, s.batch * s.heads_kv * s.seqlen_k * s.head_dim);
    v = HostTensor(type, s.batch * s.heads_kv * s.seqlen_k * s.head_dim_v);
    out = HostTensor(type, s.batch * s.heads_q * s.seqlen_q * s.head_dim_v);
    fill_random(q, seed);
    fill_random(k, seed + 1);
    fill_random(v, seed + 2);
    out.poison();
    params.dtype = type;
    params.batch = s.batch;
    params.heads_q = s.heads_q;
    params.heads_kv = s.heads_kv;
    params.seqlen_q = s.seqlen_q;
    params.seqlen_k = s.seqlen_k;
    params.head_dim = s.head_dim;
    params.head_dim_v = s.head_dim_v;
    params.q_strides = strides(s.heads_q, s.seqlen_q, s.head_dim, seq_major);
    params.k_strides = strides(s.heads_kv, s.seqlen_k, s.head_dim, seq_major);
    params.v_strides = strides(s.heads_kv, s.seqlen_k, s.head_dim_v, seq_major);
    params.out_strides = strides(s.heads_q, s.seqlen_q, s.head_dim_v, false);
    bind_host();
  }

  static Strides strides(int64_t heads, int64_t seq, int64_t dim, bool seq_major) {
    if (seq_major) return Strides{seq * heads * dim, dim, heads * dim};
    return Strides{heads * seq * dim, seq * dim, dim};
  }

  void bind_host() {
    params.q = q.data();
    params.k = k.data();
    params.v = v.data();
    params.out = out.data();
  }

  // Runs the fp64 reference into a fresh output (and lse when `with_lse`).
  HostTensor reference(bool with_lse = false) {
    HostTensor result(dtype, out.size());
    AttentionParams p = params;
    p.q = q.data();
    p.k = k.data();
    p.v = v.data();
    p.out = result.data();
    std::vector<float> lse32;
    if (with_lse) {
      const int64_t rows = shape.batch * shape.heads_q * shape.seqlen_q;
      lse.assign(rows, 0.0);
      lse32.assign(rows, 0.0f);
      p.lse = dtype == DType::kFloat64 ? static_cast<void*>(lse.data()) : lse32.data();
    }
    reference_attention_forward(p);
    if (with_lse && dtype != DType::kFloat64) lse.assign(lse32.begin(), lse32.end());
    return result;
  }
};

// A dense cache's rows scattered into a pool of pages in a shuffled order, the pages no entry
// uses NaN: what a paged call must read as the dense one.
struct PagedCopy {
  HostTensor k, v;
  std::vector<int32_t> table;
  int64_t pages, table_stride;
};

inline PagedCopy scatter_into_pages(const Problem& dense, int64_t page_size, uint64_t seed) {
  const AttentionParams& p = dense.params;
  const int64_t columns = (p.seqlen_k + page_size - 1) / page_size;
  PagedCopy paged{HostTensor(dense.dtype, 0), HostTensor(dense.dtype, 0), {}, 0, columns + 1};
  paged.pages = p.batch * columns + 3;  // three spare pages nobody lists
  const int64_t row_k = p.heads_kv * p.head_dim, row_v = p.heads_kv * p.head_dim_v;
  paged.k = HostTensor(dense.dtype, paged.pages * page_size * row_k);
  paged.v = HostTensor(dense.dtype, paged.pages * page_size * row_v);
  for (int64_t i = 0; i < paged.k.size(); ++i) paged.k.set(i, std::nan(""));
  for (int64_t i = 0; i < paged.v.size(); ++i) paged.v.set(i, std::nan(""));
  std::vector<int32_t> order(paged.pages);
  std::iota(order.begin(), order.end(), 0);
  std::shuffle(order.begin(), order.end(), std::mt19937_64(seed));
  paged.table.assign(p.batch * paged.table_stride, -1);  // the spare column: never read
  for (int64_t b = 0; b < p.batch; ++b) {
    for (int64_t c = 0; c < columns; ++c)
      paged.table[b * paged.table_stride + c] = order[b * columns + c];
    for (int64_t j = 0; j < p.seqlen_k; ++j) {
      const int64_t page = paged.table[b * paged.table_stride + j / page_size];
      const int64_t row = page * page_size + j % page_size;
      for (int64_t h = 0; h < p.heads_kv; ++h) {
        for (int64_t d = 0; d < p.head_dim; ++d) {
          paged.k.set(
              row * row_k + h * p.head_dim + d,
              dense.k.get(b * p.k_strides.batch + h * p.k_strides.head + j * p.k_strides.seq + d));
        }
        for (int64_t d = 0; d < p.head_dim_v; ++d) {
          paged.v.set(
              row * row_v + h * p.head_dim_v + d,
              dense.v.get(b * p.v_strides.batch + h * p.v_strides.head + j * p.v_strides.seq + d));
        }
      }
    }
  }
  return paged;
}

// Points `p` at the pool: (pages, page_size, Hkv, D) storage, FlashAttention's layout.
inline void bind_pages(AttentionParams& p, PagedCopy& paged, int64_t page_size) {
  p.k = paged.k.data();
  p.v = paged.v.data();
  p.k_strides = {page_size * p.heads_kv * p.head_dim, p.head_dim, p.heads_kv * p.head_dim};
  p.v_strides = {page_size * p.heads_kv * p.head_dim_v, p.head_dim_v, p.heads_kv * p.head_dim_v};
  p.mask.block_table = paged.table.data();
  p.mask.block_table_stride = paged.table_stride;
  p.mask.page_size = page_size;
  p.mask.num_pages = paged.pages;
}

// NaN in every k and v row past its entry's cache_seqlens: rows the call must never read.
inline void poison_rows_past_lengths(Problem& pb, const std::vector<int32_t>& lengths) {
  const AttentionParams& p = pb.params;
  for (int64_t b = 0; b < static_cast<int64_t>(lengths.size()); ++b) {
    for (int64_t h = 0; h < p.heads_kv; ++h) {
      for (int64_t j = lengths[b]; j < p.seqlen_k; ++j) {
        for (int64_t d = 0; d < p.head_dim; ++d) {
          pb.k.set(b * p.k_strides.batch + h * p.k_strides.head + j * p.k_strides.seq + d,
                   std::nan(""));
        }
        for (int64_t d = 0; d < p.head_dim_v; ++d) {
          pb.v.set(b * p.v_strides.batch + h * p.v_strides.head + j * p.v_strides.seq + d,
                   std::nan(""));
        }
      }
    }
  }
}

// Per-element bound |out - ref| <= rtol * |ref| + atol * max|ref|: rtol covers rounding the
// output to its dtype (twice the unit roundoff), atol the accumulated error of the arithmetic.
struct Tolerance {
  double rtol, atol;
};

inline Tolerance tolerance_for(DType dtype) {
  switch (dtype) {
    case DType::kFloat64:
      return {1e-12, 1e-12};
    case DType::kFloat32:
      return {1e-5, 1e-5};
    case DType::kFloat16:
      return {std::ldexp(1.0, -10), 1e-4};
    case DType::kBFloat16:
      return {std::ldexp(1.0, -7), 1e-4};
  }
  return {0, 0};
}

// Largest magnitude of a tensor's elements.
inline double max_abs(const HostTensor& t) {
  double m = 0;
  for (int64_t i = 0; i < t.size(); ++i) m = std::max(m, std::fabs(t.get(i)));
  return m;
}

// Checks every element: finite where the reference is, and within the dtype's tolerance. The
// atol term scales with max|ref|, or with `scale_floor` when that is larger: a result that is a
// sum of cancelling terms (a gradient can be exactly zero) carries rounding error of the size of
// its terms, not of its value.
inline ::testing::AssertionResult all_close(const HostTensor& out, const HostTensor& ref,
                                            DType dtype, double scale_floor = 0) {
  const Tolerance tol = tolerance_for(dtype);
  const double scale = std::max(max_abs(ref), scale_floor);
  int64_t bad = 0;
  std::string first;
  for (int64_t i = 0; i < ref.size(); ++i) {
    const double o = out.get(i), r = ref.get(i);
    const bool ok = std::isnan(r) ? std::isnan(o)
                                  : std::fabs(o - r) <= tol.rtol * std::fabs(r) + tol.atol * scale;
    if (!ok && bad++ == 0) {
      first = "element " + std::to_string(i) + ": got " + std::to_string(o) + ", expected " +
              std::to_string(r);
    }
  }
  if (bad == 0) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure()
         << bad << " of " << ref.size() << " elements out of tolerance; first " << first;
}

// A device copy of a host tensor.
class DeviceBuffer {
 public:
  explicit DeviceBuffer(size_t bytes) : bytes_(bytes) {
    if (bytes_ > 0) {
      EXPECT_EQ(cudaMalloc(&ptr_, bytes_), cudaSuccess);
    }
  }
  explicit DeviceBuffer(const HostTensor& t) : DeviceBuffer(t.bytes.size()) { upload(t); }
  ~DeviceBuffer() {
    if (ptr_) cudaFree(ptr_);
  }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  void* get() const { return ptr_; }
  void upload(const HostTensor& t) {
    if (bytes_ > 0) {
      EXPECT_EQ(cudaMemcpy(ptr_, t.data(), bytes_, cudaMemcpyHostToDevice), cudaSuccess);
    }
  }
  void download(void* dst) const {
    if (bytes_ > 0) {
      EXPECT_EQ(cudaMemcpy(dst, ptr_, bytes_, cudaMemcpyDeviceToHost), cudaSuccess);
    }
  }

 private:
  void* ptr_ = nullptr;
  size_t bytes_;
};

// Device copies of a problem's q, k, v and out (out keeps the poison pattern), and the problem's
// parameters pointing at them, so kernels and alignment checks see what a real call would.
struct DeviceProblem {
  Problem pb;
  DeviceBuffer q, k, v, out;
  explicit DeviceProblem(Problem problem)
      : pb(std::move(problem)), q(pb.q), k(pb.k), v(pb.v), out(pb.out) {
    pb.params.q = q.get();
    pb.params.k = k.get();
    pb.params.v = v.get();
    pb.params.out = out.get();
  }
  explicit DeviceProblem(const Shape& shape, DType dtype = DType::kFloat16)
      : DeviceProblem(Problem(shape, dtype)) {}
};

// "" on a compute capability 9.0 GPU, else why not (the Hopper kernels need one).
inline std::string sm90_skip_reason() {
  if (!gpu_available()) return "no CUDA GPU";
  int device = 0, major = 0, minor = 0;
  if (cudaGetDevice(&device) != cudaSuccess ||
      cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device) != cudaSuccess ||
      cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device) != cudaSuccess ||
      major != 9 || minor != 0) {
    return "no compute capability 9.0 GPU";
  }
  return "";
}

// Why the Hopper forward cannot run a plain bf16 call here, or "" when it can: it needs a
// compute capability 9.0 GPU and a library built with the sm_90a kernels (SAMATTN_HAVE_SM90),
// which then has every supported head dim. On such a GPU any other refusal is a bug, and the
// tests fail instead of skipping.
inline std::string hopper_skip_reason() {
  const std::string no_sm90 = sm90_skip_reason();
  if (!no_sm90.empty()) return no_sm90;
  DeviceProblem dp({1, 1, 1, 8, 8, 64, 64}, DType::kBFloat16);
  dp.pb.params.backend = Backend::kHopper;
  try {
    select_backend(dp.pb.params);
  } catch (const Error& error) {
    const std::string why = error.what();
    if (why.find("this build") == std::string::npos) {
      ADD_FAILURE() << "the Hopper forward refused a plain bf16 call on sm90: " << why;
    }
    return "hopper backend unavailable: " + why;
  }
  return "";
}

#define SKIP_WITHOUT_HOPPER()                        \
  do {                                               \
    const std::string reason = hopper_skip_reason(); \
    if (!reason.empty()) GTEST_SKIP() << reason;     \
  } while (0)

// Sets an environment variable for one scope (the library reads its tuning variables on every
// call), then unsets it.
class ScopedEnvironmentVariable {
 public:
  ScopedEnvironmentVariable(const char* name, const std::string& value) : name_(name) {
    setenv(name, value.c_str(), 1);
  }
  ~ScopedEnvironmentVariable() { unsetenv(name_); }
  ScopedEnvironmentVariable(const ScopedEnvironmentVariable&) = delete;
  ScopedEnvironmentVariable& operator=(const ScopedEnvironmentVariable&) = delete;

 private:
  const char* name_;
};

// SAMATTN_HOPPER_ABLATION (the Hopper forward's feature switches) for one scope.
struct ScopedHopperAblation : ScopedEnvironmentVariable {
  explicit ScopedHopperAblation(const char* value)
      : ScopedEnvironmentVariable("SAMATTN_HOPPER_ABLATION", value) {}
};

// SAMATTN_HOPPER_TILE (the Hopper forward's tile-table entry) for one scope.
struct ScopedHopperTile : ScopedEnvironmentVariable {
  explicit ScopedHopperTile(int variant)
      : ScopedEnvironmentVariable("SAMATTN_HOPPER_TILE", std::to_string(variant)) {}
};

}  // namespace samattn::testing
