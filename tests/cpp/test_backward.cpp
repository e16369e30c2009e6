// The backward: the fp64 CPU reference against finite differences and analytic identities, the
// validation of every field, and (with a GPU) the SIMT backward against the reference for every
// dtype and option, with poisoned outputs and every element checked.
#include <cmath>
#include <cstdlib>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "attention/hopper/backward_config.h"
#include "attention/tensor_core/backward_config.h"
#include "backward_rounding_model.h"
#include "test_support.h"

namespace samattn::testing {
namespace {

// A backward problem in host memory: the forward's inputs, dout, the forward's out and lse as
// the reference forward writes them (out rounded to the dtype), and poisoned gradients.
struct BackwardProblem {
  Problem fwd;
  HostTensor dout, dq, dk, dv;
  std::vector<double> lse64;
  std::vector<float> lse32;
  AttentionBackwardParams params;

  BackwardProblem(const Shape& s, DType dtype, bool causal = false, int64_t kv_stride = 1,
                  bool seq_major = false, uint64_t seed = 1, double scale = 0)
      : fwd(s, dtype, seq_major, seed) {
    fwd.params.causal = causal;
    fwd.params.kv_stride = kv_stride;
    if (scale != 0) fwd.params.softmax_scale = scale;
    fwd.out = fwd.reference(/*with_lse=*/true);
    lse64 = fwd.lse;
    lse32.assign(lse64.begin(), lse64.end());
    dout = HostTensor(dtype, fwd.out.size());
    fill_random(dout, seed + 3);
    dq = HostTensor(dtype, fwd.q.size());
    dk = HostTensor(dtype, fwd.k.size());
    dv = HostTensor(dtype, fwd.v.size());
    dq.poison();
    dk.poison();
    dv.poison();
    params.forward = fwd.params;
    params.dout_strides = fwd.params.out_strides;
    params.dq_strides = fwd.params.q_strides;
    params.dk_strides = fwd.params.k_strides;
    params.dv_strides = fwd.params.v_strides;
    bind_host();
  }

  void bind_host() {
    fwd.bind_host();
    params.forward.q = fwd.q.data();
    params.forward.k = fwd.k.data();
    params.forward.v = fwd.v.data();
    params.forward.out = fwd.out.data();
    params.forward.lse = lse_host();
    params.dout = dout.data();
    params.dq = dq.data();
    params.dk = dk.data();
    params.dv = dv.data();
  }

