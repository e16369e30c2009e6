// The CUDA forward against the fp64 reference: every dtype and option, awkward shapes, outputs
// poisoned before the launch and every element checked. Skipped without a GPU.
#include <cmath>
#include <string>
#include <vector>

#include "test_support.h"

namespace samattn::testing {
namespace {

const Scenario kScenarios[] = {
    {"dense", {2, 3, 3, 77, 129, 64, 64}},
    {"causal", {2, 2, 2, 129, 129, 64, 64}, true},
    {"causal_sq_gt_sk", {1, 2, 2, 100, 37, 32, 32}, true},
    {"causal_sq_lt_sk", {1, 2, 2, 37, 100, 32, 32}, true},
    {"kv_stride3", {2, 2, 2, 65, 130, 64, 64}, false, 3},
    {"kv_stride4_causal", {1, 2, 2, 200, 200, 32, 32}, true, 4},
    {"gqa_4to1", {2, 8, 2, 33, 70, 64, 64}},
    {"mqa", {1, 6, 1, 40, 41, 32, 32}, true},
    {"seq_major_layout", {2, 4, 2, 50, 61, 40, 40}, false, 1, true},
    {"head_dims_40_72", {1, 2, 2, 31, 45, 40, 72}},
    {"head_dim_256", {1, 2, 1, 70, 90, 256, 256}, true},
    {"head_dim_8", {1, 3, 3, 9, 10, 8, 8}},
    {"head_dim_1", {1, 1, 1, 5, 6, 1, 1}},
    {"single_query", {3, 2, 2, 1, 1000, 96, 96}},
    {"single_key", {1, 2, 2, 20, 1, 16, 16}},
    {"long_keys", {1, 1, 1, 64, 1000, 128, 128}, false, 1, false, 0.3},
    {"no_keys", {1, 2, 2, 10, 0, 16, 16}},
};

std::vector<Case> all_cases() {
  return cases_in({DType::kFloat64, DType::kFloat32, DType::kFloat16, DType::kBFloat16},
                  kScenarios);
}

class ForwardGpu : public ::testing::TestWithParam<Case> {};

TEST_P(ForwardGpu, MatchesReference) {
  SKIP_WITHOUT_GPU();
  const Scenario& sc = GetParam().scenario;
  const DType dtype = GetParam().dtype;
  Problem pb(sc.shape, dtype, sc.seq_major, sc.seed());
  sc.apply_options(pb.params);
  const HostTensor expected = pb.reference(/*with_lse=*/true);

  DeviceProblem dp(pb);
  const int64_t rows = sc.shape.batch * sc.shape.heads_q * sc.shape.seqlen_q;
  const size_t lse_bytes = rows * (dtype == DType::kFloat64 ? 8 : 4);
  DeviceBuffer lse(lse_bytes);
  if (lse_bytes > 0) ASSERT_EQ(cudaMemset(lse.get(), 0xff, lse_bytes), cudaSuccess);
  AttentionParams p = dp.pb.params;
  p.lse = lse.get();
  p.backend = Backend::kSimt;
  attention_forward(p, nullptr);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);

  HostTensor got(dtype, pb.out.size());
  dp.out.download(got.data());
  EXPECT_TRUE(all_close(got, expected, dtype));

  std::vector<double> lse_got(rows);
  if (dtype == DType::kFloat64) {
    lse.download(lse_got.data());
  } else {
    std::vector<float> lse32(rows);
    lse.download(lse32.data());
    lse_got.assign(lse32.begin(), lse32.end());
  }
  const double lse_tol = dtype == DType::kFloat64 ? 1e-12 : 1e-5;
  for (int64_t i = 0; i < rows; ++i) {
    if (std::isinf(pb.lse[i])) {
      EXPECT_EQ(lse_got[i], pb.lse[i]) << "row " << i;
    } else {
      EXPECT_NEAR(lse_got[i], pb.lse[i], lse_tol * (1 + std::fabs(pb.lse[i]))) << "row " << i;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(AllDtypes, ForwardGpu, ::testing::ValuesIn(all_cases()), case_name);

TEST(ForwardGpuRuns, RerunsAreBitIdentical) {
  SKIP_WITHOUT_GPU();
  Problem pb({2, 4, 4, 300, 300, 64, 64}, DType::kFloat16);
  pb.params.causal = true;
  DeviceProblem dp(pb);
  HostTensor first(DType::kFloat16, pb.out.size()), second(DType::kFloat16, pb.out.size());
  attention_forward(dp.pb.params, nullptr);
  dp.out.download(first.data());
  attention_forward(dp.pb.params, nullptr);
  dp.out.download(second.data());
  EXPECT_EQ(first.bytes, second.bytes);
}

}  // namespace
}  // namespace samattn::testing
