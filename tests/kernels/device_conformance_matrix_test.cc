// Device conformance, part 4: the matrix primitives (Gemm and SymmetricGemm in every precision and
// dtype, Convert, Transpose, CopyRowBlocks, AxisDot, AxisScale, Permute, SymmetricEigh, Qr) against
// float64 plain-loop references written here, and their argument checks.

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "kernels/device.h"
#include "kernels/math/half.h"
#include "kernels/matrix_types.h"
#include "kernels/tensor.h"
#include "tests/kernels/device_conformance.h"
#include "tests/testing/status_matchers.h"

namespace optstep {
namespace testing_internal {
namespace {

using ::optstep::testutil::StatusIs;
using ::testing::ElementsAreArray;

constexpr absl::StatusCode kInvalid = absl::StatusCode::kInvalidArgument;

float Bf16(float x) { return math::Bf16ToFloat(math::FloatToBf16(x)); }

// Row-major element (i, j) of op(X) for an {rows, cols} matrix.
double At(const std::vector<float>& x, int64_t cols, bool transpose, int64_t i, int64_t j) {
  return transpose ? x[j * cols + i] : x[i * cols + j];
}

struct GemmCase {
  int64_t m, n, k;
  bool ta, tb;
  float alpha, beta;
};

class GemmCheck {
 public:
  // The float64 product and Σ|α·a·b| + |β·c| per element (the scale of the rounding error).
  GemmCheck(const GemmCase& c, const std::vector<float>& a, const std::vector<float>& b,
            const std::vector<float>& c0)
      : want(c.m * c.n), scale(c.m * c.n) {
    const int64_t a_cols = c.ta ? c.m : c.k;
    const int64_t b_cols = c.tb ? c.k : c.n;
    for (int64_t i = 0; i < c.m; ++i) {
      for (int64_t j = 0; j < c.n; ++j) {
        double sum = 0.0, abs = 0.0;
        for (int64_t p = 0; p < c.k; ++p) {
          const double prod = At(a, a_cols, c.ta, i, p) * At(b, b_cols, c.tb, p, j);
          sum += prod;
          abs += std::fabs(prod);
        }
        const double old = c.beta == 0.0f ? 0.0 : c.beta * static_cast<double>(c0[i * c.n + j]);
        want[i * c.n + j] = c.alpha * sum + old;
        scale[i * c.n + j] = std::fabs(c.alpha) * abs + std::fabs(old);
      }
    }
  }

  ::testing::AssertionResult Within(const std::vector<float>& got, double relative_to_scale,
                                    double relative_to_value) const {
    for (size_t i = 0; i < got.size(); ++i) {
      const double bound = relative_to_scale * scale[i] + relative_to_value * std::fabs(want[i]);
      if (!(std::fabs(got[i] - want[i]) <= bound)) {
        return ::testing::AssertionFailure()
               << "element " << i << ": got " << got[i] << ", want " << want[i];
      }
    }
    return ::testing::AssertionSuccess();
  }

