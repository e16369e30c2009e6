// CPU tests of the GEMM and softmax API: the fp64 references against independent arithmetic,
// and argument validation (messages name the argument, nothing is launched).
#include <cmath>
#include <string>

#include <gtest/gtest.h>

#include "gemm_support.h"
#include "samattn/gemm.h"
#include "test_support.h"

namespace samattn::testing {
namespace {

TEST(GemmReference, TransposedStorageGivesTheSameProduct) {
  // The same A and B stored row-major and transposed must give identical fp64 results, and
  // one element checked by hand.
  GemmLayout plain, transposed;
  transposed.trans_a = transposed.trans_b = true;
  transposed.c_col_major = true;
  GemmProblem x(5, 6, 7, DType::kFloat64, plain, 11);
  GemmProblem y(5, 6, 7, DType::kFloat64, transposed, 99);
  for (int64_t i = 0; i < 5; ++i)
    for (int64_t p = 0; p < 7; ++p) y.a.set(p * 5 + i, x.a.get(i * 7 + p));
  for (int64_t p = 0; p < 7; ++p)
    for (int64_t j = 0; j < 6; ++j) y.b.set(j * 7 + p, x.b.get(p * 6 + j));
  reference_gemm(x.params);
  reference_gemm(y.params);
  double by_hand = 0;
  for (int64_t p = 0; p < 7; ++p) by_hand += x.a.get(2 * 7 + p) * x.b.get(p * 6 + 3);
  EXPECT_DOUBLE_EQ(x.c.get(2 * 6 + 3), by_hand);
  for (int64_t i = 0; i < 5; ++i)
    for (int64_t j = 0; j < 6; ++j) EXPECT_EQ(x.c.get(i * 6 + j), y.c.get(j * 5 + i));
}

TEST(GemmReference, AlphaBetaAndNaNFreeBetaZero) {
  GemmLayout l;
  l.alpha = 0.5;
  l.beta = -2.0;
  GemmProblem x(3, 4, 5, DType::kFloat64, l, 3);
  reference_gemm(x.params);
  double sum = 0;
  for (int64_t p = 0; p < 5; ++p) sum += x.a.get(1 * 5 + p) * x.b.get(p * 4 + 2);
  EXPECT_NEAR(x.c.get(1 * 4 + 2), 0.5 * sum - 2.0 * x.c_in.get(1 * 4 + 2), 1e-14);
  GemmProblem z(3, 4, 5, DType::kFloat32, GemmLayout{}, 4);  // C poisoned, beta 0
  reference_gemm(z.params);
  for (int64_t i = 0; i < z.c.size(); ++i) EXPECT_FALSE(std::isnan(z.c.get(i)));
}

TEST(GemmReference, BatchedWithBroadcastB) {
  GemmLayout l;
  l.batch = 3;
  l.broadcast_b = true;
  GemmProblem x(4, 3, 2, DType::kFloat64, l, 5);
  reference_gemm(x.params);
  for (int64_t b = 0; b < 3; ++b) {
    double sum = 0;
    for (int64_t p = 0; p < 2; ++p) sum += x.a.get(b * 8 + 3 * 2 + p) * x.b.get(p * 3 + 1);
    EXPECT_DOUBLE_EQ(x.c.get(b * 12 + 3 * 3 + 1), sum);
  }
}

TEST(SoftmaxReference, RowsSumToOneAndCausalHidesTheFuture) {
  HostTensor in(DType::kFloat64, 2 * 4 * 6), out(DType::kFloat64, 2 * 4 * 6);
  fill_random(in, 7);
  out.poison();
  SoftmaxParams p;
  p.in = in.data();
  p.out = out.data();
  p.dtype = DType::kFloat64;
  p.batch = 2;
  p.rows = 4;
  p.cols = 6;
  p.in_row_stride = p.out_row_stride = 6;
  p.in_batch_stride = p.out_batch_stride = 24;
  p.scale = 0.7;
  p.causal = true;
  reference_softmax(p);
  for (int64_t b = 0; b < 2; ++b) {
    for (int64_t i = 0; i < 4; ++i) {
      double sum = 0, denom = 0;
      for (int64_t j = 0; j <= i; ++j) denom += std::exp(0.7 * in.get(b * 24 + i * 6 + j));
      for (int64_t j = 0; j < 6; ++j) {
        const double got = out.get(b * 24 + i * 6 + j);
        sum += got;
        if (j > i) {
          EXPECT_EQ(got, 0.0);
        } else {
          EXPECT_NEAR(got, std::exp(0.7 * in.get(b * 24 + i * 6 + j)) / denom, 1e-15);
        }
      }
      EXPECT_NEAR(sum, 1.0, 1e-14);
    }
  }
}

// Each invalid field gives a message that names it.
void expect_gemm_error(const GemmParams& p, const std::string& needle) {
  const Status status = can_implement_gemm(p);
  ASSERT_FALSE(status.ok()) << "expected an error naming " << needle;
  EXPECT_NE(status.message().find(needle), std::string::npos) << status.message();
  EXPECT_THROW(reference_gemm(p), Error);
}

TEST(GemmValidation, NamesTheBadField) {
  float buffer[64] = {};
  const GemmParams good =
      make_row_major_gemm(DType::kFloat32, buffer, buffer + 16, buffer + 32, 4, 4, 4);
  EXPECT_TRUE(can_implement_gemm(good).ok()) << can_implement_gemm(good).message();
  GemmParams p = good;
  p.m = 0;
  expect_gemm_error(p, "m must be >= 1");
  p = good;
  p.k = -1;
  expect_gemm_error(p, "k must be >= 1");
  p = good;
  p.batch = 0;
  expect_gemm_error(p, "batch");
  p = good;
  p.a = nullptr;
  expect_gemm_error(p, "a must not be null");
  p = good;
  p.c = nullptr;
  expect_gemm_error(p, "c must not be null");
  p = good;
  p.b_row_stride = -4;
  expect_gemm_error(p, "b_row_stride");
  p = good;
  p.c_row_stride = 2;  // rows of 4 overlap
  expect_gemm_error(p, "overlap");
  p = good;
  p.batch = 2;
  p.c_batch_stride = 0;
  expect_gemm_error(p, "overlap");
  p = good;
  p.alpha = std::nan("");
  expect_gemm_error(p, "alpha");
  p = good;
  p.dtype = DType::kFloat16;
  p.allow_tf32 = true;
  expect_gemm_error(p, "allow_tf32");
  p = good;
  p.dtype = static_cast<DType>(17);
  expect_gemm_error(p, "dtype");
}

TEST(GemmValidation, ForcedBackendsNameWhatTheyRun) {
  float buffer[64] = {};
  const GemmParams good =
      make_row_major_gemm(DType::kFloat32, buffer, buffer + 16, buffer + 32, 4, 4, 4);
  // Checked from the fields alone (before any device query), so no GPU is needed.
  GemmParams p = good;
  p.backend = GemmBackend::kSm80;
  Status status = can_implement_gemm(p);
  ASSERT_FALSE(status.ok());
  EXPECT_NE(status.message().find("backend sm80 runs float16, bfloat16 or float32 with allow_tf32"),
            std::string::npos)
      << status.message();
  EXPECT_NE(status.message().find("got float32 without allow_tf32"), std::string::npos);
  EXPECT_THROW(gemm(p, nullptr), Error);
  p.dtype = DType::kFloat64;
  p.backend = GemmBackend::kSm90;
  status = can_implement_gemm(p);
  EXPECT_NE(status.message().find("backend sm90 runs"), std::string::npos) << status.message();
  p = good;
  p.backend = static_cast<GemmBackend>(9);
  status = can_implement_gemm(p);
  EXPECT_NE(status.message().find("backend 9 is not one of auto, simt, sm80, sm90"),
            std::string::npos)
      << status.message();
  p = good;
  p.backend = GemmBackend::kSimt;  // every dtype runs on CUDA cores
  EXPECT_TRUE(can_implement_gemm(p).ok()) << can_implement_gemm(p).message();
  // The reference has no backends: it ignores the choice.
  p.backend = GemmBackend::kSm80;
  EXPECT_NO_THROW(reference_gemm(p));
  EXPECT_STREQ(gemm_backend_name(GemmBackend::kSm80), "sm80");
  EXPECT_STREQ(gemm_backend_name(GemmBackend::kAuto), "auto");
}

TEST(GemmValidation, GemmThrowsBeforeAnyLaunch) {
  GemmParams p = make_row_major_gemm(DType::kFloat32, nullptr, nullptr, nullptr, 4, 4, 4);
  EXPECT_THROW(gemm(p, nullptr), Error);  // no GPU needed: validation runs first
}

TEST(SoftmaxValidation, NamesTheBadField) {
  float buffer[16] = {};
  SoftmaxParams p;
  p.in = buffer;
  p.out = buffer + 8;
  p.rows = 2;
  p.cols = 4;
  p.in_row_stride = p.out_row_stride = 4;
  EXPECT_TRUE(can_implement_softmax(p).ok()) << can_implement_softmax(p).message();
  SoftmaxParams q = p;
  q.cols = 0;
  EXPECT_NE(can_implement_softmax(q).message().find("cols"), std::string::npos);
  q = p;
  q.out = nullptr;
  EXPECT_NE(can_implement_softmax(q).message().find("out"), std::string::npos);
  q = p;
  q.out_row_stride = 2;
  EXPECT_NE(can_implement_softmax(q).message().find("overlap"), std::string::npos);
  q = p;
  q.scale = INFINITY;
  EXPECT_NE(can_implement_softmax(q).message().find("scale"), std::string::npos);
  EXPECT_THROW(softmax(q, nullptr), Error);
}

}  // namespace
}  // namespace samattn::testing
