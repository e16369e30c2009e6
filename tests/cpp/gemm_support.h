// Test helpers for gemm() and softmax(): random problems in any layout, the fp64 reference, and
// the error bound of a dtype (deterministic, per element):
//   |c - ref| <= u_out |ref| + (K + 2) u_acc (|alpha| (|A||B|)_ij + |beta| |C_ij|)
// where u_out rounds the output to its dtype and u_acc is the accumulator's unit roundoff
// (2^-24 for IEEE float, doubled for tensor-core accumulation (sm90_wgmma, sm80_mma), which may
// truncate; 2^-53 for float64). TF32 adds its own input rounding, 2 * 2^-10 of |alpha| (|A||B|)_ij
// (truncation by the wgmma path, round-to-nearest by the mma.sync path: both below 2^-10).
#pragma once

#include <cmath>
#include <string>
#include <vector>

#include "samattn/gemm.h"
#include "test_support.h"

namespace samattn::testing {

struct GemmLayout {
  bool trans_a = false;  // A stored K x M (column-major A)
  bool trans_b = false;  // B stored N x K
  bool c_col_major = false;
  int64_t pad = 0;  // extra elements in every leading dimension
  int64_t batch = 1;
  bool broadcast_b = false;  // B's batch stride 0
  double alpha = 1.0, beta = 0.0;
  bool allow_tf32 = false;
  GemmBackend backend = GemmBackend::kAuto;
};

struct GemmProblem {
  int64_t m, n, k;
  GemmLayout layout;
  DType dtype;
  HostTensor a, b, c, c_in;  // c_in: C before the call (for beta)
  GemmParams params;

  GemmProblem(int64_t m_, int64_t n_, int64_t k_, DType type, const GemmLayout& l, uint64_t seed)
      : m(m_), n(n_), k(k_), layout(l), dtype(type) {
    GemmParams& p = params;
    p.dtype = type;
    p.m = m;
    p.n = n;
    p.k = k;
    p.batch = l.batch;
    p.alpha = l.alpha;
    p.beta = l.beta;
    p.allow_tf32 = l.allow_tf32;
    p.backend = l.backend;
    const int64_t lda = (l.trans_a ? m : k) + l.pad, ldb = (l.trans_b ? k : n) + l.pad;
    const int64_t ldc = (l.c_col_major ? m : n) + l.pad;
    const int64_t a_size = (l.trans_a ? k : m) * lda, b_size = (l.trans_b ? n : k) * ldb;
    const int64_t c_size = (l.c_col_major ? n : m) * ldc;
    p.a_row_stride = l.trans_a ? 1 : lda;
    p.a_col_stride = l.trans_a ? lda : 1;
    p.a_batch_stride = a_size;
    p.b_row_stride = l.trans_b ? 1 : ldb;
    p.b_col_stride = l.trans_b ? ldb : 1;
    p.b_batch_stride = l.broadcast_b ? 0 : b_size;
    p.c_row_stride = l.c_col_major ? 1 : ldc;
    p.c_col_stride = l.c_col_major ? ldc : 1;
    p.c_batch_stride = c_size;
    a = HostTensor(type, a_size * l.batch);
    b = HostTensor(type, b_size * (l.broadcast_b ? 1 : l.batch));
    c = HostTensor(type, c_size * l.batch);
    fill_random(a, seed);
    fill_random(b, seed + 1);
    if (l.beta != 0.0) {
      fill_random(c, seed + 2);
    } else {
      c.poison();  // NaN everywhere: beta == 0 must not read C
    }
    c_in = c;
    bind(a.data(), b.data(), c.data());
  }

  void bind(const void* pa, const void* pb, void* pc) {
    params.a = pa;
    params.b = pb;
    params.c = pc;
  }

  int64_t c_offset(int64_t l, int64_t i, int64_t j) const {
    return l * params.c_batch_stride + i * params.c_row_stride + j * params.c_col_stride;
  }

