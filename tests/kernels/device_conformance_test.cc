// Device conformance, part 1: memory, transfers and conversions, Copy/Add/Scale, gradient
// statistics. Part 2 (optimizer updates) is device_conformance_update_test.cc.

#include "tests/kernels/device_conformance.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "absl/status/status.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "kernels/device.h"
#include "kernels/dtype.h"
#include "kernels/math/half.h"
#include "kernels/tensor.h"
#include "tests/testing/status_matchers.h"

namespace optstep {
namespace testing_internal {

void DeviceConformanceTest::SetUp() {
  absl::StatusOr<std::unique_ptr<Device>> device = GetParam().create(0);
  ASSERT_TRUE(device.ok()) << "cannot create the " << GetParam().name
                           << " device: " << device.status();
  device_ = *std::move(device);
}

absl::StatusOr<Tensor> DeviceConformanceTest::Upload(const std::vector<float>& values) {
  return Upload(*device_, values);
}

absl::StatusOr<Tensor> DeviceConformanceTest::Upload(const Shape& shape,
                                                     const std::vector<float>& values) {
  OPTSTEP_ASSIGN_OR_RETURN(Tensor t, device_->Allocate(DType::kF32, shape));
  if (static_cast<int64_t>(values.size()) != t.numel()) {
    return absl::InvalidArgumentError("Upload: value count does not match the shape");
  }
  OPTSTEP_RETURN_IF_ERROR(device_->CopyFromHost(values.data(), DType::kF32, t.numel(), t, 0));
  return t;
}

absl::StatusOr<Tensor> DeviceConformanceTest::Upload(Device& device,
                                                     const std::vector<float>& values) {
  const int64_t n = static_cast<int64_t>(values.size());
  OPTSTEP_ASSIGN_OR_RETURN(Tensor t, device.Allocate(DType::kF32, {n}));
  OPTSTEP_RETURN_IF_ERROR(device.CopyFromHost(values.data(), DType::kF32, n, t, 0));
  return t;
}

absl::StatusOr<std::vector<float>> DeviceConformanceTest::Download(const Tensor& t) {
  return Download(*device_, t);
}

absl::StatusOr<std::vector<float>> DeviceConformanceTest::Download(Device& device,
                                                                   const Tensor& t) {
  std::vector<float> out(t.numel());
  OPTSTEP_RETURN_IF_ERROR(device.CopyToHost(t, 0, t.numel(), DType::kF32, out.data()));
  return out;
}

std::vector<float> DeviceConformanceTest::Uniform(int64_t n, float lo, float hi, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> dist(lo, hi);
  std::vector<float> v(n);
  for (float& x : v) x = dist(rng);
  return v;
}

std::vector<float> DeviceConformanceTest::Normal(int64_t n, float scale, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> dist(0.0f, scale);
  std::vector<float> v(n);
  for (float& x : v) x = dist(rng);
  return v;
}

std::vector<float> DeviceConformanceTest::Integers(int64_t n, int lo, int hi, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_int_distribution<int> dist(lo, hi);
  std::vector<float> v(n);
  for (float& x : v) x = static_cast<float>(dist(rng));
  return v;
}

namespace {

using ::optstep::testutil::IsOk;
using ::optstep::testutil::StatusIs;
using ::testing::Each;
using ::testing::ElementsAreArray;
using ::testing::Eq;
using ::testing::HasSubstr;
using ::testing::StartsWith;

constexpr absl::StatusCode kInvalid = absl::StatusCode::kInvalidArgument;
constexpr DType kAllDTypes[] = {DType::kF32, DType::kBF16, DType::kF16};

uint32_t Bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, sizeof(u));
  return u;
}

TEST_P(DeviceConformanceTest, NameIsStable) {
  EXPECT_THAT(device_->name(), ::testing::AnyOf(Eq("cpu"), StartsWith("cuda:")));
}

TEST_P(DeviceConformanceTest, AllocateGivesZeroedTensorsAndCountsBytes) {
  const int64_t before = device_->allocated_bytes();
  for (DType dtype : kAllDTypes) {
    for (const Shape& shape : std::vector<Shape>{{}, {0}, {1}, {7}, {3, 5}, {4097}, {2, 0, 3}}) {
      OPTSTEP_ASSERT_OK_AND_ASSIGN(Tensor t, device_->Allocate(dtype, shape));
      EXPECT_TRUE(t.defined());
      EXPECT_EQ(t.dtype(), dtype);
      EXPECT_EQ(t.shape(), shape);
      EXPECT_EQ(t.numel(), NumElements(shape));
      EXPECT_EQ(device_->allocated_bytes(), before + static_cast<int64_t>(t.bytes()));
    }
    EXPECT_EQ(device_->allocated_bytes(), before);
  }
  // Memory handed back dirty must come back zeroed.
  for (int round = 0; round < 3; ++round) {
    OPTSTEP_ASSERT_OK_AND_ASSIGN(Tensor t, device_->Allocate(DType::kF32, {65540}));
    OPTSTEP_ASSERT_OK_AND_ASSIGN(std::vector<float> host, Download(t));
    ASSERT_THAT(host, Each(Eq(0.0f))) << "round " << round;
    std::vector<float> junk(65540, -3.5f);
    OPTSTEP_ASSERT_OK(device_->CopyFromHost(junk.data(), DType::kF32, 65540, t, 0));
  }
}

TEST_P(DeviceConformanceTest, AllocateRejectsBadShapes) {
  EXPECT_THAT(device_->Allocate(DType::kF32, {4, -1}),
              StatusIs(kInvalid, "shape [4, -1] has a negative dimension"));
  EXPECT_THAT(device_->Allocate(DType::kF32, {int64_t{1} << 40, int64_t{1} << 40}),
              StatusIs(kInvalid, "more than 2^63 elements"));
  EXPECT_THAT(device_->Allocate(DType::kF32, {int64_t{1} << 62}),
              StatusIs(kInvalid, "exceeds 2^63 bytes"));
  EXPECT_THAT(device_->Allocate(static_cast<DType>(9), {4}), StatusIs(kInvalid, "dtype 9"));
  // 4 PiB: representable, never available.
  EXPECT_THAT(device_->Allocate(DType::kF32, {int64_t{1} << 50}),
              StatusIs(absl::StatusCode::kResourceExhausted));
  EXPECT_EQ(device_->allocated_bytes(), 0);
}

TEST_P(DeviceConformanceTest, ZeroClearsEveryDtype) {
  OPTSTEP_ASSERT_OK_AND_ASSIGN(Tensor t, Upload(Uniform(4097, 1.0f, 2.0f, 1)));
  OPTSTEP_ASSERT_OK(device_->Zero(t));
  OPTSTEP_ASSERT_OK_AND_ASSIGN(std::vector<float> host, Download(t));
  EXPECT_THAT(host, Each(Eq(0.0f)));
  Tensor empty;
  EXPECT_THAT(device_->Zero(empty), StatusIs(kInvalid, "not allocated"));
}

// fp32 -> device -> each dtype, and each dtype's bit patterns -> device -> the same bits.
TEST_P(DeviceConformanceTest, TransfersRoundTripEveryDtype) {
  for (int64_t n : ConformanceSizes()) {
    const std::vector<float> values = Normal(n, 100.0f, 7);
    OPTSTEP_ASSERT_OK_AND_ASSIGN(Tensor t, Upload(values));
    for (DType dtype : kAllDTypes) {
      SCOPED_TRACE(DTypeName(dtype));
      std::vector<uint16_t> half(n);
      if (dtype == DType::kF32) {
        std::vector<float> back(n);
        OPTSTEP_ASSERT_OK(device_->CopyToHost(t, 0, n, DType::kF32, back.data()));
        ASSERT_EQ(std::memcmp(back.data(), values.data(), n * sizeof(float)), 0);
        continue;
      }
      OPTSTEP_ASSERT_OK(device_->CopyToHost(t, 0, n, dtype, half.data()));
      for (int64_t i = 0; i < n; ++i) {
        const uint16_t want =
            dtype == DType::kBF16 ? math::FloatToBf16(values[i]) : math::FloatToFp16(values[i]);
        ASSERT_EQ(half[i], want) << "element " << i << " = " << values[i];
      }
      // Back up: every half value is exact in fp32, so a second round trip is the identity.
      OPTSTEP_ASSERT_OK_AND_ASSIGN(Tensor u, device_->Allocate(DType::kF32, {n}));
      OPTSTEP_ASSERT_OK(device_->CopyFromHost(half.data(), dtype, n, u, 0));
      std::vector<uint16_t> again(n);
      OPTSTEP_ASSERT_OK(device_->CopyToHost(u, 0, n, dtype, again.data()));
      ASSERT_EQ(again, half);
      OPTSTEP_ASSERT_OK_AND_ASSIGN(std::vector<float> up, Download(u));
      for (int64_t i = 0; i < n; ++i) {
        const float want =
            dtype == DType::kBF16 ? math::Bf16ToFloat(half[i]) : math::Fp16ToFloat(half[i]);
        ASSERT_EQ(Bits(up[i]), Bits(want)) << "element " << i;
      }
    }
  }
}

TEST_P(DeviceConformanceTest, TransfersKeepSpecialValuesAndHonourOffsets) {
  const float inf = std::numeric_limits<float>::infinity();
  const std::vector<float> special = {0.0f, -0.0f, inf, -inf, std::nanf(""), 1e-45f, -1e38f};
  OPTSTEP_ASSERT_OK_AND_ASSIGN(Tensor t, device_->Allocate(DType::kF32, {20}));
  OPTSTEP_ASSERT_OK(device_->CopyFromHost(special.data(), DType::kF32, 7, t, 11));
  OPTSTEP_ASSERT_OK_AND_ASSIGN(std::vector<float> host, Download(t));
  for (int i = 0; i < 20; ++i) {
    const float want = (i >= 11 && i < 18) ? special[i - 11] : 0.0f;
    EXPECT_EQ(Bits(host[i]), Bits(want)) << "element " << i;
  }
  std::vector<float> middle(3);
  OPTSTEP_ASSERT_OK(device_->CopyToHost(t, 12, 3, DType::kF32, middle.data()));
  EXPECT_EQ(Bits(middle[0]), Bits(-0.0f));
  EXPECT_EQ(middle[1], inf);
  EXPECT_EQ(middle[2], -inf);
  // Zero-length transfers are valid anywhere in [0, numel], even with a null host pointer.
  OPTSTEP_EXPECT_OK(device_->CopyFromHost(nullptr, DType::kBF16, 0, t, 20));
  OPTSTEP_EXPECT_OK(device_->CopyToHost(t, 20, 0, DType::kF16, nullptr));
}

// Host buffers need not be aligned: gRPC hands out bytes at any offset.
TEST_P(DeviceConformanceTest, TransfersAcceptMisalignedHostBuffers) {
  const int64_t n = 40000;
  const std::vector<float> values = Normal(n, 3.0f, 9);
  for (DType dtype : kAllDTypes) {
    SCOPED_TRACE(DTypeName(dtype));
    const size_t es = DTypeSize(dtype);
    std::vector<char> bytes(n * es + 1);
    OPTSTEP_ASSERT_OK_AND_ASSIGN(Tensor t, Upload(values));
    OPTSTEP_ASSERT_OK(device_->CopyToHost(t, 0, n, dtype, bytes.data() + 1));
    OPTSTEP_ASSERT_OK_AND_ASSIGN(Tensor u, device_->Allocate(DType::kF32, {n}));
    OPTSTEP_ASSERT_OK(device_->CopyFromHost(bytes.data() + 1, dtype, n, u, 0));
    std::vector<char> again(n * es + 3);
    OPTSTEP_ASSERT_OK(device_->CopyToHost(u, 0, n, dtype, again.data() + 3));
    ASSERT_EQ(std::memcmp(again.data() + 3, bytes.data() + 1, n * es), 0);
  }
}

// AddFromHost is CopyFromHost into a scratch tensor followed by Add, bit for bit, at any
// offset and host alignment; the elements outside the range stay as they were.
TEST_P(DeviceConformanceTest, AddFromHostAddsTheConvertedElements) {
  const int64_t n = 300000;  // several bounce blocks and parallel ranges
  const int64_t offset = 17, count = n - 40;
  const std::vector<float> base = Normal(n, 2.0f, 21);
  const std::vector<float> values = Normal(count, 5.0f, 22);
  for (DType dtype : kAllDTypes) {
    SCOPED_TRACE(DTypeName(dtype));
    const size_t es = DTypeSize(dtype);
    OPTSTEP_ASSERT_OK_AND_ASSIGN(Tensor source, Upload(values));
    std::vector<char> bytes(count * es + 1);
    OPTSTEP_ASSERT_OK(device_->CopyToHost(source, 0, count, dtype, bytes.data() + 1));
    // Reference: the converted values in a tensor of their own, added with Add.
    OPTSTEP_ASSERT_OK_AND_ASSIGN(Tensor converted, device_->Allocate(DType::kF32, {n}));
    OPTSTEP_ASSERT_OK(device_->CopyFromHost(bytes.data() + 1, dtype, count, converted, offset));
    OPTSTEP_ASSERT_OK_AND_ASSIGN(Tensor want, Upload(base));
    OPTSTEP_ASSERT_OK(device_->Add(converted, want));
    OPTSTEP_ASSERT_OK_AND_ASSIGN(Tensor got, Upload(base));
    OPTSTEP_ASSERT_OK(device_->AddFromHost(bytes.data() + 1, dtype, count, got, offset));
    OPTSTEP_ASSERT_OK_AND_ASSIGN(std::vector<float> w, Download(want));
    OPTSTEP_ASSERT_OK_AND_ASSIGN(std::vector<float> g, Download(got));
    for (int64_t i = 0; i < n; ++i) ASSERT_EQ(Bits(g[i]), Bits(w[i])) << "element " << i;
    EXPECT_EQ(Bits(g[0]), Bits(base[0]));
    EXPECT_EQ(Bits(g[n - 1]), Bits(base[n - 1]));
  }
  OPTSTEP_ASSERT_OK_AND_ASSIGN(Tensor t, device_->Allocate(DType::kF32, {8}));
  std::vector<float> host(8, 1.0f);
  EXPECT_THAT(device_->AddFromHost(host.data(), DType::kF32, 8, t, 1),
              StatusIs(kInvalid, "AddFromHost: range [1, 9) exceeds tensor of 8 elements"));
  OPTSTEP_EXPECT_OK(device_->AddFromHost(nullptr, DType::kBF16, 0, t, 8));
}

TEST_P(DeviceConformanceTest, TransfersValidateRanges) {
  OPTSTEP_ASSERT_OK_AND_ASSIGN(Tensor t, Upload(std::vector<float>(4096, 2.0f)));
  std::vector<float> host(8192, 5.0f);
  EXPECT_THAT(
      device_->CopyFromHost(host.data(), DType::kF32, 4096, t, 4096),
      StatusIs(kInvalid, "CopyFromHost: range [4096, 8192) exceeds tensor of 4096 elements"));
  EXPECT_THAT(device_->CopyFromHost(host.data(), DType::kF32, 4097, t, 0),
              StatusIs(kInvalid, "CopyFromHost: range [0, 4097) exceeds tensor of 4096 elements"));
  EXPECT_THAT(device_->CopyFromHost(host.data(), DType::kF32, 1, t, 4096),
              StatusIs(kInvalid, "range [4096, 4097)"));
  EXPECT_THAT(
      device_->CopyFromHost(host.data(), DType::kF32, 2, t, std::numeric_limits<int64_t>::max()),
      StatusIs(kInvalid, "range [9223372036854775807, 9223372036854775809)"));
  EXPECT_THAT(device_->CopyFromHost(host.data(), DType::kF32, 4, t, -1),
              StatusIs(kInvalid, "CopyFromHost: negative offset -1 or count 4"));
  EXPECT_THAT(device_->CopyFromHost(host.data(), DType::kF32, -4, t, 0),
              StatusIs(kInvalid, "negative offset 0 or count -4"));
  EXPECT_THAT(device_->CopyFromHost(nullptr, DType::kF32, 4, t, 0),
              StatusIs(kInvalid, "null host pointer for 4 elements"));
  EXPECT_THAT(device_->CopyFromHost(host.data(), static_cast<DType>(7), 4, t, 0),
              StatusIs(kInvalid, "unknown host dtype 7"));
  EXPECT_THAT(device_->CopyToHost(t, 4000, 100, DType::kBF16, host.data()),
              StatusIs(kInvalid, "CopyToHost: range [4000, 4100) exceeds tensor of 4096 elements"));
  EXPECT_THAT(device_->CopyToHost(t, -2, 1, DType::kF32, host.data()),
              StatusIs(kInvalid, "CopyToHost: negative offset -2"));
  EXPECT_THAT(device_->CopyToHost(t, 0, 1, DType::kF32, nullptr),
              StatusIs(kInvalid, "CopyToHost: null host pointer"));
  // Device tensors must be fp32.
  OPTSTEP_ASSERT_OK_AND_ASSIGN(Tensor half, device_->Allocate(DType::kBF16, {8}));
  EXPECT_THAT(device_->CopyFromHost(host.data(), DType::kF32, 8, half, 0),
              StatusIs(kInvalid, "CopyFromHost: device tensor is bf16; this operation needs fp32"));
  EXPECT_THAT(device_->CopyToHost(half, 0, 8, DType::kBF16, host.data()),
              StatusIs(kInvalid, "device tensor is bf16"));
  // No side effects: the tensor and the host buffer are untouched.
  OPTSTEP_ASSERT_OK_AND_ASSIGN(std::vector<float> after, Download(t));
  EXPECT_THAT(after, Each(Eq(2.0f)));
  EXPECT_THAT(host, Each(Eq(5.0f)));
}

TEST_P(DeviceConformanceTest, CopyAddScale) {
  for (int64_t n : ConformanceSizes()) {
    const std::vector<float> a = Integers(n, -1000, 1000, 3);
    const std::vector<float> b = Integers(n, -1000, 1000, 4);
    OPTSTEP_ASSERT_OK_AND_ASSIGN(Tensor ta, Upload(a));
    OPTSTEP_ASSERT_OK_AND_ASSIGN(Tensor tb, Upload(b));
    OPTSTEP_ASSERT_OK_AND_ASSIGN(Tensor tc, device_->Allocate(DType::kF32, {n}));
    OPTSTEP_ASSERT_OK(device_->Copy(ta, tc));
    OPTSTEP_ASSERT_OK(device_->Add(tb, tc));        // c = a + b
    OPTSTEP_ASSERT_OK(device_->Scale(-0.25f, tc));  // c = -(a + b) / 4, exact
    OPTSTEP_ASSERT_OK(device_->Add(tc, tc));        // c = 2c (src may be dst)
    OPTSTEP_ASSERT_OK(device_->Synchronize());
    OPTSTEP_ASSERT_OK_AND_ASSIGN(std::vector<float> c, Download(tc));
    std::vector<float> want(n);
    for (int64_t i = 0; i < n; ++i) want[i] = -(a[i] + b[i]) / 2;
    ASSERT_THAT(c, ElementsAreArray(want)) << "n = " << n;
    OPTSTEP_ASSERT_OK_AND_ASSIGN(std::vector<float> a_after, Download(ta));
    ASSERT_EQ(a_after, a);
  }
}

TEST_P(DeviceConformanceTest, CopyAddScaleValidate) {
  OPTSTEP_ASSERT_OK_AND_ASSIGN(Tensor f7, device_->Allocate(DType::kF32, {7}));
  OPTSTEP_ASSERT_OK_AND_ASSIGN(Tensor f8, device_->Allocate(DType::kF32, {8}));
  OPTSTEP_ASSERT_OK_AND_ASSIGN(Tensor h8, device_->Allocate(DType::kF16, {8}));
  OPTSTEP_ASSERT_OK_AND_ASSIGN(Tensor h8b, device_->Allocate(DType::kF16, {8}));
  Tensor none;
  EXPECT_THAT(device_->Copy(f7, f8), StatusIs(kInvalid, "Copy: dst has 8 elements but src has 7"));
  EXPECT_THAT(device_->Copy(h8, f8), StatusIs(kInvalid, "Copy: src is fp16 but dst is fp32"));
  OPTSTEP_EXPECT_OK(device_->Copy(h8, h8b));  // same dtype: any dtype copies
  EXPECT_THAT(device_->Copy(none, f8), StatusIs(kInvalid, "not allocated"));
  EXPECT_THAT(device_->Add(f7, f8), StatusIs(kInvalid, "Add: dst has 8 elements but src has 7"));
  EXPECT_THAT(device_->Add(h8, f8),
              StatusIs(kInvalid, "Add: src is fp16; this operation needs fp32"));
  EXPECT_THAT(device_->Scale(2.0f, h8), StatusIs(kInvalid, "Scale: x is fp16"));
  EXPECT_THAT(device_->Scale(2.0f, none), StatusIs(kInvalid, "Scale: x is not allocated"));
}

// Σ x² in float64 over the elements in index order: the reference.
double ReferenceSumSquares(const std::vector<float>& x) {
  double s = 0.0;
  for (float v : x) s += static_cast<double>(v) * v;
  return s;
}

TEST_P(DeviceConformanceTest, GradientStatsMatchFloat64Reference) {
  for (int64_t n :
       {int64_t{1}, int64_t{7}, int64_t{4097}, int64_t{65540}, int64_t{3} * 65536 + 5}) {
    const std::vector<float> g = Normal(n, 0.01f, static_cast<uint32_t>(n));
    OPTSTEP_ASSERT_OK_AND_ASSIGN(Tensor t, Upload(g));
    OPTSTEP_ASSERT_OK_AND_ASSIGN(GradientStats stats, device_->ComputeGradientStats(t));
    const double want = ReferenceSumSquares(g);
    EXPECT_TRUE(stats.all_finite);
    EXPECT_NEAR(stats.sum_squares, want, 1e-12 * want) << "n = " << n;
  }
  OPTSTEP_ASSERT_OK_AND_ASSIGN(Tensor empty, device_->Allocate(DType::kF32, {0}));
  OPTSTEP_ASSERT_OK_AND_ASSIGN(GradientStats stats, device_->ComputeGradientStats(empty));
  EXPECT_EQ(stats.sum_squares, 0.0);
  EXPECT_TRUE(stats.all_finite);
  // fp32's largest values square beyond fp32 but not beyond float64.
  OPTSTEP_ASSERT_OK_AND_ASSIGN(Tensor big, Upload(std::vector<float>(1000, 3e38f)));
  OPTSTEP_ASSERT_OK_AND_ASSIGN(stats, device_->ComputeGradientStats(big));
  EXPECT_TRUE(stats.all_finite);
  EXPECT_NEAR(stats.sum_squares, 1000 * 9e76, 1e-6 * 9e79);
  OPTSTEP_ASSERT_OK_AND_ASSIGN(Tensor half, device_->Allocate(DType::kBF16, {8}));
  EXPECT_THAT(device_->ComputeGradientStats(half),
              StatusIs(kInvalid, "ComputeGradientStats: grad is bf16"));
}

TEST_P(DeviceConformanceTest, GradientStatsDetectNonFinite) {
  const int64_t n = 2 * 65536 + 17;
  const float inf = std::numeric_limits<float>::infinity();
  for (float bad : {std::nanf(""), -std::nanf(""), inf, -inf}) {
    for (int64_t at : {int64_t{0}, n / 2, n - 1}) {
      std::vector<float> g = Normal(n, 1.0f, 5);
      g[at] = bad;
      OPTSTEP_ASSERT_OK_AND_ASSIGN(Tensor t, Upload(g));
      OPTSTEP_ASSERT_OK_AND_ASSIGN(GradientStats stats, device_->ComputeGradientStats(t));
      EXPECT_FALSE(stats.all_finite) << bad << " at " << at;
    }
  }
  std::vector<float> both = Normal(100, 1.0f, 6);
  both[3] = inf;
  both[50] = -inf;  // Inf + (-Inf)... of squares is still +Inf; and with a NaN it is NaN
  both[70] = std::nanf("");
  OPTSTEP_ASSERT_OK_AND_ASSIGN(Tensor t, Upload(both));
  OPTSTEP_ASSERT_OK_AND_ASSIGN(GradientStats stats, device_->ComputeGradientStats(t));
  EXPECT_FALSE(stats.all_finite);
}

// The reduction order is fixed by the data layout, so the thread count cannot change a bit.
TEST_P(DeviceConformanceTest, GradientStatsIndependentOfThreadCount) {
  const int64_t n = 5 * 65536 + 123;
  const std::vector<float> g = Normal(n, 1.0f, 11);
  double first = 0.0;
  for (int threads : {1, 2, 3, 8}) {
    OPTSTEP_ASSERT_OK_AND_ASSIGN(std::unique_ptr<Device> device, GetParam().create(threads));
    OPTSTEP_ASSERT_OK_AND_ASSIGN(Tensor t, Upload(*device, g));
    for (int repeat = 0; repeat < 2; ++repeat) {
      OPTSTEP_ASSERT_OK_AND_ASSIGN(GradientStats stats, device->ComputeGradientStats(t));
      if (threads == 1 && repeat == 0) first = stats.sum_squares;
      EXPECT_EQ(stats.sum_squares, first) << threads << " threads, repeat " << repeat;
    }
  }
  EXPECT_NEAR(first, ReferenceSumSquares(g), 1e-12 * first);
}

// The factor computed on the device is the one the host computes from ComputeGradientStats,
// bit for bit (Newton–Schulz's results must not depend on where its norm is taken).
TEST_P(DeviceConformanceTest, ScaleByInverseNormIsTheHostFactorBitForBit) {
  const float eps = 1e-7f;
  auto host_factor = [&](const Tensor& norm_of) -> absl::StatusOr<float> {
    OPTSTEP_ASSIGN_OR_RETURN(const GradientStats stats, device_->ComputeGradientStats(norm_of));
    return static_cast<float>(1.0 / std::max(std::sqrt(stats.sum_squares), double{eps}));
  };
  auto expect_scaled = [&](const Tensor& out, float factor, const std::vector<float>& x) {
    OPTSTEP_ASSERT_OK_AND_ASSIGN(const std::vector<float> got, Download(out));
    ASSERT_EQ(got.size(), x.size());
    for (size_t i = 0; i < x.size(); ++i) {
      ASSERT_EQ(Bits(got[i]), Bits(factor * x[i])) << "element " << i << " of " << x.size();
    }
  };
  for (int64_t n : {int64_t{1}, int64_t{4097}, int64_t{3} * 8192 + 5, int64_t{65540}}) {
    SCOPED_TRACE(::testing::Message() << "n = " << n);
    const std::vector<float> values = Normal(n, 0.3f, static_cast<uint32_t>(n));
    OPTSTEP_ASSERT_OK_AND_ASSIGN(Tensor x, Upload(values));
    OPTSTEP_ASSERT_OK_AND_ASSIGN(Tensor norm_of, Upload(Normal(n + 3, 2.0f, 7)));
    OPTSTEP_ASSERT_OK_AND_ASSIGN(Tensor out, device_->Allocate(DType::kF32, {n}));
    ASSERT_THAT(device_->ScaleByInverseNorm(norm_of, eps, x, out), testutil::IsOk());
    OPTSTEP_ASSERT_OK_AND_ASSIGN(const float factor, host_factor(norm_of));
    expect_scaled(out, factor, values);
    // In place, by its own norm.
    OPTSTEP_ASSERT_OK_AND_ASSIGN(const float own, host_factor(x));
    ASSERT_THAT(device_->ScaleByInverseNorm(x, eps, x, x), testutil::IsOk());
    expect_scaled(x, own, values);
  }
  // A zero norm divides by eps; a NaN in norm_of makes every element NaN, an Inf every one 0.
  const std::vector<float> values = Normal(100, 1.0f, 3);
  OPTSTEP_ASSERT_OK_AND_ASSIGN(Tensor x, Upload(values));
  OPTSTEP_ASSERT_OK_AND_ASSIGN(Tensor out, device_->Allocate(DType::kF32, {100}));
  OPTSTEP_ASSERT_OK_AND_ASSIGN(Tensor zeros, Upload(std::vector<float>(9, 0.0f)));
  ASSERT_THAT(device_->ScaleByInverseNorm(zeros, eps, x, out), testutil::IsOk());
  expect_scaled(out, static_cast<float>(1.0 / double{eps}), values);
  for (float bad : {std::nanf(""), std::numeric_limits<float>::infinity()}) {
    OPTSTEP_ASSERT_OK_AND_ASSIGN(Tensor norm_of, Upload({1.0f, bad, 2.0f}));
    ASSERT_THAT(device_->ScaleByInverseNorm(norm_of, eps, x, out), testutil::IsOk());
    OPTSTEP_ASSERT_OK_AND_ASSIGN(const std::vector<float> got, Download(out));
    for (float v : got) {
      if (std::isnan(bad)) {
        ASSERT_TRUE(std::isnan(v)) << v;
      } else {
        ASSERT_EQ(std::fabs(v), 0.0f);
      }
    }
  }
  // Errors name the operation, the argument and its value.
  OPTSTEP_ASSERT_OK_AND_ASSIGN(Tensor half, device_->Allocate(DType::kBF16, {100}));
  EXPECT_THAT(device_->ScaleByInverseNorm(x, eps, half, out),
              StatusIs(kInvalid, "ScaleByInverseNorm: x is bf16"));
  OPTSTEP_ASSERT_OK_AND_ASSIGN(Tensor short_out, device_->Allocate(DType::kF32, {99}));
  EXPECT_THAT(device_->ScaleByInverseNorm(x, eps, x, short_out),
              StatusIs(kInvalid, "ScaleByInverseNorm: out has 99 elements but x has 100"));
  EXPECT_THAT(device_->ScaleByInverseNorm(x, 0.0f, x, out),
              StatusIs(kInvalid, "ScaleByInverseNorm: eps must be finite and > 0, got 0"));
}

}  // namespace
}  // namespace testing_internal
}  // namespace optstep
