// Every invalid field is rejected before any launch, with a message naming it.
#include <functional>
#include <string>

#include "attention/tensor_core/forward_launch.h"
#include "test_support.h"

namespace samattn::testing {
namespace {

struct Case {
  const char* name;
  std::function<void(AttentionParams&)> corrupt;
  const char* expected_words;
};

AttentionParams valid_params() {
  AttentionParams p;
  static float dummy[1];
  p.q = p.k = p.v = dummy;
  p.out = dummy;
  p.dtype = DType::kFloat32;
  p.batch = 1;
  p.heads_q = 4;
  p.heads_kv = 2;
  p.seqlen_q = 3;
  p.seqlen_k = 5;
  p.head_dim = 8;
  p.head_dim_v = 8;
  return p;
}

void PrintTo(const Case& c, std::ostream* os) { *os << c.name; }

class Validation : public ::testing::TestWithParam<Case> {};

TEST_P(Validation, RejectsWithNamedArgument) {
  AttentionParams p = valid_params();
  ASSERT_TRUE(can_implement(p).ok());
  GetParam().corrupt(p);
  const Status status = can_implement(p);
  ASSERT_FALSE(status.ok());
  EXPECT_NE(status.message().find(GetParam().expected_words), std::string::npos)
      << status.message();
  // attention_forward throws the same message, before touching the (host) pointers.
  try {
    attention_forward(p, nullptr);
    FAIL() << "attention_forward accepted invalid params";
  } catch (const Error& error) {
    EXPECT_EQ(std::string(error.what()), status.message());
  }
}

const Case kCases[] = {
    {"dtype", [](AttentionParams& p) { p.dtype = static_cast<DType>(42); }, "dtype 42"},
    {"batch", [](AttentionParams& p) { p.batch = -1; }, "batch must be >= 0"},
    {"heads_q", [](AttentionParams& p) { p.heads_q = 0; }, "heads_q must be >= 1"},
    {"heads_kv", [](AttentionParams& p) { p.heads_kv = 0; }, "heads_kv must be >= 1"},
    {"gqa_ratio", [](AttentionParams& p) { p.heads_kv = 3; },
     "heads_q (4) must be a multiple of heads_kv (3)"},
    {"seqlen_q", [](AttentionParams& p) { p.seqlen_q = -2; }, "seqlen_q must be >= 0"},
    {"seqlen_k", [](AttentionParams& p) { p.seqlen_k = -2; }, "seqlen_k must be >= 0"},
    {"head_dim_zero", [](AttentionParams& p) { p.head_dim = 0; }, "head_dim must be in [1, 256]"},
    {"head_dim_big", [](AttentionParams& p) { p.head_dim = 257; }, "got 257"},
    {"head_dim_v", [](AttentionParams& p) { p.head_dim_v = 300; }, "head_dim_v must be in"},
    {"kv_stride", [](AttentionParams& p) { p.kv_stride = 0; }, "kv_stride must be >= 1"},
    {"scale_nan", [](AttentionParams& p) { p.softmax_scale = NAN; },
     "softmax_scale must be finite"},
    {"scale_inf", [](AttentionParams& p) { p.softmax_scale = INFINITY; }, "softmax_scale"},
    {"null_q", [](AttentionParams& p) { p.q = nullptr; }, "q must not be null"},
    {"null_k", [](AttentionParams& p) { p.k = nullptr; }, "k must not be null"},
    {"null_v", [](AttentionParams& p) { p.v = nullptr; }, "v must not be null"},
    {"null_out", [](AttentionParams& p) { p.out = nullptr; }, "out must not be null"},
    {"backend", [](AttentionParams& p) { p.backend = static_cast<Backend>(9); }, "backend 9"},
};

INSTANTIATE_TEST_SUITE_P(AllFields, Validation, ::testing::ValuesIn(kCases),
                         [](const auto& info) { return std::string(info.param.name); });

TEST(ValidationEdges, EmptyProblemsNeedNoPointers) {
  AttentionParams p = valid_params();
  p.seqlen_q = 0;
  p.q = p.k = p.v = nullptr;
  p.out = nullptr;
  EXPECT_TRUE(can_implement(p).ok());
  EXPECT_NO_THROW(attention_forward(p, nullptr));  // nothing to do, nothing launched
  p.seqlen_q = 3;
  p.seqlen_k = 0;
  float out[4 * 3 * 8];
  p.out = out;
  p.q = out;
  EXPECT_TRUE(can_implement(p).ok());  // no keys: k and v are never read
}

// Devices the test machine may not be: the tensor-core path declines (and a forced call raises
// this message) when the device lacks the compute capability or the shared memory.
TEST(ValidationEdges, TensorCorePathNamesWhatTheDeviceLacks) {
  AttentionParams p = valid_params();
  p.dtype = DType::kBFloat16;
  p.head_dim = p.head_dim_v = 256;
  alignas(16) static unsigned char storage[64];
  p.q = p.k = p.v = storage;
  p.out = storage;
  p.q_strides = p.out_strides = {4 * 3 * 256, 3 * 256, 256};
  p.k_strides = p.v_strides = {2 * 5 * 256, 5 * 256, 256};
  const detail::DeviceInfo small_smem{0, 8, 6, 48 * 1024, 10};
  const Status smem = tensor_core::supports(p, small_smem);
  ASSERT_FALSE(smem.ok());
  EXPECT_NE(smem.message().find("head_dim 256 on this device: it needs"), std::string::npos)
      << smem.message();
  EXPECT_NE(smem.message().find("the device allows 49152"), std::string::npos) << smem.message();
  const detail::DeviceInfo turing{0, 7, 5, 64 * 1024, 40};
  const Status arch = tensor_core::supports(p, turing);
  ASSERT_FALSE(arch.ok());
  EXPECT_NE(arch.message().find("compute capability 7.5 (needs 8.0 or newer)"), std::string::npos)
      << arch.message();
  const detail::DeviceInfo hopper{0, 9, 0, 227 * 1024, 132};
  EXPECT_TRUE(tensor_core::supports(p, hopper).ok()) << tensor_core::supports(p, hopper).message();
}

TEST(ValidationEdges, DefaultScaleIsInverseSqrtHeadDim) {
  EXPECT_DOUBLE_EQ(default_softmax_scale(64), 0.125);
  EXPECT_THROW(default_softmax_scale(0), Error);
}

}  // namespace
}  // namespace samattn::testing