  void* lse_host() {
    return fwd.dtype == DType::kFloat64 ? static_cast<void*>(lse64.data()) : lse32.data();
  }
  size_t lse_bytes() const {
    return lse64.size() * (fwd.dtype == DType::kFloat64 ? sizeof(double) : sizeof(float));
  }
};

// ---------------------------------------------------------------------------------------------
// The reference against central differences of the reference forward: L = sum(dout * out).

double loss(const BackwardProblem& pb) {
  Problem copy = pb.fwd;
  const HostTensor out = copy.reference();
  double total = 0;
  for (int64_t i = 0; i < out.size(); ++i) total += out.get(i) * pb.dout.get(i);
  return total;
}

// Largest |numeric - analytic| / (1 + |analytic|) over every element of `input`.
double worst_gradient_error(BackwardProblem& pb, HostTensor& input, const HostTensor& grad) {
  constexpr double kStep = 1e-5;
  double worst = 0;
  for (int64_t i = 0; i < input.size(); ++i) {
    const double x = input.get(i);
    input.set(i, x + kStep);
    const double up = loss(pb);
    input.set(i, x - kStep);
    const double down = loss(pb);
    input.set(i, x);
    const double numeric = (up - down) / (2 * kStep);
    worst = std::max(worst, std::fabs(numeric - grad.get(i)) / (1 + std::fabs(grad.get(i))));
  }
  return worst;
}

const Scenario kFiniteDifferenceCases[] = {
    {"dense", {1, 2, 2, 5, 7, 3, 4}, false, 1, false, 0},
    {"causal", {1, 2, 2, 6, 6, 4, 4}, true, 1, false, 0},
    {"causal_sq_gt_sk", {1, 1, 1, 7, 4, 3, 3}, true, 1, false, 0},
    {"kv_stride2_causal", {1, 1, 1, 6, 7, 3, 2}, true, 2, false, 0},
    {"gqa_seq_major", {2, 4, 2, 4, 5, 3, 5}, false, 1, true, 0},
    {"mqa_kv_stride3_scale", {1, 3, 1, 4, 8, 2, 3}, false, 3, false, 0.7},
};

class ReferenceBackward : public ::testing::TestWithParam<Scenario> {};

TEST_P(ReferenceBackward, MatchesFiniteDifferences) {
  const Scenario& c = GetParam();
  BackwardProblem pb(c.shape, DType::kFloat64, c.causal, c.kv_stride, c.seq_major, 7, c.scale);
  reference_attention_backward(pb.params);
  // Central differences with step 1e-5 on O(1) data: truncation ~1e-10, roundoff ~1e-11.
  EXPECT_LT(worst_gradient_error(pb, pb.fwd.q, pb.dq), 1e-7);
  EXPECT_LT(worst_gradient_error(pb, pb.fwd.k, pb.dk), 1e-7);
  EXPECT_LT(worst_gradient_error(pb, pb.fwd.v, pb.dv), 1e-7);
}

INSTANTIATE_TEST_SUITE_P(Fp64, ReferenceBackward, ::testing::ValuesIn(kFiniteDifferenceCases),
                         [](const auto& info) { return std::string(info.param.name); });

// Since each row of P sums to 1, sum_j dS_ij = 0: dk summed over a key head's rows is zero, and
// dv summed over its rows is dout summed over the group's query rows that see a key.
TEST(ReferenceBackwardIdentities, ColumnSums) {
  const Shape s{2, 4, 2, 13, 17, 5, 6};
  BackwardProblem pb(s, DType::kFloat64, /*causal=*/true, /*kv_stride=*/2, false, 11);
  reference_attention_backward(pb.params);
  const int64_t group = s.heads_q / s.heads_kv;
  for (int64_t b = 0; b < s.batch; ++b) {
    for (int64_t hk = 0; hk < s.heads_kv; ++hk) {
      for (int64_t c = 0; c < s.head_dim; ++c) {
        double sum = 0;
        for (int64_t j = 0; j < s.seqlen_k; ++j) {
          sum += pb.dk.get(((b * s.heads_kv + hk) * s.seqlen_k + j) * s.head_dim + c);
        }
        EXPECT_NEAR(sum, 0.0, 1e-12) << "dk column " << c;
      }
      for (int64_t c = 0; c < s.head_dim_v; ++c) {
        double sum = 0, expected = 0;
        for (int64_t j = 0; j < s.seqlen_k; ++j) {
          sum += pb.dv.get(((b * s.heads_kv + hk) * s.seqlen_k + j) * s.head_dim_v + c);
        }
        for (int64_t h = hk * group; h < (hk + 1) * group; ++h) {
          for (int64_t i = 0; i < s.seqlen_q; ++i) {
            expected += pb.dout.get(((b * s.heads_q + h) * s.seqlen_q + i) * s.head_dim_v + c);
          }
        }
        EXPECT_NEAR(sum, expected, 1e-12) << "dv column " << c;
      }
    }
  }
}

TEST(ReferenceBackwardIdentities, SkippedKeysAndEmptyProblemsGetZeros) {
  const Shape s{1, 2, 1, 5, 10, 4, 4};
  BackwardProblem strided(s, DType::kFloat32, false, /*kv_stride=*/3);
  reference_attention_backward(strided.params);
  for (int64_t j = 0; j < s.seqlen_k; ++j) {
    for (int64_t c = 0; c < s.head_dim; ++c) {
      const bool skipped = j % 3 != 0;
      EXPECT_EQ(strided.dk.get(j * s.head_dim + c) == 0.0, skipped) << "row " << j;
    }
  }
  BackwardProblem no_keys({1, 2, 1, 5, 0, 4, 4}, DType::kFloat32);
  reference_attention_backward(no_keys.params);
  for (int64_t i = 0; i < no_keys.dq.size(); ++i) EXPECT_EQ(no_keys.dq.get(i), 0.0);
  BackwardProblem no_queries({1, 2, 1, 0, 6, 4, 4}, DType::kFloat32);
  reference_attention_backward(no_queries.params);
  for (int64_t i = 0; i < no_queries.dk.size(); ++i) EXPECT_EQ(no_queries.dk.get(i), 0.0);
  for (int64_t i = 0; i < no_queries.dv.size(); ++i) EXPECT_EQ(no_queries.dv.get(i), 0.0);
}

// ---------------------------------------------------------------------------------------------
// Validation: every missing field is named before anything runs.

struct InvalidCase {
  const char* name;
  std::function<void(AttentionBackwardParams&)> corrupt;
  const char* expected_words;
};

void PrintTo(const InvalidCase& c, std::ostream* os) { *os << c.name; }

class BackwardValidation : public ::testing::TestWithParam<InvalidCase> {};

TEST_P(BackwardValidation, RejectsWithNamedField) {
  BackwardProblem pb({1, 4, 2, 3, 5, 8, 8}, DType::kFloat32);
  alignas(256) static unsigned char workspace[1024];
  pb.params.workspace = workspace;
  ASSERT_GT(attention_backward_workspace_bytes(pb.params), 0u);
  ASSERT_TRUE(can_implement_backward(pb.params).ok())
      << can_implement_backward(pb.params).message();
  GetParam().corrupt(pb.params);
  const Status status = can_implement_backward(pb.params);
  ASSERT_FALSE(status.ok());
  EXPECT_NE(status.message().find(GetParam().expected_words), std::string::npos)
      << status.message();
  try {
    attention_backward(pb.params, nullptr);  // throws before touching the (host) pointers
    FAIL() << "attention_backward accepted invalid params";
  } catch (const Error& error) {
    EXPECT_EQ(std::string(error.what()), status.message());
  }
}

const InvalidCase kInvalidCases[] = {
    {"dout", [](AttentionBackwardParams& p) { p.dout = nullptr; }, "dout must not be null"},
    {"dq", [](AttentionBackwardParams& p) { p.dq = nullptr; }, "dq must not be null"},
    {"dk", [](AttentionBackwardParams& p) { p.dk = nullptr; }, "dk must not be null"},
    {"dv", [](AttentionBackwardParams& p) { p.dv = nullptr; }, "dv must not be null"},
    {"out", [](AttentionBackwardParams& p) { p.forward.out = nullptr; }, "out must not be null"},
    {"lse", [](AttentionBackwardParams& p) { p.forward.lse = nullptr; }, "lse must not be null"},
    {"workspace", [](AttentionBackwardParams& p) { p.workspace = nullptr; },
     "workspace must not be null"},
    {"workspace_alignment",
     [](AttentionBackwardParams& p) { p.workspace = static_cast<char*>(p.workspace) + 4; },
     "workspace must be aligned to 256 bytes"},
    {"forward_field", [](AttentionBackwardParams& p) { p.forward.kv_stride = 0; },
     "kv_stride must be >= 1"},
};

INSTANTIATE_TEST_SUITE_P(Fields, BackwardValidation, ::testing::ValuesIn(kInvalidCases),
                         [](const auto& info) { return std::string(info.param.name); });

TEST(BackwardValidationReference, NamesTheField) {
  BackwardProblem pb({1, 2, 2, 3, 5, 8, 8}, DType::kFloat64);
  pb.params.dout = nullptr;
  try {
    reference_attention_backward(pb.params);
    FAIL() << "the reference accepted a null dout";
  } catch (const Error& error) {
    EXPECT_NE(std::string(error.what()).find("dout must not be null"), std::string::npos);
  }
}

TEST(BackwardValidationBackend, EveryBackendValueIsAccepted) {
  BackwardProblem pb({1, 2, 2, 3, 5, 8, 8}, DType::kFloat32);
  alignas(256) static unsigned char workspace[256];
  pb.params.workspace = workspace;
  for (Backend backend : {Backend::kAuto, Backend::kSimt, Backend::kTensorCore, Backend::kHopper}) {
    pb.params.forward.backend = backend;
    EXPECT_TRUE(can_implement_backward(pb.params).ok()) << backend_name(backend);
  }
}

TEST(BackwardWorkspace, BytesFollowTheShapes) {
  BackwardProblem pb({2, 3, 1, 5, 7, 8, 8}, DType::kFloat32);
  EXPECT_EQ(attention_backward_workspace_bytes(pb.params), 256u);  // 30 floats, rounded up
  pb.params.forward.dtype = DType::kFloat64;
  pb.params.forward.seqlen_q = 100;
  EXPECT_EQ(attention_backward_workspace_bytes(pb.params), 4864u);  // 600 doubles -> 19 * 256
  pb.params.forward.seqlen_q = 0;
  EXPECT_EQ(attention_backward_workspace_bytes(pb.params), 0u);
}

// ---------------------------------------------------------------------------------------------
// The SIMT backward against the reference (GPU only).

const Scenario kScenarios[] = {
    {"dense", {2, 3, 3, 77, 129, 64, 64}},
    {"causal", {2, 2, 2, 129, 129, 64, 64}, true},
    {"causal_sq_gt_sk", {1, 2, 2, 100, 37, 32, 32}, true},
    {"causal_sq_lt_sk", {1, 2, 2, 37, 100, 32, 32}, true},
    {"kv_stride3", {2, 2, 2, 65, 130, 64, 64}, false, 3},
    {"kv_stride4_causal", {1, 2, 2, 200, 200, 32, 32}, true, 4},
    {"kv_stride_larger_than_keys", {1, 1, 1, 20, 30, 16, 16}, true, 50},
    {"gqa_4to1", {2, 8, 2, 33, 70, 64, 64}},
    {"mqa_causal", {1, 6, 1, 40, 41, 32, 32}, true},
    {"seq_major_layout", {2, 4, 2, 50, 61, 40, 40}, false, 1, true},
    {"head_dims_40_72", {1, 2, 2, 31, 45, 40, 72}},
    {"head_dims_100_20", {1, 2, 1, 31, 45, 100, 20}, true},
    {"head_dim_128", {1, 2, 2, 130, 70, 128, 128}, true},
    {"head_dim_256", {1, 2, 1, 70, 90, 256, 256}, true},
    {"head_dim_8", {1, 3, 3, 9, 10, 8, 8}},
    {"head_dim_1", {1, 1, 1, 5, 6, 1, 1}},
    {"single_query", {3, 2, 2, 1, 300, 96, 96}},
    {"single_key", {1, 2, 2, 20, 1, 16, 16}},
    {"long", {1, 1, 1, 300, 1000, 64, 64}, true, 1, false, 0.3},
    {"negative_scale", {1, 2, 2, 30, 40, 32, 32}, true, 1, false, -0.2},
    {"no_keys", {1, 2, 2, 10, 0, 16, 16}},
    {"no_queries", {1, 2, 1, 0, 10, 16, 16}},
};

std::vector<Case> all_gpu_cases() {
  return cases_in({DType::kFloat64, DType::kFloat32, DType::kFloat16, DType::kBFloat16},
                  kScenarios);
}

// Device copies of a problem's inputs, poisoned gradients and a poisoned workspace.
struct DeviceBackward {
  DeviceBuffer q, k, v, out, lse, dout, dq, dk, dv, workspace;
  AttentionBackwardParams params;

