// GPU tests of gemm() and softmax() against the fp64 reference: every dtype, sizes 1, 7, 129,
// 1000 in M, N and K independently, transposes, padded leading dimensions, batches, a
// broadcast B, alpha/beta, TF32, and C poisoned with NaN whenever beta == 0. Skip without a GPU.
#include <cmath>
#include <string>
#include <tuple>
#include <vector>

#include <gtest/gtest.h>

#include "gemm_support.h"
#include "samattn/gemm.h"
#include "test_support.h"

namespace samattn::testing {
namespace {

struct GemmCase {
  std::string name;
  int64_t m, n, k;
  GemmLayout layout;
};

std::vector<GemmCase> gemm_cases() {
  std::vector<GemmCase> cases;
  const int64_t sizes[] = {1, 7, 129, 1000};
  // Each of M, N, K over the sizes with the other two fixed (tails in every dimension).
  for (int64_t s : sizes) {
    cases.push_back({"m" + std::to_string(s), s, 72, 136, {}});
    cases.push_back({"n" + std::to_string(s), 136, s, 72, {}});
    cases.push_back({"k" + std::to_string(s), 72, 136, s, {}});
  }
  cases.push_back({"all1", 1, 1, 1, {}});
  cases.push_back({"all7", 7, 7, 7, {}});
  cases.push_back({"all129", 129, 129, 129, {}});
  cases.push_back({"big_1000_129_1000", 1000, 129, 1000, {}});
  GemmLayout l;
  // Layouts on an aligned shape (the tensor-core path where the dtype has one) and on a ragged one.
  const std::tuple<const char*, int64_t, int64_t, int64_t> shapes[] = {{"aligned", 256, 264, 200},
                                                                       {"ragged", 129, 7, 1000}};
  for (const auto& [shape, m, n, k] : shapes) {
    const std::string s = shape;
    l = {};
    l.trans_a = true;
    cases.push_back({s + "_trans_a", m, n, k, l});
    l = {};
    l.trans_b = true;
    cases.push_back({s + "_trans_b", m, n, k, l});
    l = {};
    l.trans_a = l.trans_b = true;
    cases.push_back({s + "_trans_ab", m, n, k, l});
    l = {};
    l.c_col_major = true;
    cases.push_back({s + "_c_col_major", m, n, k, l});
    l = {};
    l.pad = 8;
    cases.push_back({s + "_padded", m, n, k, l});
    l = {};
    l.pad = 3;
    cases.push_back({s + "_padded_odd", m, n, k, l});
    l = {};
    l.batch = 3;
    cases.push_back({s + "_batched", m, n, k, l});
    l = {};
    l.batch = 2;
    l.broadcast_b = true;
    l.trans_b = true;
    cases.push_back({s + "_broadcast_b", m, n, k, l});
    l = {};
    l.alpha = -0.75;
    l.beta = 1.5;
    cases.push_back({s + "_alpha_beta", m, n, k, l});
    l = {};
    l.alpha = 0.125;
    l.trans_a = true;
    l.c_col_major = true;
    cases.push_back({s + "_alpha_trans_a_c_col", m, n, k, l});
  }
  return cases;
}

class GemmGpu : public ::testing::TestWithParam<std::tuple<DType, GemmCase>> {};

void run_and_check(GemmProblem& problem) {
  DeviceBuffer da(problem.a), db(problem.b), dc(problem.c);
  problem.bind(da.get(), db.get(), dc.get());
  const std::string kernel = selected_gemm_kernel(problem.params);
  gemm(problem.params, nullptr);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  HostTensor out = problem.c;
  dc.download(out.data());
  EXPECT_TRUE(problem.check(out, kernel)) << "kernel " << kernel;
}

TEST_P(GemmGpu, MatchesReference) {
  SKIP_WITHOUT_GPU();
  const auto& [dtype, c] = GetParam();
  GemmProblem problem(c.m, c.n, c.k, dtype, c.layout, std::hash<std::string>{}(c.name));
  run_and_check(problem);
}

std::string case_name(const ::testing::TestParamInfo<GemmGpu::ParamType>& info) {
  return std::string(dtype_name(std::get<0>(info.param))) + "_" + std::get<1>(info.param).name;
}

INSTANTIATE_TEST_SUITE_P(AllDtypes, GemmGpu,
                         ::testing::Combine(::testing::Values(DType::kFloat64, DType::kFloat32,
                                                              DType::kFloat16, DType::kBFloat16),
                                            ::testing::ValuesIn(gemm_cases())),
                         case_name);

TEST(GemmGpuTf32, MatchesReferenceWithinTf32Bound) {
  SKIP_WITHOUT_GPU();
  for (const auto& [m, n, k] :
       {std::tuple<int64_t, int64_t, int64_t>{256, 264, 200}, {129, 7, 1000}, {1000, 136, 1000}}) {
    GemmLayout l;
    l.trans_b = true;  // both operands k-major: the TF32 tensor-core layout
    l.allow_tf32 = true;
    GemmProblem problem(m, n, k, DType::kFloat32, l, 5);
    run_and_check(problem);
    GemmLayout rows;  // row-major B: falls back to the IEEE kernel
    rows.allow_tf32 = true;
    GemmProblem other(m, n, k, DType::kFloat32, rows, 6);
    run_and_check(other);
  }
}

TEST(GemmGpuKernels, Float32StaysIeeeUnlessTf32Allowed) {
  SKIP_WITHOUT_GPU();
  GemmProblem problem(256, 256, 256, DType::kFloat32, GemmLayout{}, 1);
  EXPECT_STREQ(selected_gemm_kernel(problem.params), "simt");
  GemmProblem f64(256, 256, 256, DType::kFloat64, GemmLayout{}, 1);
  EXPECT_STREQ(selected_gemm_kernel(f64.params), "simt_fp64");
}

class SoftmaxGpu : public ::testing::TestWithParam<std::tuple<DType, int64_t, bool>> {};

TEST_P(SoftmaxGpu, MatchesReference) {
  SKIP_WITHOUT_GPU();
  const auto& [dtype, cols, causal] = GetParam();
  const int64_t batch = 2, rows = 37, pitch = cols + 5;
  HostTensor in(dtype, batch * rows * pitch), out(dtype, batch * rows * cols);
  fill_random(in, 100 + cols);
  for (int64_t i = 0; i < in.size(); ++i) in.set(i, 4 * in.get(i));  // spread: exercises max
  out.poison();
  SoftmaxParams p;
  p.dtype = dtype;
  p.batch = batch;
  p.rows = rows;
  p.cols = cols;
  p.in_row_stride = pitch;
  p.in_batch_stride = rows * pitch;
  p.out_row_stride = cols;
  p.out_batch_stride = rows * cols;
  p.scale = 0.6;
  p.causal = causal;
  HostTensor ref(dtype, out.size());
  SoftmaxParams r = p;
  r.in = in.data();
  r.out = ref.data();
  reference_softmax(r);
  DeviceBuffer din(in), dout(out);
  p.in = din.get();
  p.out = dout.get();
  softmax(p, nullptr);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  dout.download(out.data());
  EXPECT_TRUE(all_close(out, ref, dtype));
}

INSTANTIATE_TEST_SUITE_P(AllDtypes, SoftmaxGpu,
                         ::testing::Combine(::testing::Values(DType::kFloat64, DType::kFloat32,
                                                              DType::kFloat16, DType::kBFloat16),
                                            ::testing::Values<int64_t>(1, 7, 129, 1000, 5000),
                                            ::testing::Bool()),
                         [](const auto& info) {
                           return std::string(dtype_name(std::get<0>(info.param))) + "_cols" +
                                  std::to_string(std::get<1>(info.param)) +
                                  (std::get<2>(info.param) ? "_causal" : "");
                         });

}  // namespace
}  // namespace samattn::testing
