// The host fp16/bf16 conversions feed every reference comparison, so pin them down exactly.
#include <cmath>

#include <gtest/gtest.h>

#include "common/host_float.h"

namespace samattn::detail {
namespace {

TEST(HostFloat, Float16KnownValues) {
  EXPECT_EQ(double_to_float16(1.0), 0x3c00);
  EXPECT_EQ(double_to_float16(-2.0), 0xc000);
  EXPECT_EQ(double_to_float16(65504.0), 0x7bff);
  EXPECT_EQ(double_to_float16(65520.0), 0x7c00);  // rounds up to infinity
  EXPECT_EQ(double_to_float16(std::ldexp(1.0, -24)), 0x0001);
  EXPECT_EQ(double_to_float16(std::ldexp(1.0, -25)), 0x0000);        // tie to even (zero)
  EXPECT_EQ(double_to_float16(std::ldexp(3.0, -25)), 0x0002);        // tie to even (two)
  EXPECT_EQ(double_to_float16(1.0 + std::ldexp(1.0, -11)), 0x3c00);  // tie to even
  EXPECT_EQ(double_to_float16(1.0 + std::ldexp(3.0, -11)), 0x3c02);  // tie to even
  EXPECT_TRUE(std::isnan(float16_to_double(double_to_float16(NAN))));
  EXPECT_EQ(float16_to_double(0x3555), 0.333251953125);
}

TEST(HostFloat, Float16RoundTripsEveryPattern) {
  for (uint32_t bits = 0; bits < 0x10000; ++bits) {
    const double value = float16_to_double(static_cast<uint16_t>(bits));
    if (std::isnan(value)) continue;
    EXPECT_EQ(double_to_float16(value), bits) << "bits " << bits;
  }
}

TEST(HostFloat, BFloat16RoundTripsEveryPattern) {
  for (uint32_t bits = 0; bits < 0x10000; ++bits) {
    const double value = bfloat16_to_double(static_cast<uint16_t>(bits));
    if (std::isnan(value)) continue;
    EXPECT_EQ(double_to_bfloat16(value), bits) << "bits " << bits;
  }
  EXPECT_EQ(double_to_bfloat16(1.0), 0x3f80);
  EXPECT_EQ(double_to_bfloat16(1.0 + std::ldexp(1.0, -8)), 0x3f80);  // tie to even
  EXPECT_EQ(double_to_bfloat16(1.0 + std::ldexp(3.0, -8)), 0x3f82);  // tie to even
}

}  // namespace
}  // namespace samattn::detail