  explicit DeviceBackward(BackwardProblem& pb)
      : q(pb.fwd.q),
        k(pb.fwd.k),
        v(pb.fwd.v),
        out(pb.fwd.out),
        lse(pb.lse_bytes()),
        dout(pb.dout),
        dq(pb.dq),
        dk(pb.dk),
        dv(pb.dv),
        workspace(attention_backward_workspace_bytes(pb.params)) {
    if (pb.lse_bytes() > 0) {
      EXPECT_EQ(cudaMemcpy(lse.get(), pb.lse_host(), pb.lse_bytes(), cudaMemcpyHostToDevice),
                cudaSuccess);
    }
    const size_t workspace_bytes = attention_backward_workspace_bytes(pb.params);
    if (workspace_bytes > 0) {
      EXPECT_EQ(cudaMemset(workspace.get(), 0xff, workspace_bytes), cudaSuccess);
    }
    params = pb.params;
    params.forward.q = q.get();
    params.forward.k = k.get();
    params.forward.v = v.get();
    params.forward.out = out.get();
    params.forward.lse = lse.get();
    params.dout = dout.get();
    params.dq = dq.get();
    params.dk = dk.get();
    params.dv = dv.get();
    params.workspace = workspace.get();
  }
};

// Which bound applies: the dtype rule (kernels that round only their outputs) or the rule of
// backward_rounding_model.h (the tensor-core backward, which also rounds P and dS).
enum class Rule { kDtype, kRoundsPAndDs };

void expect_matches_reference(BackwardProblem& pb, const Scenario& sc, Rule rule = Rule::kDtype);

class BackwardGpu : public ::testing::TestWithParam<Case> {};

TEST_P(BackwardGpu, MatchesReference) {
  SKIP_WITHOUT_GPU();
  const Scenario& sc = GetParam().scenario;
  const DType dtype = GetParam().dtype;
  BackwardProblem pb(sc.shape, dtype, sc.causal, sc.kv_stride, sc.seq_major, sc.seed(), sc.scale);
  pb.params.forward.backend = Backend::kSimt;  // fp16/bf16 would otherwise take tensor cores
  expect_matches_reference(pb, sc);
}

// Runs attention_backward on device copies of `pb` (poisoned gradients and workspace) and
// checks every element of dq, dk and dv against the fp64 reference.
void expect_matches_reference(BackwardProblem& pb, const Scenario& sc, Rule rule) {
  const DType dtype = pb.fwd.dtype;
  DeviceBackward dev(pb);  // gradients still hold the poison pattern
  std::optional<RoundedBackward> rounded;
  if (rule == Rule::kRoundsPAndDs) {
    rounded = rounded_backward(pb.params, pb.dq.size(), pb.dk.size(), pb.dv.size());
  }
  reference_attention_backward(pb.params);

  attention_backward(dev.params, nullptr);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  HostTensor dq(dtype, pb.dq.size()), dk(dtype, pb.dk.size()), dv(dtype, pb.dv.size());
  dev.dq.download(dq.data());
  dev.dk.download(dk.data());
  dev.dv.download(dv.data());
  // The kernels accumulate in fp32 (fp64); out and lse are inputs of both sides, so the
  // forward's own rule applies (test_support.h's tolerance_for), with the size of the terms
  // each gradient sums as the atol scale: dV sums P * dO, dQ and dK scale * P * (dO.V - D) * K
  // (or Q). Their size, not the gradient's own (zero when a row sees one key), sets it.
  const double scale =
      std::fabs(pb.params.forward.softmax_scale ? *pb.params.forward.softmax_scale
                                                : default_softmax_scale(sc.shape.head_dim));
  const double dp = max_abs(pb.dout) * max_abs(pb.fwd.v);
  const double dq_floor = scale * dp * max_abs(pb.fwd.k);
  const double dk_floor = scale * dp * max_abs(pb.fwd.q);
  const double dv_floor = max_abs(pb.dout);
  if (rule == Rule::kDtype) {
    EXPECT_TRUE(all_close(dq, pb.dq, dtype, dq_floor)) << "dq";
    EXPECT_TRUE(all_close(dk, pb.dk, dtype, dk_floor)) << "dk";
    EXPECT_TRUE(all_close(dv, pb.dv, dtype, dv_floor)) << "dv";
    return;
  }
  // The tensor-core backward rounds P and dS to the dtype as mma operands (as FlashAttention
  // does): an element's error is up to u times the magnitude of the terms it sums, far above
  // the dtype rule where the terms cancel (see backward_rounding_model.h).
  EXPECT_TRUE(within_backward_rule(dq, pb.dq, rounded->dq, rounded->dq_terms, dtype, dq_floor))
      << "dq";
  EXPECT_TRUE(within_backward_rule(dk, pb.dk, rounded->dk, rounded->dk_terms, dtype, dk_floor))
      << "dk";
  EXPECT_TRUE(within_backward_rule(dv, pb.dv, rounded->dv, rounded->dv_terms, dtype, dv_floor))
      << "dv";
}

INSTANTIATE_TEST_SUITE_P(AllDtypes, BackwardGpu, ::testing::ValuesIn(all_gpu_cases()), case_name);

// Runs the backward of `pb` twice on the same device buffers; expects bit-identical dq, dk, dv.
void expect_bit_identical_reruns(BackwardProblem& pb) {
  DeviceBackward dev(pb);
  std::vector<std::vector<unsigned char>> runs;
  for (int run = 0; run < 2; ++run) {
    attention_backward(dev.params, nullptr);
    for (const HostTensor* like : {&pb.dq, &pb.dk, &pb.dv}) {
      const DeviceBuffer& buffer = like == &pb.dq ? dev.dq : like == &pb.dk ? dev.dk : dev.dv;
      runs.emplace_back(like->bytes.size());
      buffer.download(runs.back().data());
    }
  }
  EXPECT_EQ(runs[0], runs[3]) << dtype_name(pb.fwd.dtype) << " dq";
  EXPECT_EQ(runs[1], runs[4]) << dtype_name(pb.fwd.dtype) << " dk";
  EXPECT_EQ(runs[2], runs[5]) << dtype_name(pb.fwd.dtype) << " dv";
}

// deterministic = true: bit-identical on every path (SIMT for float32, the tensor-core
// deterministic dQ kernel for bfloat16 on sm80+).
TEST(BackwardGpuRuns, RerunsAreBitIdentical) {
  SKIP_WITHOUT_GPU();
  for (DType dtype : {DType::kFloat32, DType::kBFloat16}) {
    BackwardProblem pb({2, 8, 2, 300, 300, 64, 64}, dtype, /*causal=*/true, /*kv_stride=*/2);
    pb.params.deterministic = true;
    expect_bit_identical_reruns(pb);
  }
}

// ---------------------------------------------------------------------------------------------
// The tensor-core backward (fp16/bf16, sm80+) against the reference, with atomic and
// deterministic dQ. Head dims 32, 64, 96, 128, 192 and 256 (q and v equal; the last two with
// BackwardConfig::kColumnSplit's 8 warps), every forward option.

const Scenario kTensorCoreScenarios[] = {
    {"dense", {2, 3, 3, 77, 129, 64, 64}},
    {"causal", {2, 2, 2, 129, 129, 64, 64}, true},
    {"causal_sq_gt_sk", {1, 2, 2, 100, 37, 32, 32}, true},
    {"causal_sq_lt_sk_128", {1, 2, 2, 37, 100, 128, 128}, true},
    {"kv_stride3", {2, 2, 2, 65, 130, 64, 64}, false, 3},
    {"kv_stride4_causal_128", {1, 2, 2, 200, 200, 128, 128}, true, 4},
    {"kv_stride_larger_than_keys", {1, 1, 1, 20, 30, 32, 32}, true, 50},
    {"gqa_4to1", {2, 8, 2, 33, 70, 64, 64}},
    {"gqa_4to1_causal_128", {1, 8, 2, 130, 140, 128, 128}, true},
    {"mqa_causal_96", {1, 6, 1, 40, 41, 96, 96}, true},
    {"seq_major_layout", {2, 4, 2, 50, 61, 64, 64}, false, 1, true},
    {"seq_major_causal_128", {1, 4, 4, 77, 77, 128, 128}, true, 1, true},
    {"head_dim_96", {1, 2, 2, 70, 90, 96, 96}, true},
    {"single_query", {3, 2, 2, 1, 300, 128, 128}},
    {"single_key", {1, 2, 2, 20, 1, 64, 64}},
    {"long_causal", {1, 1, 1, 1000, 1000, 64, 64}, true, 1, false, 0.3},
    {"long_keys_128", {1, 2, 2, 77, 1000, 128, 128}},
    {"negative_scale", {1, 2, 2, 30, 40, 64, 64}, true, 1, false, -0.2},
    {"no_keys", {1, 2, 2, 10, 0, 64, 64}},
    {"no_queries", {1, 2, 1, 0, 10, 64, 64}},
    {"causal_gqa_2to1_256", {1, 4, 2, 130, 150, 256, 256}, true},
    {"dense_192", {2, 2, 2, 77, 129, 192, 192}},
    {"kv_stride2_causal_256", {1, 2, 2, 100, 200, 256, 256}, true, 2},
    {"seq_major_causal_192", {1, 4, 2, 77, 77, 192, 192}, true, 1, true},
    {"single_key_256", {1, 2, 2, 20, 1, 256, 256}},
};

struct TensorCoreCase {
  Scenario scenario;
  DType dtype;
  bool deterministic;
};

std::vector<TensorCoreCase> all_tensor_core_cases() {
  std::vector<TensorCoreCase> cases;
  for (DType dtype : {DType::kFloat16, DType::kBFloat16}) {
    for (bool deterministic : {false, true}) {
      for (const Scenario& s : kTensorCoreScenarios) cases.push_back({s, dtype, deterministic});
    }
  }
  return cases;
}

void PrintTo(const TensorCoreCase& c, std::ostream* os) {
  *os << dtype_name(c.dtype) << (c.deterministic ? "/deterministic/" : "/atomic/")
      << c.scenario.name;
}

bool has_tensor_cores() {
  int device = 0, major = 0;
  return cudaGetDevice(&device) == cudaSuccess &&
         cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device) == cudaSuccess &&
         major >= 8;
}

#define SKIP_WITHOUT_TENSOR_CORES()                                 \
  do {                                                              \
    SKIP_WITHOUT_GPU();                                             \
    if (!has_tensor_cores()) GTEST_SKIP() << "needs sm80 or newer"; \
  } while (0)

class BackwardTensorCore : public ::testing::TestWithParam<TensorCoreCase> {};

TEST_P(BackwardTensorCore, MatchesReference) {
  SKIP_WITHOUT_TENSOR_CORES();
  const Scenario& sc = GetParam().scenario;
  BackwardProblem pb(sc.shape, GetParam().dtype, sc.causal, sc.kv_stride, sc.seq_major, sc.seed(),
                     sc.scale);
  pb.params.forward.backend = Backend::kTensorCore;  // throws if the call fell back to SIMT
  pb.params.deterministic = GetParam().deterministic;
  expect_matches_reference(pb, sc, Rule::kRoundsPAndDs);
}

INSTANTIATE_TEST_SUITE_P(Fp16Bf16, BackwardTensorCore, ::testing::ValuesIn(all_tensor_core_cases()),
                         [](const auto& info) {
                           return std::string(dtype_name(info.param.dtype)) +
                                  (info.param.deterministic ? "_deterministic_" : "_atomic_") +
                                  info.param.scenario.name;
                         });

// The tensor-core rule (backward_rounding_model.h) on the host: the same-dtype reference, whose
// error is exactly what rounding P and dS costs, is within it; a result with two keys' rows
// swapped (a fragment-map bug) is not.
TEST(BackwardTensorCoreRule, SameDtypeReferencePassesAndSwappedKeysFail) {
  for (DType dtype : {DType::kFloat16, DType::kBFloat16}) {
    const Shape s{1, 2, 1, 70, 70, 64, 64};
    BackwardProblem pb(s, dtype, /*causal=*/true, 1, false, 5);
    const RoundedBackward m = rounded_backward(pb.params, pb.dq.size(), pb.dk.size(), pb.dv.size());
    reference_attention_backward(pb.params);
    const double scale = default_softmax_scale(s.head_dim);
    const double dp = max_abs(pb.dout) * max_abs(pb.fwd.v);
    const double dq_floor = scale * dp * max_abs(pb.fwd.k);
    const double dk_floor = scale * dp * max_abs(pb.fwd.q);
    const double dv_floor = max_abs(pb.dout);
    EXPECT_TRUE(within_backward_rule(m.dq, pb.dq, m.dq, m.dq_terms, dtype, dq_floor));
    EXPECT_TRUE(within_backward_rule(m.dk, pb.dk, m.dk, m.dk_terms, dtype, dk_floor));
    EXPECT_TRUE(within_backward_rule(m.dv, pb.dv, m.dv, m.dv_terms, dtype, dv_floor));
    // The rounding is visible: the same-dtype reference differs from the fp64 one.
    double differs = 0;
    for (int64_t i = 0; i < pb.dv.size(); ++i) {
      differs = std::max(differs, std::fabs(m.dv.get(i) - pb.dv.get(i)));
    }
    EXPECT_GT(differs, 0.0);
    for (const bool on_dq : {false, true}) {
      HostTensor swapped = on_dq ? m.dq : m.dv;
      for (int64_t c = 0; c < s.head_dim; ++c) {  // rows 5 and 6 of the first head
        swapped.set(5 * s.head_dim + c, (on_dq ? m.dq : m.dv).get(6 * s.head_dim + c));
        swapped.set(6 * s.head_dim + c, (on_dq ? m.dq : m.dv).get(5 * s.head_dim + c));
      }
      EXPECT_FALSE(on_dq ? within_backward_rule(swapped, pb.dq, m.dq, m.dq_terms, dtype, dq_floor)
                         : within_backward_rule(swapped, pb.dv, m.dv, m.dv_terms, dtype, dv_floor))
          << dtype_name(dtype) << (on_dq ? " dq" : " dv");
    }
  }
}

// The fp32 dQ accumulator is in the workspace only when the atomic tensor-core path may run.
TEST(BackwardTensorCoreWorkspace, HoldsTheDqAccumulator) {
  BackwardProblem pb({2, 3, 1, 5, 7, 64, 64}, DType::kBFloat16);
  const size_t delta = 256;                // 30 floats, rounded up
  const size_t accumulator = 30 * 64 * 4;  // 7680 = 30 * 256
  // kAuto may take the Hopper backward, whose accumulator pads the rows (at least as large).
  EXPECT_GE(attention_backward_workspace_bytes(pb.params), delta + accumulator);
  pb.params.forward.backend = Backend::kTensorCore;
  EXPECT_EQ(attention_backward_workspace_bytes(pb.params), delta + accumulator);
  pb.params.deterministic = true;
  EXPECT_EQ(attention_backward_workspace_bytes(pb.params), delta);
  pb.params.deterministic = false;
  pb.params.forward.backend = Backend::kSimt;
  EXPECT_EQ(attention_backward_workspace_bytes(pb.params), delta);
}

TEST(BackwardTensorCoreRuns, DeterministicRerunsAreBitIdentical) {
  SKIP_WITHOUT_TENSOR_CORES();
  for (DType dtype : {DType::kFloat16, DType::kBFloat16}) {
    for (int64_t head_dim : {64, 128, 256}) {
      BackwardProblem pb({2, 8, 2, 300, 333, head_dim, head_dim}, dtype, /*causal=*/true);
      pb.params.forward.backend = Backend::kTensorCore;
      pb.params.deterministic = true;
      expect_bit_identical_reruns(pb);
    }
  }
}

// kAuto picks tensor cores where they apply and SIMT elsewhere (head dim 40), correctly;
// kTensorCore on a call it cannot run is an error that says why, raised before any launch.
TEST(BackwardTensorCoreRuns, AutoFallsBackAndForcedTensorCoreNamesTheReason) {
  SKIP_WITHOUT_TENSOR_CORES();
  for (const Scenario& sc : {Scenario{"auto_40", {1, 2, 2, 31, 45, 40, 40}, true},
                             Scenario{"auto_256", {1, 2, 1, 70, 90, 256, 256}, true},
                             Scenario{"auto_64", {1, 4, 2, 70, 90, 64, 64}, true}}) {
    BackwardProblem pb(sc.shape, DType::kBFloat16, sc.causal, sc.kv_stride, sc.seq_major, sc.seed(),
                       sc.scale);
    SCOPED_TRACE(sc.name);
    // kAuto takes the tensor-core backward where it has an instantiation (head dim 64 here).
    const bool tensor_core = tensor_core::is_backward_head_dim(sc.shape.head_dim);
    expect_matches_reference(pb, sc, tensor_core ? Rule::kRoundsPAndDs : Rule::kDtype);
  }
  BackwardProblem pb({1, 2, 2, 31, 45, 40, 40}, DType::kBFloat16);
  pb.params.forward.backend = Backend::kTensorCore;
  DeviceBackward dev(pb);
  try {
    attention_backward(dev.params, nullptr);
    FAIL() << "the tensor-core backward accepted head_dim 40";
  } catch (const Error& error) {
    EXPECT_NE(std::string(error.what()).find("head_dim 40"), std::string::npos) << error.what();
  }
}

// ---------------------------------------------------------------------------------------------
// The Hopper backward (sm_90a wgmma + TMA, fp16/bf16, head dims 64, 96, 128, 192 and 256, the
// last two with the consumer warpgroups splitting the columns) against the reference with the
// tensor-core rule (it rounds P and dS exactly where the sm80 kernels do), with atomic and
// deterministic dQ; against the sm80 backward; and its dispatch.

const Scenario kHopperScenarios[] = {
    {"dense", {2, 3, 3, 77, 129, 64, 64}},
    {"causal_128", {2, 2, 2, 129, 129, 128, 128}, true},
    {"causal_sq_gt_sk", {1, 2, 2, 100, 37, 64, 64}, true},
    {"causal_sq_lt_sk_128", {1, 2, 2, 37, 100, 128, 128}, true},
    {"kv_stride2_causal", {1, 2, 2, 150, 150, 64, 64}, true, 2},
    {"kv_stride3", {2, 2, 2, 65, 130, 64, 64}, false, 3},
    {"kv_stride4_causal_128", {1, 2, 2, 200, 200, 128, 128}, true, 4},
    {"kv_stride_larger_than_keys", {1, 1, 1, 20, 30, 64, 64}, true, 50},
    {"gqa_4to1", {2, 8, 2, 33, 70, 64, 64}},
    {"gqa_4to1_causal_128", {1, 8, 2, 130, 140, 128, 128}, true},
    {"gqa_8to1_kv_stride3_128", {1, 8, 1, 77, 300, 128, 128}, false, 3},
    {"mqa_causal", {1, 6, 1, 40, 41, 64, 64}, true},
    {"seq_major_layout", {2, 4, 2, 50, 61, 64, 64}, false, 1, true},
    {"seq_major_kv_stride4_causal_128", {1, 4, 4, 200, 200, 128, 128}, true, 4, true},
    {"seqlen_1", {2, 2, 2, 1, 1, 64, 64}, true},
    {"single_query_128", {3, 2, 2, 1, 300, 128, 128}},
    {"single_key", {1, 2, 2, 20, 1, 64, 64}},
    {"sq1000_sk129", {1, 2, 2, 1000, 129, 64, 64}},
    {"sq129_sk1000_causal_128", {1, 2, 2, 129, 1000, 128, 128}, true},
    {"long_causal", {1, 1, 1, 1000, 1000, 64, 64}, true, 1, false, 0.3},
    {"negative_scale_128", {1, 2, 2, 30, 40, 128, 128}, true, 1, false, -0.2},
    {"no_keys", {1, 2, 2, 10, 0, 64, 64}},
    {"no_queries", {1, 2, 1, 0, 10, 128, 128}},
    {"dense_256", {2, 3, 3, 77, 129, 256, 256}},
    {"causal_gqa_2to1_256", {1, 4, 2, 130, 140, 256, 256}, true},
    {"kv_stride3_causal_256", {1, 2, 2, 200, 200, 256, 256}, true, 3},
    {"seq_major_causal_sq_gt_sk_256", {1, 2, 2, 100, 61, 256, 256}, true, 1, true},
    {"sq129_sk300_causal_256", {1, 2, 2, 129, 300, 256, 256}, true},
    {"single_key_256", {1, 2, 2, 20, 1, 256, 256}},
    {"no_keys_256", {1, 2, 2, 10, 0, 256, 256}},
    {"dense_192", {2, 3, 3, 77, 129, 192, 192}},
    {"kv_stride2_gqa_causal_192", {1, 4, 2, 150, 150, 192, 192}, true, 2},
    {"seq_major_192", {2, 2, 2, 50, 61, 192, 192}, false, 1, true},
    {"single_query_192", {2, 2, 2, 1, 100, 192, 192}},
    {"dense_96", {2, 3, 3, 77, 129, 96, 96}},
    {"causal_gqa_4to1_96", {1, 8, 2, 130, 140, 96, 96}, true},
    {"kv_stride3_causal_96", {1, 2, 2, 200, 200, 96, 96}, true, 3},
    {"seq_major_causal_sq_gt_sk_96", {1, 2, 2, 100, 61, 96, 96}, true, 1, true},
    {"single_query_96", {2, 2, 2, 1, 100, 96, 96}},
    {"no_keys_96", {1, 2, 2, 10, 0, 96, 96}},
};

std::vector<TensorCoreCase> all_hopper_cases() {
  std::vector<TensorCoreCase> cases;
  for (DType dtype : {DType::kFloat16, DType::kBFloat16}) {
    for (bool deterministic : {false, true}) {
      for (const Scenario& s : kHopperScenarios) cases.push_back({s, dtype, deterministic});
    }
  }
  return cases;
}

// Why the Hopper backward cannot run here, or "" when it can: it needs a compute capability 9.0
// GPU and a library built with the sm_90a kernels. On such a GPU any other refusal of a plain
// bf16 call is a bug, and the tests fail instead of skipping.
std::string hopper_backward_skip_reason() {
  const std::string no_sm90 = sm90_skip_reason();
  if (!no_sm90.empty()) return no_sm90;
  BackwardProblem pb({1, 2, 1, 8, 8, 64, 64}, DType::kBFloat16);
  pb.params.forward.backend = Backend::kHopper;
  DeviceBackward dev(pb);
  try {
    select_backward_backend(dev.params);
  } catch (const Error& error) {
    const std::string why = error.what();
    if (why.find("this build") != std::string::npos) return why;
    ADD_FAILURE() << "the Hopper backward refused a plain bf16 call on sm90: " << why;
    return why;
  }
  return "";
}

#define SKIP_WITHOUT_HOPPER_BACKWARD()                        \
  do {                                                        \
    const std::string reason = hopper_backward_skip_reason(); \
    if (!reason.empty()) GTEST_SKIP() << reason;              \
  } while (0)

class BackwardHopper : public ::testing::TestWithParam<TensorCoreCase> {};

TEST_P(BackwardHopper, MatchesReference) {
  SKIP_WITHOUT_HOPPER_BACKWARD();
  const Scenario& sc = GetParam().scenario;
  BackwardProblem pb(sc.shape, GetParam().dtype, sc.causal, sc.kv_stride, sc.seq_major, sc.seed(),
                     sc.scale);
  pb.params.forward.backend = Backend::kHopper;  // throws if the call cannot take this path
  pb.params.deterministic = GetParam().deterministic;
  expect_matches_reference(pb, sc, Rule::kRoundsPAndDs);
}

INSTANTIATE_TEST_SUITE_P(Fp16Bf16, BackwardHopper, ::testing::ValuesIn(all_hopper_cases()),
                         [](const auto& info) {
                           return std::string(dtype_name(info.param.dtype)) +
                                  (info.param.deterministic ? "_deterministic_" : "_atomic_") +
                                  info.param.scenario.name;
                         });

// Runs the backward of `pb` on device copies with `backend`; returns dq, dk, dv.
std::vector<HostTensor> run_backward_on_device(BackwardProblem& pb, Backend backend) {
  pb.params.forward.backend = backend;
  DeviceBackward dev(pb);
  attention_backward(dev.params, nullptr);
  EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  std::vector<HostTensor> grads{HostTensor(pb.fwd.dtype, pb.dq.size()),
                                HostTensor(pb.fwd.dtype, pb.dk.size()),
                                HostTensor(pb.fwd.dtype, pb.dv.size())};
  dev.dq.download(grads[0].data());
  dev.dk.download(grads[1].data());
  dev.dv.download(grads[2].data());
  return grads;
}

// Both paths within the rule of the reference, and within twice its FA3 bound of each other.
TEST(BackwardHopperRuns, AgreesWithTheSm80Backward) {
  SKIP_WITHOUT_HOPPER_BACKWARD();
  const Scenario list[] = {
      {"cross_dense_128", {2, 4, 2, 300, 500, 128, 128}},
      {"cross_causal_64", {1, 4, 4, 513, 513, 64, 64}, true},
      {"cross_strided_gqa_128", {1, 8, 2, 200, 333, 128, 128}, true, 2},
      {"cross_causal_gqa_256", {1, 4, 2, 200, 333, 256, 256}, true},
      {"cross_dense_192", {1, 4, 4, 300, 257, 192, 192}},
      {"cross_causal_gqa_96", {1, 4, 2, 333, 300, 96, 96}, true},
  };
  for (const Scenario& sc : list) {
    for (DType dtype : {DType::kFloat16, DType::kBFloat16}) {
      SCOPED_TRACE(sc.name + "/" + dtype_name(dtype));
      BackwardProblem pb(sc.shape, dtype, sc.causal, sc.kv_stride, sc.seq_major, sc.seed(),
                         sc.scale);
      const RoundedBackward m =
          rounded_backward(pb.params, pb.dq.size(), pb.dk.size(), pb.dv.size());
      const std::vector<HostTensor> hopper = run_backward_on_device(pb, Backend::kHopper);
      const std::vector<HostTensor> sm80 = run_backward_on_device(pb, Backend::kTensorCore);
      reference_attention_backward(pb.params);
      const HostTensor* refs[] = {&pb.dq, &pb.dk, &pb.dv};
      const HostTensor* models[] = {&m.dq, &m.dk, &m.dv};
      const std::vector<double>* terms[] = {&m.dq_terms, &m.dk_terms, &m.dv_terms};
      const char* names[] = {"dq", "dk", "dv"};
      // The atol scales of expect_matches_reference: the size of the terms each gradient sums.
      const double scale = default_softmax_scale(sc.shape.head_dim);
      const double dp = max_abs(pb.dout) * max_abs(pb.fwd.v);
      const double floors[] = {scale * dp * max_abs(pb.fwd.k), scale * dp * max_abs(pb.fwd.q),
                               max_abs(pb.dout)};
      const double u = unit_roundoff_16(dtype);
      for (int g = 0; g < 3; ++g) {
        double model_err = 0, max_terms = 0, diff = 0;
        for (int64_t i = 0; i < refs[g]->size(); ++i) {
          model_err = std::max(model_err, std::fabs(models[g]->get(i) - refs[g]->get(i)));
          max_terms = std::max(max_terms, (*terms[g])[i]);
          diff = std::max(diff, std::fabs(hopper[g].get(i) - sm80[g].get(i)));
        }
        EXPECT_TRUE(
            within_backward_rule(hopper[g], *refs[g], *models[g], *terms[g], dtype, floors[g]))
            << "hopper " << names[g];
        EXPECT_TRUE(
            within_backward_rule(sm80[g], *refs[g], *models[g], *terms[g], dtype, floors[g]))
            << "sm80 " << names[g];
        EXPECT_LE(diff, 2 * (2 * model_err + u * max_terms)) << names[g];
      }
    }
  }
}

TEST(BackwardHopperRuns, DeterministicRerunsAreBitIdentical) {
  SKIP_WITHOUT_HOPPER_BACKWARD();
  for (DType dtype : {DType::kFloat16, DType::kBFloat16}) {
    for (int64_t head_dim : {64, 96, 128, 192, 256}) {
      BackwardProblem pb({2, 8, 2, 300, 333, head_dim, head_dim}, dtype, /*causal=*/true);
      pb.params.forward.backend = Backend::kHopper;
      pb.params.deterministic = true;
      expect_bit_identical_reruns(pb);
    }
  }
}

// Sets SAMATTN_HOPPER_BWD_VARIANT for one scope (the dispatcher reads it on every call).
struct ScopedHopperBackwardVariant : ScopedEnvironmentVariable {
  explicit ScopedHopperBackwardVariant(const char* value)
      : ScopedEnvironmentVariable("SAMATTN_HOPPER_BWD_VARIANT", value) {}
};

// Expects the Hopper backward of a small `dtype` / `head_dim` call to throw an error that names
// SAMATTN_HOPPER_BWD_VARIANT (set by the caller).
void expect_variant_error(DType dtype, int64_t head_dim) {
  BackwardProblem pb({1, 2, 2, 31, 45, head_dim, head_dim}, dtype);
  pb.params.forward.backend = Backend::kHopper;
  DeviceBackward dev(pb);
  try {
    attention_backward(dev.params, nullptr);
    ADD_FAILURE() << "the variant ran for " << dtype_name(dtype) << " head_dim " << head_dim;
  } catch (const Error& error) {
    EXPECT_NE(std::string(error.what()).find("SAMATTN_HOPPER_BWD_VARIANT"), std::string::npos)
        << error.what();
  }
}

// The benchmark-only variants (SAMATTN_HOPPER_BWD_VARIANT=split_dq / alternate_dq: the two dQ
// schedules of backward_config.h, each forced at both head dims, so each head dim also runs the
// schedule it does not use by default; built for bf16 with -DSAMATTN_HOPPER_TUNING=ON) meet the
// same rule as the default kernel, atomic and deterministic; a variant that is not built for the
// call is an error naming the variable, raised before any kernel writes a gradient.
TEST(BackwardHopperRuns, VariantsMatchReference) {
  SKIP_WITHOUT_HOPPER_BACKWARD();
#ifndef SAMATTN_HOPPER_TUNING
  GTEST_SKIP() << "the backward variants are built with -DSAMATTN_HOPPER_TUNING=ON only";
#endif
  for (const char* variant : {"split_dq", "alternate_dq"}) {
    const ScopedHopperBackwardVariant scoped(variant);
    for (int64_t d : {64, 128}) {
      const Scenario list[] = {
          {"variant_dense", {2, 3, 3, 77, 129, d, d}},
          {"variant_kv_stride2_causal", {1, 2, 2, 150, 150, d, d}, true, 2},
          {"variant_gqa_4to1_causal", {1, 8, 2, 130, 140, d, d}, true},
      };
      for (const Scenario& sc : list) {
        for (bool deterministic : {false, true}) {
          SCOPED_TRACE(std::string(variant) + "/" + sc.name + "/d" + std::to_string(d) +
                       (deterministic ? "/deterministic" : "/atomic"));
          BackwardProblem pb(sc.shape, DType::kBFloat16, sc.causal, sc.kv_stride, sc.seq_major,
                             sc.seed(), sc.scale);
          pb.params.forward.backend = Backend::kHopper;
          pb.params.deterministic = deterministic;
          expect_matches_reference(pb, sc, Rule::kRoundsPAndDs);
        }
      }
    }
    expect_variant_error(DType::kFloat16, 64);
    expect_variant_error(DType::kFloat16, 128);
    expect_variant_error(DType::kBFloat16, 96);   // takes turns only
    expect_variant_error(DType::kBFloat16, 192);  // the column split has one schedule
    expect_variant_error(DType::kBFloat16, 256);
  }
}

// The Hopper backward's dQ accumulator pads each head's rows to whole query blocks
// (backward_config.h's chunk layout): the workspace leaves room for it after D's floats.
TEST(BackwardHopperRuns, WorkspaceHoldsPaddedDqBlocks) {
  SKIP_WITHOUT_HOPPER_BACKWARD();
  for (int64_t d : {64, 96, 128, 192, 256}) {
    BackwardProblem pb({2, 3, 3, 65, 70, d, d}, DType::kBFloat16);
    const size_t delta = (2 * 3 * 65 * sizeof(float) + 255) / 256 * 256;
    const size_t dq = 2 * 3 * hopper::backward_dq_accum_rows(65, d) * d * sizeof(float);
    EXPECT_GE(attention_backward_workspace_bytes(pb.params), delta + dq) << "head_dim " << d;
  }
}

// An unknown SAMATTN_HOPPER_BWD_VARIANT, or a variant this build does not have, is an error
// naming the variable, raised before any kernel writes a gradient.
TEST(BackwardHopperRuns, VariantErrorsNameTheVariable) {
  SKIP_WITHOUT_HOPPER_BACKWARD();
  {
    const ScopedHopperBackwardVariant bogus("fastest");
    expect_variant_error(DType::kBFloat16, 64);
  }
#ifndef SAMATTN_HOPPER_TUNING
  const ScopedHopperBackwardVariant not_built("split_dq");
  expect_variant_error(DType::kBFloat16, 128);
#endif
}

// kAuto picks the Hopper backward for its head dims on sm90 and the sm80 one for head dim 32;
// kHopper on a call it cannot run is an error that names the reason; masks go to SIMT.
TEST(BackwardHopperRuns, AutoPicksHopperAndForcedHopperNamesTheReason) {
  SKIP_WITHOUT_HOPPER_BACKWARD();
  {
    BackwardProblem pb({1, 4, 2, 70, 90, 128, 128}, DType::kBFloat16, /*causal=*/true);
    DeviceBackward dev(pb);
    EXPECT_EQ(select_backward_backend(dev.params), Backend::kHopper);
    dev.params.forward.backend = Backend::kTensorCore;
    EXPECT_EQ(select_backward_backend(dev.params), Backend::kTensorCore);
    dev.params.forward.backend = Backend::kSimt;
    EXPECT_EQ(select_backward_backend(dev.params), Backend::kSimt);
    dev.params.forward.backend = Backend::kAuto;
    const Scenario sc{"auto_128", {1, 4, 2, 70, 90, 128, 128}, true};
    expect_matches_reference(pb, sc, Rule::kRoundsPAndDs);  // kAuto: the Hopper kernels
  }
  BackwardProblem d96({1, 2, 2, 31, 45, 96, 96}, DType::kBFloat16);
  DeviceBackward dev96(d96);
  EXPECT_EQ(select_backward_backend(dev96.params), Backend::kHopper);
  BackwardProblem d32({1, 2, 2, 31, 45, 32, 32}, DType::kBFloat16);
  DeviceBackward dev32_heads(d32);
  EXPECT_EQ(select_backward_backend(dev32_heads.params), Backend::kTensorCore);
  dev32_heads.params.forward.backend = Backend::kHopper;
  try {
    attention_backward(dev32_heads.params, nullptr);
    FAIL() << "the Hopper backward accepted head_dim 32";
  } catch (const Error& error) {
    EXPECT_NE(std::string(error.what()).find("head_dim 32"), std::string::npos) << error.what();
  }
  BackwardProblem f32({1, 2, 2, 31, 45, 64, 64}, DType::kFloat32);
  DeviceBackward dev32(f32);
  dev32.params.forward.backend = Backend::kHopper;
  EXPECT_THROW(select_backward_backend(dev32.params), Error);
  dev32.params.forward.backend = Backend::kAuto;
  EXPECT_EQ(select_backward_backend(dev32.params), Backend::kSimt);
}

// dK and dV leave the Hopper backward through TMA descriptors: a gradient whose strides the TMA
// rule refuses (here a zero row stride, which 16-byte stores would take) sends kAuto to another
// path, and a forced Hopper call names the tensor and the stride, before any launch.
TEST(BackwardHopperRuns, GradientStridesFollowTheTmaRule) {
  SKIP_WITHOUT_HOPPER_BACKWARD();
  for (const char* name : {"dk", "dv"}) {
    BackwardProblem pb({1, 2, 2, 40, 50, 64, 64}, DType::kBFloat16);
    DeviceBackward dev(pb);
    Strides& strides = std::string(name) == "dk" ? dev.params.dk_strides : dev.params.dv_strides;
    strides.seq = 0;
    EXPECT_NE(select_backward_backend(dev.params), Backend::kHopper) << name;
    dev.params.forward.backend = Backend::kHopper;
    try {
      select_backward_backend(dev.params);
      ADD_FAILURE() << "the Hopper backward accepted " << name << " with row stride 0";
    } catch (const Error& error) {
      const std::string why = error.what();
      EXPECT_NE(why.find(std::string(name) + " row stride 0"), std::string::npos) << why;
      EXPECT_NE(why.find("TMA"), std::string::npos) << why;
    }
  }
}

// Without a compute capability 9.0 GPU kAuto never reports the Hopper backward, and forcing it
// throws before any launch.
TEST(BackwardHopperRuns, OtherDevicesNeverPickHopper) {
  SKIP_WITHOUT_GPU();
  if (hopper_backward_skip_reason().empty()) GTEST_SKIP() << "this is a Hopper device";
  BackwardProblem pb({1, 2, 2, 31, 45, 64, 64}, DType::kBFloat16);
  DeviceBackward dev(pb);
  EXPECT_NE(select_backward_backend(dev.params), Backend::kHopper);
  dev.params.forward.backend = Backend::kHopper;
  EXPECT_THROW(attention_backward(dev.params, nullptr), Error);
}

}  // namespace
}  // namespace samattn::testing
