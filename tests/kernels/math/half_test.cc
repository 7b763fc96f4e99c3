// bf16 / fp16 conversions of kernels/math/half.h against references written independently:
// decoding with std::ldexp, rounding by choosing the nearer of the two neighbouring
// representable values in float64 (ties to the even bit pattern).

#include "kernels/math/half.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "gtest/gtest.h"

namespace optstep {
namespace math {
namespace {

constexpr float kInf = std::numeric_limits<float>::infinity();

float FromBits(uint32_t u) {
  float f;
  std::memcpy(&f, &u, sizeof(f));
  return f;
}

uint32_t ToBits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, sizeof(u));
  return u;
}

// IEEE binary16 decoded with ldexp (sign, 5-bit exponent with bias 15, 10-bit mantissa).
double DecodeFp16(uint16_t h) {
  const int sign = (h >> 15) ? -1 : 1;
  const int exp = (h >> 10) & 0x1f;
  const int mant = h & 0x3ff;
  if (exp == 0x1f) {
    return mant ? std::numeric_limits<double>::quiet_NaN()
                : sign * std::numeric_limits<double>::infinity();
  }
  if (exp == 0) return sign * std::ldexp(static_cast<double>(mant), -24);
  return sign * std::ldexp(1.0 + mant / 1024.0, exp - 15);
}

// bfloat16 decoded with ldexp (8-bit exponent with bias 127, 7-bit mantissa).
double DecodeBf16(uint16_t h) {
  const int sign = (h >> 15) ? -1 : 1;
  const int exp = (h >> 7) & 0xff;
  const int mant = h & 0x7f;
  if (exp == 0xff) {
    return mant ? std::numeric_limits<double>::quiet_NaN()
                : sign * std::numeric_limits<double>::infinity();
  }
  if (exp == 0) return sign * std::ldexp(static_cast<double>(mant), -133);
  return sign * std::ldexp(1.0 + mant / 128.0, exp - 127);
}

// Round-to-nearest-even reference for a finite, non-negative x given the sorted magnitudes of
// the format's finite non-negative values (index = bit pattern) and the value that overflow
// rounds against (the next power of two past the largest finite value, i.e. "infinity").
uint16_t RoundReference(double x, const std::vector<double>& magnitudes, double inf_edge) {
  const uint16_t max_finite = static_cast<uint16_t>(magnitudes.size() - 1);
  auto it = std::upper_bound(magnitudes.begin(), magnitudes.end(), x);
  if (it == magnitudes.end()) {  // above the largest finite value
    const double lo = magnitudes.back();
    const double mid = (lo + inf_edge) / 2;
    if (x < mid) return max_finite;
    if (x > mid) return static_cast<uint16_t>(max_finite + 1);
    return (max_finite & 1) ? static_cast<uint16_t>(max_finite + 1) : max_finite;
  }
  const uint16_t hi = static_cast<uint16_t>(it - magnitudes.begin());
  const uint16_t lo = static_cast<uint16_t>(hi - 1);
  const double dlo = x - magnitudes[lo];
  const double dhi = magnitudes[hi] - x;
  if (dlo < dhi) return lo;
  if (dhi < dlo) return hi;
  return (lo & 1) ? hi : lo;
}

std::vector<double> Fp16Magnitudes() {
  std::vector<double> m;
  for (uint32_t h = 0; h < 0x7c00; ++h) m.push_back(DecodeFp16(static_cast<uint16_t>(h)));
  return m;
}

std::vector<double> Bf16Magnitudes() {
  std::vector<double> m;
  for (uint32_t h = 0; h < 0x7f80; ++h) m.push_back(DecodeBf16(static_cast<uint16_t>(h)));
  return m;
}

TEST(HalfTest, Fp16DecodesEveryValue) {
  for (uint32_t h = 0; h <= 0xffff; ++h) {
    const double want = DecodeFp16(static_cast<uint16_t>(h));
    const float got = Fp16ToFloat(static_cast<uint16_t>(h));
    if (std::isnan(want)) {
      EXPECT_TRUE(std::isnan(got)) << std::hex << h;
    } else {
      ASSERT_EQ(static_cast<double>(got), want) << std::hex << h;
      ASSERT_EQ(std::signbit(got), (h & 0x8000) != 0) << std::hex << h;
    }
  }
}

TEST(HalfTest, Fp16RoundTripsEveryValue) {
  for (uint32_t h = 0; h <= 0xffff; ++h) {
    const uint16_t back = FloatToFp16(Fp16ToFloat(static_cast<uint16_t>(h)));
    if ((h & 0x7c00) == 0x7c00 && (h & 0x3ff) != 0) {
      EXPECT_EQ(back & 0x7c00, 0x7c00) << std::hex << h;  // NaN stays NaN (payload may change)
      EXPECT_NE(back & 0x3ff, 0) << std::hex << h;
      EXPECT_EQ(back & 0x8000, h & 0x8000) << std::hex << h;
    } else {
      ASSERT_EQ(back, h) << std::hex << h;
    }
  }
}

TEST(HalfTest, Bf16DecodesAndRoundTripsEveryValue) {
  for (uint32_t h = 0; h <= 0xffff; ++h) {
    const double want = DecodeBf16(static_cast<uint16_t>(h));
    const float got = Bf16ToFloat(static_cast<uint16_t>(h));
    const uint16_t back = FloatToBf16(got);
    if (std::isnan(want)) {
      EXPECT_TRUE(std::isnan(got)) << std::hex << h;
      EXPECT_TRUE(std::isnan(Bf16ToFloat(back))) << std::hex << h;
    } else {
      ASSERT_EQ(static_cast<double>(got), want) << std::hex << h;
      ASSERT_EQ(back, h) << std::hex << h;
    }
  }
}

// Every midpoint between neighbours rounds to the even one; one fp32 ulp either side rounds to
// the nearer one. Covers subnormals, the normal range and the overflow boundary.
TEST(HalfTest, Fp16TiesToEvenAtEveryMidpoint) {
  const std::vector<double> mags = Fp16Magnitudes();
  for (uint32_t lo = 0; lo < 0x7c00; ++lo) {
    const double hi_value = lo + 1 < 0x7c00 ? mags[lo + 1] : 65536.0;
    const float mid = static_cast<float>((mags[lo] + hi_value) / 2);
    ASSERT_EQ(static_cast<double>(mid), (mags[lo] + hi_value) / 2);  // exact in fp32
    const uint16_t even = (lo & 1) ? static_cast<uint16_t>(lo + 1) : static_cast<uint16_t>(lo);
    ASSERT_EQ(FloatToFp16(mid), even) << "midpoint above " << std::hex << lo;
    ASSERT_EQ(FloatToFp16(-mid), even | 0x8000) << "midpoint above " << std::hex << lo;
    ASSERT_EQ(FloatToFp16(std::nextafter(mid, 0.0f)), lo) << std::hex << lo;
    ASSERT_EQ(FloatToFp16(std::nextafter(mid, kInf)), lo + 1) << std::hex << lo;
  }
}

TEST(HalfTest, Bf16TiesToEvenAtEveryMidpoint) {
  const std::vector<double> mags = Bf16Magnitudes();
  for (uint32_t lo = 0; lo < 0x7f80; ++lo) {
    const double hi_value = lo + 1 < 0x7f80 ? mags[lo + 1] : std::ldexp(1.0, 128);
    const double mid_exact = (mags[lo] + hi_value) / 2;
    if (mid_exact > std::numeric_limits<float>::max()) {
      // The midpoint between the largest bf16 and 2^128 is not a float; FLT_MAX lies above the
      // largest bf16's half-ulp neighbourhood and must round to infinity.
      EXPECT_EQ(FloatToBf16(std::numeric_limits<float>::max()), 0x7f80);
      continue;
    }
    const float mid = static_cast<float>(mid_exact);
    ASSERT_EQ(static_cast<double>(mid), mid_exact);
    const uint16_t even = (lo & 1) ? static_cast<uint16_t>(lo + 1) : static_cast<uint16_t>(lo);
    ASSERT_EQ(FloatToBf16(mid), even) << "midpoint above " << std::hex << lo;
    ASSERT_EQ(FloatToBf16(-mid), even | 0x8000) << "midpoint above " << std::hex << lo;
    ASSERT_EQ(FloatToBf16(std::nextafter(mid, 0.0f)), lo) << std::hex << lo;
    ASSERT_EQ(FloatToBf16(std::nextafter(mid, kInf)), lo + 1) << std::hex << lo;
  }
}

// Random fp32 bit patterns (all exponents, including fp32 subnormals) against the reference.
TEST(HalfTest, RandomFloatsRoundToNearestEven) {
  const std::vector<double> fp16 = Fp16Magnitudes();
  const std::vector<double> bf16 = Bf16Magnitudes();
  std::mt19937 rng(20240611);
  for (int i = 0; i < 400000; ++i) {
    const float f = FromBits(static_cast<uint32_t>(rng()));
    if (std::isnan(f)) continue;
    const double a = std::fabs(static_cast<double>(f));
    const uint16_t sign = std::signbit(f) ? 0x8000 : 0;
    if (std::isinf(f)) {
      ASSERT_EQ(FloatToFp16(f), sign | 0x7c00);
      ASSERT_EQ(FloatToBf16(f), sign | 0x7f80);
      continue;
    }
    ASSERT_EQ(FloatToFp16(f), sign | RoundReference(a, fp16, 65536.0)) << std::hex << ToBits(f);
    ASSERT_EQ(FloatToBf16(f), sign | RoundReference(a, bf16, std::ldexp(1.0, 128)))
        << std::hex << ToBits(f);
  }
}

TEST(HalfTest, SpecialValues) {
  const float inf = std::numeric_limits<float>::infinity();
  EXPECT_EQ(FloatToFp16(0.0f), 0x0000);
  EXPECT_EQ(FloatToFp16(-0.0f), 0x8000);
  EXPECT_EQ(FloatToBf16(-0.0f), 0x8000);
  EXPECT_EQ(FloatToFp16(inf), 0x7c00);
  EXPECT_EQ(FloatToFp16(-inf), 0xfc00);
  EXPECT_EQ(FloatToBf16(inf), 0x7f80);
  EXPECT_EQ(FloatToBf16(-inf), 0xff80);
  // Overflow: 65504 is the largest fp16; 65519.996 rounds down, 65520 (a tie) rounds to inf.
  EXPECT_EQ(FloatToFp16(65504.0f), 0x7bff);
  EXPECT_EQ(FloatToFp16(std::nextafter(65520.0f, 0.0f)), 0x7bff);
  EXPECT_EQ(FloatToFp16(65520.0f), 0x7c00);
  EXPECT_EQ(FloatToFp16(1e10f), 0x7c00);
  EXPECT_EQ(FloatToFp16(-1e10f), 0xfc00);
  EXPECT_EQ(FloatToBf16(std::numeric_limits<float>::max()), 0x7f80);
  // fp16 subnormals: 2^-24 is the smallest; half of it ties to zero, just above rounds up.
  EXPECT_EQ(FloatToFp16(std::ldexp(1.0f, -24)), 0x0001);
  EXPECT_EQ(FloatToFp16(std::ldexp(1.0f, -25)), 0x0000);
  EXPECT_EQ(FloatToFp16(std::nextafter(std::ldexp(1.0f, -25), 1.0f)), 0x0001);
  EXPECT_EQ(FloatToFp16(std::ldexp(3.0f, -25)), 0x0002);  // 1.5 units: tie to even 2
  EXPECT_EQ(FloatToFp16(std::ldexp(1.0f, -14)), 0x0400);  // smallest normal
  EXPECT_EQ(FloatToFp16(std::numeric_limits<float>::denorm_min()), 0x0000);
  // bf16 keeps fp32's exponent range: fp32 subnormals map to bf16 subnormals.
  EXPECT_EQ(FloatToBf16(FromBits(0x00010000)), 0x0001);
  EXPECT_EQ(FloatToBf16(FromBits(0x00008000)), 0x0000);  // tie to even 0
  EXPECT_EQ(FloatToBf16(FromBits(0x00018000)), 0x0002);  // tie to even 2
  EXPECT_EQ(FloatToBf16(FromBits(0x00008001)), 0x0001);
  // Ordinary ties: 1 + 2^-8 is halfway between bf16 1 and 1 + 2^-7.
  EXPECT_EQ(FloatToBf16(1.0f + std::ldexp(1.0f, -8)), 0x3f80);
  EXPECT_EQ(FloatToBf16(1.0f + 3 * std::ldexp(1.0f, -8)), 0x3f82);
  EXPECT_EQ(FloatToFp16(1.0f + std::ldexp(1.0f, -11)), 0x3c00);
  EXPECT_EQ(FloatToFp16(1.0f + 3 * std::ldexp(1.0f, -11)), 0x3c02);
}

TEST(HalfTest, NaNStaysNaN) {
  // Payloads only in the low 16 bits would truncate to infinity without the quiet bit.
  for (uint32_t bits :
       {0x7fc00000u, 0x7f800001u, 0x7f80ffffu, 0xff800001u, 0x7fffffffu, 0xffc00000u}) {
    const float nan = FromBits(bits);
    ASSERT_TRUE(std::isnan(nan));
    EXPECT_TRUE(std::isnan(Bf16ToFloat(FloatToBf16(nan)))) << std::hex << bits;
    EXPECT_TRUE(std::isnan(Fp16ToFloat(FloatToFp16(nan)))) << std::hex << bits;
    EXPECT_EQ(FloatToBf16(nan) & 0x8000, (bits >> 16) & 0x8000);
    EXPECT_EQ(FloatToFp16(nan) & 0x8000, (bits >> 16) & 0x8000);
  }
}

}  // namespace
}  // namespace math
}  // namespace optstep
