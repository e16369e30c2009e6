// The fp64 reference is the oracle of every other test, so it is checked against properties
// that follow from the definition alone: uniform attention is a mean, one key returns its value,
// strided/grouped/causal attention equal dense attention on the sliced or repeated inputs.
#include <algorithm>
#include <cmath>
#include <limits>
#include <thread>

#include "reference/reference_workers.h"
#include "test_support.h"

namespace samattn::testing {
namespace {

// Small calls stay on the calling thread (starting one costs more than their arithmetic); large
// ones take a thread per slice, up to the hardware's.
TEST(Reference, ThreadsFollowTheWork) {
  using detail::kReferenceMultiplyAddsPerThread;
  using detail::reference_workers;
  const int64_t hardware = std::max<int64_t>(1, std::thread::hardware_concurrency());
  EXPECT_EQ(reference_workers(8, 2 * 4 * 4 * 16), 1);
  EXPECT_EQ(reference_workers(8, kReferenceMultiplyAddsPerThread - 1), 1);
  EXPECT_EQ(reference_workers(8, 2 * kReferenceMultiplyAddsPerThread),
            std::min<int64_t>(hardware, 3));
  EXPECT_EQ(reference_workers(8, int64_t{1} << 40), std::min<int64_t>(hardware, 8));
  EXPECT_EQ(reference_workers(1, int64_t{1} << 40), 1);
  EXPECT_EQ(reference_workers(1000, int64_t{1} << 40), std::min<int64_t>(hardware, 64));
}

TEST(Reference, ZeroQueriesAverageTheValues) {
  Shape s{1, 1, 1, 3, 5, 4, 6};
  Problem pb(s, DType::kFloat64);
  for (int64_t i = 0; i < pb.q.size(); ++i) pb.q.set(i, 0.0);
  const HostTensor out = pb.reference(/*with_lse=*/true);
  for (int64_t i = 0; i < s.seqlen_q; ++i) {
    for (int64_t d = 0; d < s.head_dim_v; ++d) {
      double mean = 0;
      for (int64_t j = 0; j < s.seqlen_k; ++j) mean += pb.v.get(j * s.head_dim_v + d);
      EXPECT_NEAR(out.get(i * s.head_dim_v + d), mean / s.seqlen_k, 1e-14);
    }
    EXPECT_NEAR(pb.lse[i], std::log(5.0), 1e-14);
  }
}

TEST(Reference, SingleKeyReturnsItsValue) {
  Shape s{1, 1, 1, 2, 1, 3, 3};
  Problem pb(s, DType::kFloat64);
  pb.params.softmax_scale = 0.5;
  const HostTensor out = pb.reference(true);
  for (int64_t i = 0; i < s.seqlen_q; ++i) {
    double dot = 0;
    for (int64_t d = 0; d < 3; ++d) dot += pb.q.get(i * 3 + d) * pb.k.get(d);
    EXPECT_NEAR(pb.lse[i], 0.5 * dot, 1e-14);
    for (int64_t d = 0; d < 3; ++d) EXPECT_EQ(out.get(i * 3 + d), pb.v.get(d));
  }
}

TEST(Reference, KvStrideEqualsDenseAttentionOnTheKeptKeys) {
  Shape s{2, 2, 2, 9, 23, 8, 8};
  Problem strided(s, DType::kFloat64);
  strided.params.kv_stride = 4;
  const HostTensor expected_input = strided.reference();

  // The same tensors viewed with a 4x longer sequence stride and ceil(23 / 4) = 6 keys.
  AttentionParams dense = strided.params;
  dense.kv_stride = 1;
  dense.seqlen_k = 6;
  dense.k_strides.seq *= 4;
  dense.v_strides.seq *= 4;
  HostTensor out(DType::kFloat64, strided.out.size());
  dense.out = out.data();
  reference_attention_forward(dense);
  for (int64_t i = 0; i < out.size(); ++i) EXPECT_EQ(out.get(i), expected_input.get(i));
}

TEST(Reference, GroupedQueryEqualsRepeatedHeads) {
  Shape s{2, 6, 2, 5, 7, 4, 4};
  Problem grouped(s, DType::kFloat64);
  const HostTensor expected = grouped.reference();

  // Heads 0..2 share kv head 0 and heads 3..5 kv head 1: express that with a head stride of 0
  // inside each group by running one group at a time.
  for (int64_t group = 0; group < 2; ++group) {
    AttentionParams p = grouped.params;
    p.heads_q = 3;
    p.heads_kv = 3;
    p.q = static_cast<const double*>(grouped.params.q) + group * 3 * p.q_strides.head;
    p.k = static_cast<const double*>(grouped.params.k) + group * p.k_strides.head;
    p.v = static_cast<const double*>(grouped.params.v) + group * p.v_strides.head;
    p.k_strides.head = 0;
    p.v_strides.head = 0;
    HostTensor out(DType::kFloat64, grouped.out.size());
    p.out = static_cast<double*>(out.data()) + group * 3 * p.out_strides.head;
    reference_attention_forward(p);
    for (int64_t b = 0; b < s.batch; ++b) {
      for (int64_t h = group * 3; h < group * 3 + 3; ++h) {
        for (int64_t e = 0; e < s.seqlen_q * s.head_dim_v; ++e) {
          const int64_t i = (b * s.heads_q + h) * s.seqlen_q * s.head_dim_v + e;
          EXPECT_EQ(out.get(i), expected.get(i));
        }
      }
    }
  }
}

TEST(Reference, CausalRowSeesOnlyThePrefix) {
  Shape s{1, 1, 1, 6, 9, 4, 4};
  Problem causal(s, DType::kFloat64);
  causal.params.causal = true;
  const HostTensor out = causal.reference();
  for (int64_t i = 0; i < s.seqlen_q; ++i) {
    AttentionParams prefix = causal.params;
    prefix.causal = false;
    prefix.seqlen_q = 1;
    prefix.seqlen_k = i + 1;
    prefix.q = static_cast<const double*>(causal.params.q) + i * s.head_dim;
    HostTensor row(DType::kFloat64, s.head_dim_v);
    prefix.out = row.data();
    reference_attention_forward(prefix);
    for (int64_t d = 0; d < s.head_dim_v; ++d) EXPECT_EQ(out.get(i * s.head_dim_v + d), row.get(d));
  }
}

TEST(Reference, NoKeysGivesZerosAndNegativeInfinityLse) {
  Shape s{1, 2, 1, 3, 0, 4, 5};
  Problem pb(s, DType::kFloat32);
  const HostTensor out = pb.reference(true);
  for (int64_t i = 0; i < out.size(); ++i) EXPECT_EQ(out.get(i), 0.0);
  for (double lse : pb.lse) EXPECT_EQ(lse, -std::numeric_limits<double>::infinity());
}

TEST(Reference, NanStaysInItsRow) {
  Shape s{1, 1, 1, 3, 4, 2, 2};
  Problem pb(s, DType::kFloat32);
  pb.q.set(1 * 2 + 0, NAN);  // query row 1
  const HostTensor out = pb.reference();
  for (int64_t d = 0; d < 2; ++d) {
    EXPECT_TRUE(std::isfinite(out.get(0 * 2 + d)));
    EXPECT_TRUE(std::isnan(out.get(1 * 2 + d)));
    EXPECT_TRUE(std::isfinite(out.get(2 * 2 + d)));
  }
}

TEST(Reference, WritesEveryOutputElementInEachDtype) {
  for (DType dtype : {DType::kFloat64, DType::kFloat32, DType::kFloat16, DType::kBFloat16}) {
    Shape s{2, 4, 2, 17, 13, 24, 40};
    Problem pb(s, dtype, /*seq_major=*/true);
    pb.params.causal = true;
    pb.params.kv_stride = 2;
    const HostTensor out = pb.reference(true);
    for (int64_t i = 0; i < out.size(); ++i) ASSERT_TRUE(std::isfinite(out.get(i))) << i;
    for (double lse : pb.lse) ASSERT_TRUE(std::isfinite(lse));
  }
}

}  // namespace
}  // namespace samattn::testing