  // The exact product in fp64 (in C's storage, not rounded to the dtype: the kernel's output
  // is rounded once, and the bound's u_out term covers that) and the per-element error bound
  // of `kernel` ("simt", "simt_fp64", "sm90_wgmma", "sm80_mma").
  void expected(HostTensor& ref, std::vector<double>& bound, const std::string& kernel) const {
    HostTensor a64(DType::kFloat64, a.size()), b64(DType::kFloat64, b.size());
    for (int64_t i = 0; i < a.size(); ++i) a64.set(i, a.get(i));
    for (int64_t i = 0; i < b.size(); ++i) b64.set(i, b.get(i));
    ref = HostTensor(DType::kFloat64, c_in.size());
    for (int64_t i = 0; i < c_in.size(); ++i) ref.set(i, c_in.get(i));
    GemmParams p = params;
    p.dtype = DType::kFloat64;
    p.allow_tf32 = false;
    p.a = a64.data();
    p.b = b64.data();
    p.c = ref.data();
    reference_gemm(p);
    // |A| |B| in fp64, in a float64 copy of C's layout.
    HostTensor abs_a(DType::kFloat64, a.size()), abs_b(DType::kFloat64, b.size());
    for (int64_t i = 0; i < a.size(); ++i) abs_a.set(i, std::fabs(a.get(i)));
    for (int64_t i = 0; i < b.size(); ++i) abs_b.set(i, std::fabs(b.get(i)));
    HostTensor abs_ab(DType::kFloat64, c.size());
    GemmParams q = params;
    q.dtype = DType::kFloat64;
    q.a = abs_a.data();
    q.b = abs_b.data();
    q.c = abs_ab.data();
    q.alpha = 1.0;
    q.beta = 0.0;
    q.allow_tf32 = false;
    reference_gemm(q);
    double u_out = 0, u_acc = 0, u_in = 0;
    switch (dtype) {
      case DType::kFloat64:
        u_out = std::ldexp(1.0, -53);
        u_acc = u_out;
        break;
      case DType::kFloat32:
        u_out = std::ldexp(1.0, -24);
        u_acc = u_out;
        break;
      case DType::kFloat16:
        u_out = std::ldexp(1.0, -11);
        u_acc = std::ldexp(1.0, -24);
        break;
      case DType::kBFloat16:
        u_out = std::ldexp(1.0, -8);
        u_acc = std::ldexp(1.0, -24);
        break;
    }
    const bool tensor_cores = kernel == "sm90_wgmma" || kernel == "sm80_mma";
    if (tensor_cores) u_acc *= 2;
    // TF32 keeps 10 mantissa bits of each float32 input (< 2^-10 relative either way).
    if (tensor_cores && dtype == DType::kFloat32) u_in = 2 * std::ldexp(1.0, -10);
    bound.assign(c.size(), 0.0);
    const double gamma = (k + 2) * u_acc;
    for (int64_t l = 0; l < params.batch; ++l) {
      for (int64_t i = 0; i < m; ++i) {
        for (int64_t j = 0; j < n; ++j) {
          const int64_t o = c_offset(l, i, j);
          const double prod = std::fabs(params.alpha) * abs_ab.get(o);
          const double src = params.beta != 0.0 ? std::fabs(params.beta * c_in.get(o)) : 0.0;
          // A subnormal floor: results near zero are rounded to the output's grid.
          const double tiny = dtype == DType::kFloat16 ? std::ldexp(1.0, -24) : 0.0;
          // Rounding the computed value, whose own error is the accumulation term.
          bound[o] = u_out * std::fabs(ref.get(o)) +
                     (1 + u_out) * (gamma * (prod + src) + u_in * prod) + tiny;
        }
      }
    }
  }

  // Every element of every batch within its bound; NaN never passes.
  ::testing::AssertionResult check(const HostTensor& out, const std::string& kernel) const {
    HostTensor ref;
    std::vector<double> bound;
    expected(ref, bound, kernel);
    int64_t bad = 0;
    std::string first;
    for (int64_t l = 0; l < params.batch; ++l) {
      for (int64_t i = 0; i < m; ++i) {
        for (int64_t j = 0; j < n; ++j) {
          const int64_t o = c_offset(l, i, j);
          const double got = out.get(o), want = ref.get(o);
          if (!(std::fabs(got - want) <= bound[o]) && bad++ == 0) {
            first = "(" + std::to_string(l) + ", " + std::to_string(i) + ", " + std::to_string(j) +
                    "): got " + std::to_string(got) + ", expected " + std::to_string(want) +
                    ", bound " + std::to_string(bound[o]);
          }
        }
      }
    }
    if (bad == 0) return ::testing::AssertionSuccess();
    return ::testing::AssertionFailure()
           << bad << " of " << params.batch * m * n << " elements out of bound; first at " << first;
  }
};

}  // namespace samattn::testing
