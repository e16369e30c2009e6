// GPU tests of gemm() and softmax() against the fp64 reference: every dtype, sizes 1, 7, 129,
// 1000 in M, N and K independently, transposes, padded leading dimensions, batches, a
// broadcast B, alpha/beta, TF32, and C poisoned with NaN whenever beta == 0; the same cases
// with each kernel family forced (sm80 mma.sync for float16/bfloat16/TF32, the CUDA-core
// kernels for float16/bfloat16). Skip without a GPU (and the sm80 cases below sm80).
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
  cases.push_back({"raster_2100_300_64", 2100, 300, 64, {}});  // 17 row tiles: 3 raster groups
  GemmLayout l;
  // K tails with aligned leading dimensions (16-byte copies that end inside a chunk), and
  // M/N tails of mn-major operands.
  l.trans_b = true;
  l.pad = 7;
  cases.push_back({"k_tail_aligned_k_major", 200, 264, 1001, l});
  l = {};
  l.trans_a = true;
  l.pad = 7;
  cases.push_back({"mn_tail_aligned_mn_major", 129, 257, 77, l});
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

void run_and_check(GemmProblem& problem, const char* expected_kernel = nullptr) {
  DeviceBuffer da(problem.a), db(problem.b), dc(problem.c);
  problem.bind(da.get(), db.get(), dc.get());
  const std::string kernel = selected_gemm_kernel(problem.params);
  if (expected_kernel != nullptr) ASSERT_EQ(kernel, expected_kernel);
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

int compute_capability_major() {
  int device = 0, major = 0;
  if (cudaGetDevice(&device) != cudaSuccess) return 0;
  if (cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device) != cudaSuccess) {
    return 0;
  }
  return major;
}

// The sm80 mma.sync kernel forced, in every dtype it runs (float32 in TF32), on every case.
class GemmGpuSm80 : public ::testing::TestWithParam<std::tuple<DType, GemmCase>> {};

TEST_P(GemmGpuSm80, MatchesReference) {
  SKIP_WITHOUT_GPU();
  if (compute_capability_major() < 8) GTEST_SKIP() << "the sm80 kernel needs sm80+";
  const auto& [dtype, c] = GetParam();
  GemmLayout layout = c.layout;
  layout.backend = GemmBackend::kSm80;
  layout.allow_tf32 = dtype == DType::kFloat32;
  GemmProblem problem(c.m, c.n, c.k, dtype, layout, std::hash<std::string>{}(c.name) + 1);
  run_and_check(problem, "sm80_mma");
}

std::string forced_case_name(const ::testing::TestParamInfo<GemmGpuSm80::ParamType>& info) {
  const DType dtype = std::get<0>(info.param);
  return std::string(dtype == DType::kFloat32 ? "tf32" : dtype_name(dtype)) + "_" +
         std::get<1>(info.param).name;
}

INSTANTIATE_TEST_SUITE_P(Forced, GemmGpuSm80,
                         ::testing::Combine(::testing::Values(DType::kFloat16, DType::kBFloat16,
                                                              DType::kFloat32),
                                            ::testing::ValuesIn(gemm_cases())),
                         forced_case_name);

// The CUDA-core kernel forced for the 16-bit dtypes (auto runs them on tensor cores).
class GemmGpuSimt : public ::testing::TestWithParam<std::tuple<DType, GemmCase>> {};

TEST_P(GemmGpuSimt, MatchesReference) {
  SKIP_WITHOUT_GPU();
  const auto& [dtype, c] = GetParam();
  GemmLayout layout = c.layout;
  layout.backend = GemmBackend::kSimt;
  GemmProblem problem(c.m, c.n, c.k, dtype, layout, std::hash<std::string>{}(c.name) + 2);
  run_and_check(problem, "simt");
}

INSTANTIATE_TEST_SUITE_P(Forced, GemmGpuSimt,
                         ::testing::Combine(::testing::Values(DType::kFloat16, DType::kBFloat16),
                                            ::testing::ValuesIn(gemm_cases())),
                         case_name);