  std::vector<double> want;
  std::vector<double> scale;
};

const GemmCase kGemmCases[] = {
    {33, 17, 65, false, false, 1.0f, 0.0f},  {33, 17, 65, true, false, 0.5f, 1.0f},
    {33, 17, 65, false, true, -2.0f, 0.25f}, {16, 40, 9, true, true, 1.0f, -1.0f},
    {1, 1, 1, false, false, 3.0f, 0.0f},     {64, 64, 64, false, true, 1.0f, 0.0f},
};

TEST_P(DeviceConformanceTest, GemmInEveryPrecisionAndLayout) {
  for (const GemmCase& c : kGemmCases) {
    SCOPED_TRACE(::testing::Message() << c.m << "x" << c.n << "x" << c.k << " ta " << c.ta << " tb "
                                      << c.tb << " alpha " << c.alpha << " beta " << c.beta);
    const Shape a_shape = c.ta ? Shape{c.k, c.m} : Shape{c.m, c.k};
    const Shape b_shape = c.tb ? Shape{c.n, c.k} : Shape{c.k, c.n};
    const std::vector<float> a = Normal(c.m * c.k, 1.0f, 1), b = Normal(c.k * c.n, 1.0f, 2);
    std::vector<float> c0 = Normal(c.m * c.n, 1.0f, 3);
    if (c.beta == 0.0f) std::fill(c0.begin(), c0.end(), std::nanf(""));  // never read
    const GemmCheck exact(c, a, b, c0);
    OPTSTEP_ASSERT_OK_AND_ASSIGN(Tensor ta, Upload(a_shape, a));
    OPTSTEP_ASSERT_OK_AND_ASSIGN(Tensor tb, Upload(b_shape, b));
    // highest: fp32 products; high: TF32 on GPUs (10-bit mantissa), fp32 on the CPU.
    for (auto [precision, tolerance] :
         {std::pair<MatmulPrecision, double>{MatmulPrecision::kHighest, 1e-5},
          {MatmulPrecision::kHigh, 2e-3}}) {
      OPTSTEP_ASSERT_OK_AND_ASSIGN(Tensor tc, Upload({c.m, c.n}, c0));
      OPTSTEP_ASSERT_OK(
          device_->matrix().Gemm({precision, c.ta, c.tb, c.alpha, c.beta}, ta, tb, tc));
      EXPECT_TRUE(exact.Within(*Download(tc), tolerance, 0.0)) << MatmulPrecisionName(precision);
    }
    // medium on fp32 tensors: bf16-class products. The CPU rounds the inputs to bf16 and
    // accumulates in fp32 (exactly that, checked); cuBLAS's COMPUTE_32F_FAST_16BF may use other
    // bf16 schemes, so other devices are held to bf16 accuracy against the exact product.
    std::vector<float> a16(a.size()), b16(b.size());
    std::transform(a.begin(), a.end(), a16.begin(), Bf16);
    std::transform(b.begin(), b.end(), b16.begin(), Bf16);
    const GemmCheck rounded(c, a16, b16, c0);
    OPTSTEP_ASSERT_OK_AND_ASSIGN(Tensor tc, Upload({c.m, c.n}, c0));
    OPTSTEP_ASSERT_OK(device_->matrix().Gemm(
        {MatmulPrecision::kMedium, c.ta, c.tb, c.alpha, c.beta}, ta, tb, tc));
    if (device_->name() == "cpu") {
      EXPECT_TRUE(rounded.Within(*Download(tc), 1e-5, 0.0)) << "medium fp32";
    } else {
      EXPECT_TRUE(exact.Within(*Download(tc), 1e-2, 0.0)) << "medium fp32";
    }
    // bf16 tensors: bf16 in and out, fp32 accumulation and epilogue.
    std::vector<float> c16(c0.size());
    std::transform(c0.begin(), c0.end(), c16.begin(), Bf16);
    const GemmCheck half(c, a16, b16, c16);
    OPTSTEP_ASSERT_OK_AND_ASSIGN(Tensor ha, device_->Allocate(DType::kBF16, a_shape));
    OPTSTEP_ASSERT_OK_AND_ASSIGN(Tensor hb, device_->Allocate(DType::kBF16, b_shape));
    OPTSTEP_ASSERT_OK_AND_ASSIGN(Tensor hc, device_->Allocate(DType::kBF16, {c.m, c.n}));
    OPTSTEP_ASSERT_OK_AND_ASSIGN(Tensor fc, Upload({c.m, c.n}, c0));
    OPTSTEP_ASSERT_OK(device_->Convert(ta, ha));
    OPTSTEP_ASSERT_OK(device_->Convert(tb, hb));
    OPTSTEP_ASSERT_OK(device_->Convert(fc, hc));
    OPTSTEP_ASSERT_OK(device_->matrix().Gemm(
        {MatmulPrecision::kMedium, c.ta, c.tb, c.alpha, c.beta}, ha, hb, hc));
    OPTSTEP_ASSERT_OK(device_->Convert(hc, fc));
    const std::vector<float> got = *Download(fc);
    for (float x : got) ASSERT_EQ(Bf16(x), x) << "bf16 output";
    EXPECT_TRUE(half.Within(got, 1e-4, 1.0 / 256)) << "bf16";
  }
}

// SymmetricGemm: C {m, m} ← α·op(A)·op(B) + β·C for symmetric products on a symmetric C (X·Xᵀ,
// Xᵀ·X, S·S of a symmetric S), against the float64 product: the tolerances of
// GemmInEveryPrecisionAndLayout. The CPU computes the upper triangle and mirrors it, so its result
// is exactly symmetric.
TEST_P(DeviceConformanceTest, SymmetricGemmInEveryPrecision) {
  const GemmCase cases[] = {{200, 200, 65, false, true, 1.0f, 0.0f},
                            {200, 200, 65, true, false, -0.5f, 2.0f},
                            {70, 70, 70, false, false, 2.0315f, -4.775f},
                            {1, 1, 7, true, false, 1.0f, 1.0f}};
  for (const GemmCase& c : cases) {
    SCOPED_TRACE(::testing::Message() << c.m << "x" << c.k << " ta " << c.ta << " tb " << c.tb
                                      << " alpha " << c.alpha << " beta " << c.beta);
    // One operand for both sides: X (transposed on one side), or a symmetric S.
    const Shape a_shape = c.ta ? Shape{c.k, c.m} : Shape{c.m, c.k};
    const std::vector<float> x = Normal(c.m * c.k, 1.0f, 7), s = Normal(c.m * c.m, 1.0f, 8);
    std::vector<float> a(x), c0(c.m * c.m);
    for (int64_t i = 0; i < c.m; ++i) {
      for (int64_t j = 0; j < c.m; ++j) {
        c0[i * c.m + j] = s[i * c.m + j] + s[j * c.m + i];
        if (c.ta == c.tb) a[i * c.m + j] = x[i * c.m + j] + x[j * c.m + i];
      }
    }
    std::vector<float> a16(a.size()), c16(c0.size());
    std::transform(a.begin(), a.end(), a16.begin(), Bf16);
    std::transform(c0.begin(), c0.end(), c16.begin(), Bf16);
    const GemmCheck exact(c, a, a, c0), rounded(c, a16, a16, c0), half(c, a16, a16, c16);
    const GemmArgs highest{MatmulPrecision::kHighest, c.ta, c.tb, c.alpha, c.beta};
    const GemmArgs medium{MatmulPrecision::kMedium, c.ta, c.tb, c.alpha, c.beta};
    OPTSTEP_ASSERT_OK_AND_ASSIGN(Tensor ta, Upload(a_shape, a));
    std::vector<std::pair<const char*, std::vector<float>>> results;
    OPTSTEP_ASSERT_OK_AND_ASSIGN(Tensor tc, Upload({c.m, c.m}, c0));
    OPTSTEP_ASSERT_OK(device_->matrix().SymmetricGemm(highest, ta, ta, tc));
    results.emplace_back("highest", *Download(tc));
    EXPECT_TRUE(exact.Within(results.back().second, 1e-5, 0.0)) << "highest";
    OPTSTEP_ASSERT_OK_AND_ASSIGN(tc, Upload({c.m, c.m}, c0));
    OPTSTEP_ASSERT_OK(device_->matrix().SymmetricGemm(medium, ta, ta, tc));
    results.emplace_back("medium fp32", *Download(tc));
    EXPECT_TRUE(device_->name() == "cpu" ? rounded.Within(results.back().second, 1e-5, 0.0)
                                         : exact.Within(results.back().second, 1e-2, 0.0))
        << "medium fp32";
    OPTSTEP_ASSERT_OK_AND_ASSIGN(Tensor ha, device_->Allocate(DType::kBF16, a_shape));
    OPTSTEP_ASSERT_OK_AND_ASSIGN(Tensor hc, device_->Allocate(DType::kBF16, {c.m, c.m}));
    OPTSTEP_ASSERT_OK_AND_ASSIGN(tc, Upload({c.m, c.m}, c0));
    OPTSTEP_ASSERT_OK(device_->Convert(ta, ha));
    OPTSTEP_ASSERT_OK(device_->Convert(tc, hc));
    OPTSTEP_ASSERT_OK(device_->matrix().SymmetricGemm(medium, ha, ha, hc));
    OPTSTEP_ASSERT_OK(device_->Convert(hc, tc));
    results.emplace_back("bf16", *Download(tc));
    EXPECT_TRUE(half.Within(results.back().second, 1e-4, 1.0 / 256)) << "bf16";
    if (device_->name() != "cpu") continue;
    for (const auto& [name, got] : results) {
      for (int64_t i = 0; i < c.m; ++i) {
        for (int64_t j = 0; j < i; ++j) {
          ASSERT_EQ(got[i * c.m + j], got[j * c.m + i]) << name << " (" << i << ", " << j << ")";
        }
      }
    }
  }
  OPTSTEP_ASSERT_OK_AND_ASSIGN(Tensor a, device_->Allocate(DType::kF32, {4, 3}));
  OPTSTEP_ASSERT_OK_AND_ASSIGN(Tensor b, device_->Allocate(DType::kF32, {3, 5}));
  OPTSTEP_ASSERT_OK_AND_ASSIGN(Tensor c, device_->Allocate(DType::kF32, {4, 5}));
  EXPECT_THAT(device_->matrix().SymmetricGemm({}, a, b, c),
              StatusIs(kInvalid, "SymmetricGemm: c must be square, got shape [4, 5]"));
  OPTSTEP_ASSERT_OK_AND_ASSIGN(Tensor square, device_->Allocate(DType::kF32, {4, 4}));
  EXPECT_THAT(device_->matrix().SymmetricGemm({}, a, a, square),
              StatusIs(kInvalid, "Gemm: op(a) is [4, 3] but op(b) is [4, 3]"));
}

// GemmFrom: C ← α·op(A)·op(B) + β·D has the bits of Copy(d, c) followed by Gemm (or
// SymmetricGemm), in every precision and dtype, from a C whose old values must not show; sizes
// above those the CPU splits over its threads, where it copies D inside the product's region.
TEST_P(DeviceConformanceTest, GemmFromEqualsCopyThenTheProduct) {
  const GemmCase cases[] = {{131, 257, 251, false, false, 1.0f, 2.0315f},  // Y = a·X + B·X
                            {131, 257, 251, false, true, -0.5f, 1.5f},
                            {33, 17, 65, true, false, 2.0f, -1.0f},
                            {211, 211, 211, false, false, 2.0315f, -4.775f},  // b·A + c·A·A
                            {157, 157, 389, true, false, 0.5f, 2.0f}};
  for (const GemmCase& c : cases) {
    const bool symmetric = c.m == c.n;
    SCOPED_TRACE(::testing::Message() << c.m << "x" << c.n << "x" << c.k << " ta " << c.ta << " tb "
                                      << c.tb << " symmetric " << symmetric);
    std::vector<float> a = Normal(c.m * c.k, 1.0f, 31), b = Normal(c.k * c.n, 1.0f, 32);
    if (symmetric && c.ta == c.tb) {  // S·S of a symmetric S
      for (int64_t i = 0; i < c.m; ++i) {
        for (int64_t j = 0; j < i; ++j) a[i * c.m + j] = a[j * c.m + i];
      }
    }
    if (symmetric) b = a;
    const std::vector<float> d0 = Normal(c.m * c.n, 1.0f, 33), c0 = Normal(c.m * c.n, 1.0f, 34);
    for (const auto& [held, precision] : {std::pair{DType::kF32, MatmulPrecision::kHighest},
                                          {DType::kF32, MatmulPrecision::kMedium},
                                          {DType::kBF16, MatmulPrecision::kMedium}}) {
      const DType dtype = held;  // named for the lambdas below (C++17 cannot capture a binding)
      SCOPED_TRACE(::testing::Message()
                   << DTypeName(dtype) << " " << MatmulPrecisionName(precision));
      auto make = [&](const Shape& shape, const std::vector<float>& values) -> Tensor {
        Tensor f32 = *Upload(shape, values);
        if (dtype == DType::kF32) return f32;
        Tensor t = *device_->Allocate(dtype, shape);
        EXPECT_TRUE(device_->Convert(f32, t).ok());
        return t;
      };
      auto read = [&](const Tensor& t) {
        Tensor f32 = *device_->Allocate(DType::kF32, t.shape());
        EXPECT_TRUE(dtype == DType::kF32 ? device_->Copy(t, f32).ok()
                                         : device_->Convert(t, f32).ok());
        return *Download(f32);
      };
      const Tensor ta = make(c.ta ? Shape{c.k, c.m} : Shape{c.m, c.k}, a);
      const Tensor tb = make(c.tb ? Shape{c.n, c.k} : Shape{c.k, c.n}, b);
      const Tensor& rhs = symmetric ? ta : tb;
      const Tensor td = make({c.m, c.n}, d0);
      Tensor fused = make({c.m, c.n}, c0), apart = make({c.m, c.n}, c0);
      const GemmArgs args{precision, c.ta, c.tb, c.alpha, c.beta};
      OPTSTEP_ASSERT_OK(device_->GemmFrom(args, symmetric, ta, rhs, td, fused));
      OPTSTEP_ASSERT_OK(device_->Copy(td, apart));
      OPTSTEP_ASSERT_OK(symmetric ? device_->matrix().SymmetricGemm(args, ta, rhs, apart)
                                  : device_->matrix().Gemm(args, ta, rhs, apart));
      const std::vector<float> got = read(fused), want = read(apart);
      for (size_t i = 0; i < got.size(); ++i) {
        ASSERT_EQ(std::memcmp(&got[i], &want[i], sizeof(float)), 0)
            << "element " << i << ": " << got[i] << " from d, " << want[i] << " after the copy";
      }
    }
  }
  OPTSTEP_ASSERT_OK_AND_ASSIGN(Tensor a, device_->Allocate(DType::kF32, {4, 4}));
  OPTSTEP_ASSERT_OK_AND_ASSIGN(Tensor d, device_->Allocate(DType::kF32, {2, 8}));
  OPTSTEP_ASSERT_OK_AND_ASSIGN(Tensor c, device_->Allocate(DType::kF32, {4, 4}));
  EXPECT_THAT(device_->GemmFrom({}, false, a, a, d, c),
              StatusIs(kInvalid, "GemmFrom: d must have c's shape and dtype, got [2, 8] fp32"));
}

TEST_P(DeviceConformanceTest, GemmRefusesBadArguments) {
  OPTSTEP_ASSERT_OK_AND_ASSIGN(Tensor a, device_->Allocate(DType::kF32, {4, 3}));
  OPTSTEP_ASSERT_OK_AND_ASSIGN(Tensor b, device_->Allocate(DType::kF32, {5, 2}));
  OPTSTEP_ASSERT_OK_AND_ASSIGN(Tensor c, device_->Allocate(DType::kF32, {4, 2}));
  OPTSTEP_ASSERT_OK_AND_ASSIGN(Tensor v, device_->Allocate(DType::kF32, {8}));
  OPTSTEP_ASSERT_OK_AND_ASSIGN(Tensor h, device_->Allocate(DType::kBF16, {3, 2}));
  OPTSTEP_ASSERT_OK_AND_ASSIGN(Tensor sq, device_->Allocate(DType::kF32, {4, 4}));
  EXPECT_THAT(device_->matrix().Gemm({}, a, b, c),
              StatusIs(kInvalid, "Gemm: op(a) is [4, 3] but op(b) is [5, 2]"));
  EXPECT_THAT(device_->matrix().Gemm({}, a, v, c), StatusIs(kInvalid, "Gemm: b must be a matrix"));
  EXPECT_THAT(device_->matrix().Gemm({}, a, h, c), StatusIs(kInvalid, "all fp32 or all bf16"));
  EXPECT_THAT(device_->matrix().Gemm({MatmulPrecision::kMedium, true, false, 1.0f, 0.0f}, a, sq, c),
              StatusIs(kInvalid, "c has shape [4, 2], expected [3, 4]"));
  EXPECT_THAT(
      device_->matrix().Gemm({MatmulPrecision::kHighest, false, true, 1.0f, 0.0f}, sq, sq, sq),
      StatusIs(kInvalid, "c and a are the same tensor"));
  OPTSTEP_ASSERT_OK_AND_ASSIGN(Tensor h1, device_->Allocate(DType::kBF16, {2, 2}));
  OPTSTEP_ASSERT_OK_AND_ASSIGN(Tensor h2, device_->Allocate(DType::kBF16, {2, 2}));
  OPTSTEP_ASSERT_OK_AND_ASSIGN(Tensor h3, device_->Allocate(DType::kBF16, {2, 2}));
  EXPECT_THAT(
      device_->matrix().Gemm({MatmulPrecision::kHigh, false, false, 1.0f, 0.0f}, h1, h2, h3),
      StatusIs(kInvalid, "bf16 matrices need precision medium, got high"));
}

TEST_P(DeviceConformanceTest, ConvertRoundsToNearestEven) {
  std::vector<float> x = Normal(4099, 10.0f, 4);
  x[0] = 1.0f + 1.0f / 256;  // a tie: even is 1.0
  x[1] = 65504.0f * 4;       // out of fp16 range
  OPTSTEP_ASSERT_OK_AND_ASSIGN(Tensor f, Upload(x));
  for (DType dtype : {DType::kBF16, DType::kF16}) {
    OPTSTEP_ASSERT_OK_AND_ASSIGN(Tensor h, device_->Allocate(dtype, {4099}));
    OPTSTEP_ASSERT_OK_AND_ASSIGN(Tensor back, device_->Allocate(DType::kF32, {4099}));
    OPTSTEP_ASSERT_OK(device_->Convert(f, h));
    OPTSTEP_ASSERT_OK(device_->Convert(h, back));
    std::vector<float> want(x.size());
    for (size_t i = 0; i < x.size(); ++i) {
      want[i] = dtype == DType::kBF16 ? Bf16(x[i]) : math::Fp16ToFloat(math::FloatToFp16(x[i]));
    }
    EXPECT_THAT(*Download(back), ElementsAreArray(want)) << DTypeName(dtype);
  }
  EXPECT_EQ(Bf16(x[0]), 1.0f);
  OPTSTEP_ASSERT_OK_AND_ASSIGN(Tensor h, device_->Allocate(DType::kBF16, {4099}));
  OPTSTEP_ASSERT_OK_AND_ASSIGN(Tensor h2, device_->Allocate(DType::kF16, {4099}));
  OPTSTEP_ASSERT_OK_AND_ASSIGN(Tensor f2, device_->Allocate(DType::kF32, {4098}));
  EXPECT_THAT(device_->Convert(h, h2),
              StatusIs(kInvalid, "Convert: bf16 to fp16; one side must be fp32"));
  EXPECT_THAT(device_->Convert(f, f2), StatusIs(kInvalid, "Convert: dst has 4098 elements"));
}

TEST_P(DeviceConformanceTest, TransposeIsExact) {
  for (auto [rows, cols] : {std::pair<int64_t, int64_t>{1, 1}, {33, 65}, {64, 32}, {300, 7}}) {
    const std::vector<float> x = Normal(rows * cols, 1.0f, 5);
    OPTSTEP_ASSERT_OK_AND_ASSIGN(Tensor src, Upload({rows, cols}, x));
    OPTSTEP_ASSERT_OK_AND_ASSIGN(Tensor dst, device_->Allocate(DType::kF32, {cols, rows}));
    OPTSTEP_ASSERT_OK(device_->matrix().Transpose(src, dst));
    std::vector<float> want(x.size());
    for (int64_t i = 0; i < rows; ++i) {
      for (int64_t j = 0; j < cols; ++j) want[j * rows + i] = x[i * cols + j];
    }
    EXPECT_THAT(*Download(dst), ElementsAreArray(want)) << rows << "x" << cols;
  }
  OPTSTEP_ASSERT_OK_AND_ASSIGN(Tensor a, device_->Allocate(DType::kF32, {3, 4}));
  OPTSTEP_ASSERT_OK_AND_ASSIGN(Tensor b, device_->Allocate(DType::kF32, {3, 4}));
  EXPECT_THAT(device_->matrix().Transpose(a, b),
              StatusIs(kInvalid, "Transpose: dst has shape [3, 4], expected [4, 3]"));
}

TEST_P(DeviceConformanceTest, CopyRowBlocksGathersAndScattersQkvRows) {
  // 3 groups of [q 4 | k 2 | v 2] rows, 5 columns: gather K, scatter it back into zeros.
  const int64_t groups = 3, per = 8, cols = 5;
  const std::vector<float> x = Normal(groups * per * cols, 1.0f, 6);
  OPTSTEP_ASSERT_OK_AND_ASSIGN(Tensor src, Upload({groups * per, cols}, x));
  OPTSTEP_ASSERT_OK_AND_ASSIGN(Tensor k, device_->Allocate(DType::kF32, {groups * 2, cols}));
  OPTSTEP_ASSERT_OK(device_->matrix().CopyRowBlocks({groups, 2, 4, per, 0, 2}, src, k));
  std::vector<float> want;
  for (int64_t g = 0; g < groups; ++g) {
    want.insert(want.end(), x.begin() + (g * per + 4) * cols, x.begin() + (g * per + 6) * cols);
  }
  EXPECT_THAT(*Download(k), ElementsAreArray(want));
  OPTSTEP_ASSERT_OK_AND_ASSIGN(Tensor back, device_->Allocate(DType::kF32, {groups * per, cols}));
  OPTSTEP_ASSERT_OK(device_->matrix().CopyRowBlocks({groups, 2, 0, 2, 4, per}, k, back));
  std::vector<float> scattered(x.size(), 0.0f);
  for (int64_t g = 0; g < groups; ++g) {
    std::copy(x.begin() + (g * per + 4) * cols, x.begin() + (g * per + 6) * cols,
              scattered.begin() + (g * per + 4) * cols);
  }
  EXPECT_THAT(*Download(back), ElementsAreArray(scattered));
  EXPECT_THAT(
      device_->matrix().CopyRowBlocks({groups, 2, 4, per, 1, 2}, src, k),
      StatusIs(kInvalid, "3 blocks of 2 rows from dst row 1 with stride 2 exceed its 6 rows"));
  EXPECT_THAT(device_->matrix().CopyRowBlocks({groups, 2, 0, 1, 0, 2}, src, k),
              StatusIs(kInvalid, "src blocks of 2 rows with stride 1 overlap"));
}

TEST_P(DeviceConformanceTest, AxisDotAndAxisScale) {
  const int64_t rows = 37, cols = 70;
  const std::vector<float> a = Normal(rows * cols, 1.0f, 7), b = Normal(rows * cols, 1.0f, 8);
  OPTSTEP_ASSERT_OK_AND_ASSIGN(Tensor ta, Upload({rows, cols}, a));
  OPTSTEP_ASSERT_OK_AND_ASSIGN(Tensor tb, Upload({rows, cols}, b));
  for (bool per_row : {true, false}) {
    const Shape shape = per_row ? Shape{rows, 1} : Shape{1, cols};
    OPTSTEP_ASSERT_OK_AND_ASSIGN(Tensor out, device_->Allocate(DType::kF32, shape));
    OPTSTEP_ASSERT_OK(device_->matrix().AxisDot(ta, tb, out));
    const std::vector<float> got = *Download(out);
    for (int64_t k = 0; k < (per_row ? rows : cols); ++k) {
      double sum = 0.0, abs = 0.0;
      for (int64_t j = 0; j < (per_row ? cols : rows); ++j) {
        const int64_t i = per_row ? k * cols + j : j * cols + k;
        sum += static_cast<double>(a[i]) * b[i];
        abs += std::fabs(static_cast<double>(a[i]) * b[i]);
      }
      EXPECT_NEAR(got[k], sum, 1e-7 * abs + 1e-7 * std::fabs(sum)) << k;
    }
    // AxisScale: exact products, broadcast along the same axis.
    const std::vector<float> v = Uniform(per_row ? rows : cols, -2.0f, 2.0f, 9);
    OPTSTEP_ASSERT_OK_AND_ASSIGN(Tensor tv, Upload(shape, v));
    OPTSTEP_ASSERT_OK_AND_ASSIGN(Tensor x, Upload({rows, cols}, a));
    OPTSTEP_ASSERT_OK(device_->matrix().AxisScale(tv, x));
    std::vector<float> want(a.size());
    for (int64_t i = 0; i < rows; ++i) {
      for (int64_t j = 0; j < cols; ++j) want[i * cols + j] = a[i * cols + j] * v[per_row ? i : j];
    }
    EXPECT_THAT(*Download(x), ElementsAreArray(want));
  }
  OPTSTEP_ASSERT_OK_AND_ASSIGN(Tensor bad, device_->Allocate(DType::kF32, {rows}));
  EXPECT_THAT(device_->matrix().AxisDot(ta, tb, bad),
              StatusIs(kInvalid,
                       "AxisDot: out has shape [37]; a [37, 70] matrix needs [37, 1] or [1, 70]"));
  EXPECT_THAT(device_->matrix().AxisScale(bad, ta),
              StatusIs(kInvalid, "AxisScale: v has shape [37]"));
}

TEST_P(DeviceConformanceTest, PermuteRowsAndColumns) {
  const int64_t rows = 5, cols = 4;
  const std::vector<float> x = Normal(rows * cols, 1.0f, 10);
  OPTSTEP_ASSERT_OK_AND_ASSIGN(Tensor src, Upload({rows, cols}, x));
  OPTSTEP_ASSERT_OK_AND_ASSIGN(Tensor dst, device_->Allocate(DType::kF32, {rows, cols}));
  const std::vector<int64_t> row_perm = {3, 0, 4, 1, 2}, col_perm = {2, 3, 1, 0};
  OPTSTEP_ASSERT_OK(device_->matrix().Permute(src, 0, row_perm, dst));
  std::vector<float> want(x.size());
  for (int64_t i = 0; i < rows; ++i) {
    for (int64_t j = 0; j < cols; ++j) want[i * cols + j] = x[row_perm[i] * cols + j];
  }
  EXPECT_THAT(*Download(dst), ElementsAreArray(want));
  OPTSTEP_ASSERT_OK(device_->matrix().Permute(src, 1, col_perm, dst));
  for (int64_t i = 0; i < rows; ++i) {
    for (int64_t j = 0; j < cols; ++j) want[i * cols + j] = x[i * cols + col_perm[j]];
  }
  EXPECT_THAT(*Download(dst), ElementsAreArray(want));
  EXPECT_THAT(device_->matrix().Permute(src, 1, {0, 1, 1, 2}, dst),
              StatusIs(kInvalid, "Permute: perm is not a permutation of [0, 4): entry 1"));
  EXPECT_THAT(device_->matrix().Permute(src, 2, col_perm, dst), StatusIs(kInvalid, "axis 2"));
}

// Q diag(λ) Qᵀ for the columns of q.
std::vector<double> Reconstruct(const std::vector<float>& q, const std::vector<float>& lambda,
                                int64_t n) {
  std::vector<double> out(n * n, 0.0);
  for (int64_t i = 0; i < n; ++i) {
    for (int64_t j = 0; j < n; ++j) {
      for (int64_t k = 0; k < n; ++k) out[i * n + j] += q[i * n + k] * lambda[k] * q[j * n + k];
    }
  }
  return out;
}

double OrthonormalityError(const std::vector<float>& q, int64_t rows, int64_t cols) {
  double worst = 0.0;
  for (int64_t a = 0; a < cols; ++a) {
    for (int64_t b = 0; b < cols; ++b) {
      double dot = 0.0;
      for (int64_t i = 0; i < rows; ++i)
        dot += static_cast<double>(q[i * cols + a]) * q[i * cols + b];
      worst = std::max(worst, std::fabs(dot - (a == b ? 1.0 : 0.0)));
    }
  }
  return worst;
}

TEST_P(DeviceConformanceTest, SymmetricEighGivesDescendingOrthonormalEigenvectors) {
  const int64_t n = 37;
  const std::vector<float> r = Normal(n * n, 1.0f, 11);
  std::vector<float> a(n * n);
  double norm = 0.0;
  for (int64_t i = 0; i < n; ++i) {
    for (int64_t j = 0; j < n; ++j) {
      double s = 0.0;
      for (int64_t k = 0; k < n; ++k) s += static_cast<double>(r[i * n + k]) * r[j * n + k];
      a[i * n + j] = static_cast<float>(s);
    }
  }
  for (int64_t i = 0; i < n; ++i) {
    for (int64_t j = 0; j < i; ++j) a[i * n + j] = a[j * n + i];  // exactly symmetric
  }
  for (float x : a) norm += static_cast<double>(x) * x;
  norm = std::sqrt(norm);
  OPTSTEP_ASSERT_OK_AND_ASSIGN(Tensor ta, Upload({n, n}, a));
  OPTSTEP_ASSERT_OK_AND_ASSIGN(Tensor values, device_->Allocate(DType::kF32, {n}));
  OPTSTEP_ASSERT_OK_AND_ASSIGN(Tensor vectors, device_->Allocate(DType::kF32, {n, n}));
  OPTSTEP_ASSERT_OK(device_->matrix().SymmetricEigh(ta, 1e-7f, values, vectors));
  const std::vector<float> q = *Download(vectors);
  const std::vector<float> lambda = *Download(values);
  EXPECT_LE(OrthonormalityError(q, n, n), 1e-5);
  for (int64_t i = 1; i < n; ++i) EXPECT_GE(lambda[i - 1], lambda[i]);
  const std::vector<double> back = Reconstruct(q, lambda, n);
  for (int64_t i = 0; i < n * n; ++i) ASSERT_NEAR(back[i], a[i], 1e-4 * norm) << i;
  // Exactly diagonal (with ties): no solver, identity columns in stable descending order.
  std::vector<float> d(16, 0.0f);
  const float diag[4] = {1.0f, 3.0f, 1.0f, 3.0f};
  for (int i = 0; i < 4; ++i) d[i * 4 + i] = diag[i];
  OPTSTEP_ASSERT_OK_AND_ASSIGN(Tensor td, Upload({4, 4}, d));
  OPTSTEP_ASSERT_OK_AND_ASSIGN(Tensor dv, device_->Allocate(DType::kF32, {4}));
  OPTSTEP_ASSERT_OK_AND_ASSIGN(Tensor dq, device_->Allocate(DType::kF32, {4, 4}));
  OPTSTEP_ASSERT_OK(device_->matrix().SymmetricEigh(td, 1e-7f, dv, dq));
  EXPECT_THAT(*Download(dv), ElementsAreArray({3.0f, 3.0f, 1.0f, 1.0f}));
  // Columns: e1, e3, e0, e2.
  EXPECT_THAT(*Download(dq), ElementsAreArray({0, 0, 1, 0, 1, 0, 0, 0, 0, 0, 0, 1, 0, 1, 0, 0}));
  OPTSTEP_ASSERT_OK_AND_ASSIGN(Tensor rect, device_->Allocate(DType::kF32, {4, 3}));
  EXPECT_THAT(device_->matrix().SymmetricEigh(rect, 0.0f, dv, dq),
              StatusIs(kInvalid, "SymmetricEigh: a must be square, got shape [4, 3]"));
  EXPECT_THAT(device_->matrix().SymmetricEigh(td, 0.0f, dv, td), StatusIs(kInvalid, "same tensor"));
}

TEST_P(DeviceConformanceTest, QrGivesAnOrthonormalFactor) {
  for (auto [m, n] : {std::pair<int64_t, int64_t>{40, 25}, {16, 16}, {1, 1}}) {
    SCOPED_TRACE(::testing::Message() << m << "x" << n);
    const std::vector<float> a = Normal(m * n, 1.0f, 12);
    OPTSTEP_ASSERT_OK_AND_ASSIGN(Tensor ta, Upload({m, n}, a));
    OPTSTEP_ASSERT_OK_AND_ASSIGN(Tensor tq, device_->Allocate(DType::kF32, {m, n}));
    OPTSTEP_ASSERT_OK(device_->matrix().Qr(ta, tq));
    const std::vector<float> q = *Download(tq);
    EXPECT_LE(OrthonormalityError(q, m, n), 1e-5);
    // R = Qᵀ·A is upper triangular and Q·R = A.
    std::vector<double> r(n * n, 0.0);
    for (int64_t i = 0; i < n; ++i) {
      for (int64_t j = 0; j < n; ++j) {
        for (int64_t k = 0; k < m; ++k)
          r[i * n + j] += static_cast<double>(q[k * n + i]) * a[k * n + j];
      }
    }
    for (int64_t i = 0; i < n; ++i) {
      for (int64_t j = 0; j < i; ++j) EXPECT_NEAR(r[i * n + j], 0.0, 1e-4) << i << "," << j;
    }
    for (int64_t i = 0; i < m; ++i) {
      for (int64_t j = 0; j < n; ++j) {
        double s = 0.0;
        for (int64_t k = 0; k < n; ++k) s += q[i * n + k] * r[k * n + j];
        ASSERT_NEAR(s, a[i * n + j], 1e-4);
      }
    }
  }
  OPTSTEP_ASSERT_OK_AND_ASSIGN(Tensor wide, device_->Allocate(DType::kF32, {3, 5}));
  OPTSTEP_ASSERT_OK_AND_ASSIGN(Tensor q, device_->Allocate(DType::kF32, {3, 5}));
  EXPECT_THAT(
      device_->matrix().Qr(wide, q),
      StatusIs(kInvalid, "Qr: a must have at least as many rows as columns, got shape [3, 5]"));
}

}  // namespace
}  // namespace testing_internal
}  // namespace optstep