TEST(GemmGpuKernels, AutoPicksTheFastestFamilyThatFits) {
  SKIP_WITHOUT_GPU();
  const int major = compute_capability_major();
  GemmLayout odd;
  odd.pad = 3;  // leading dimensions off the 16-byte grid: never TMA
  for (const DType dtype : {DType::kFloat16, DType::kBFloat16}) {
    GemmProblem aligned(256, 256, 256, dtype, GemmLayout{}, 1);
    GemmProblem misaligned(256, 256, 256, dtype, odd, 1);
    if (major >= 8) EXPECT_STREQ(selected_gemm_kernel(misaligned.params), "sm80_mma");
    if (major == 9) EXPECT_STREQ(selected_gemm_kernel(aligned.params), "sm90_wgmma");
  }
  GemmLayout tf32_rows;  // row-major B: not the TF32 wgmma layout
  tf32_rows.allow_tf32 = true;
  GemmProblem tf32(256, 256, 256, DType::kFloat32, tf32_rows, 1);
  if (major >= 8) EXPECT_STREQ(selected_gemm_kernel(tf32.params), "sm80_mma");
}

TEST(GemmGpuKernels, ForcedBackendsRunOrSayWhyNot) {
  SKIP_WITHOUT_GPU();
  const int major = compute_capability_major();
  GemmLayout sm80;
  sm80.backend = GemmBackend::kSm80;
  GemmProblem forced(64, 64, 64, DType::kBFloat16, sm80, 1);
  if (major >= 8) {
    EXPECT_STREQ(selected_gemm_kernel(forced.params), "sm80_mma");
  } else {
    const Status status = can_implement_gemm(forced.params);
    EXPECT_NE(status.message().find("compute capability 8.0"), std::string::npos)
        << status.message();
  }
  GemmLayout sm90;
  sm90.backend = GemmBackend::kSm90;
  sm90.pad = 3;  // misaligned: TMA cannot take it
  GemmProblem misaligned(64, 64, 64, DType::kFloat16, sm90, 1);
  const Status status = can_implement_gemm(misaligned.params);
  EXPECT_FALSE(status.ok());
  EXPECT_NE(status.message().find("backend sm90"), std::string::npos) << status.message();
  EXPECT_THROW(gemm(misaligned.params, nullptr), Error);
  GemmLayout simt;
  simt.backend = GemmBackend::kSimt;
  simt.allow_tf32 = true;  // permission only: the forced CUDA-core kernel stays IEEE
  GemmProblem ieee(64, 64, 64, DType::kFloat32, simt, 1);
  EXPECT_STREQ(selected_gemm_kernel(ieee.params), "simt");
}

TEST(GemmGpuTf32, MatchesReferenceWithinTf32Bound) {
  SKIP_WITHOUT_GPU();
  for (const auto& [m, n, k] :
       {std::tuple<int64_t, int64_t, int64_t>{256, 264, 200}, {129, 7, 1000}, {1000, 136, 1000}}) {
    GemmLayout l;
    l.trans_b = true;  // both operands k-major: the TF32 tensor-core layout
    l.allow_tf32 = true;
    GemmProblem problem(m, n, k, DType::kFloat32, l, 5);
    run_and_check(problem);
    GemmLayout rows;  // row-major B: the sm80 TF32 kernel (sm80+), else the IEEE kernel
    rows.allow_tf32 = true;
    GemmProblem other(m, n, k, DType::kFloat32, rows, 6);
    run_and_check(other);
  }
}

// The fp32 SGEMM's large-tile kernel runs only where its 128 x 256 tiles outnumber the SMs (the
// cases above take the 128 x 128 one): here one more tile row than that, with m, n and k tails,
// k-fast A (transposed into shared memory) and m-fast A (vector stores), alpha and beta.
TEST(GemmGpuSgemm, LargeTileKernelWithTails) {
  SKIP_WITHOUT_GPU();
  int device = 0, sms = 0;
  ASSERT_EQ(cudaGetDevice(&device), cudaSuccess);
  ASSERT_EQ(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device), cudaSuccess);
  constexpr int64_t kTileM = 128, kTileN = 256, kColumnTiles = 8;
  const int64_t row_tiles = (sms + kColumnTiles - 1) / kColumnTiles + 1;
  const int64_t m = row_tiles * kTileM - 37, n = kColumnTiles * kTileN - 100, k = 777;
  for (bool trans_a : {false, true}) {
    SCOPED_TRACE(trans_a ? "m-fast A" : "k-fast A");
    GemmLayout l;
    l.trans_a = trans_a;
    l.alpha = 0.5;
    l.beta = trans_a ? 2.0 : 0.0;
    GemmProblem problem(m, n, k, DType::kFloat32, l, trans_a ? 21 : 22);
    run_and_check(problem, "simt");
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
