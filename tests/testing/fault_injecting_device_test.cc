// FaultInjectingDevice: without faults it is the device it wraps (the whole Device conformance
// suite runs through it); with faults it fails exactly the calls it was told to, delays and
// corrupts them, and counts every call, also from several threads.

#include "tests/testing/fault_injecting_device.h"

#include <cmath>
#include <cstdint>
#include <cstring>
#include <memory>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/time/clock.h"
#include "gtest/gtest.h"
#include "kernels/device_factory.h"
#include "tests/kernels/device_conformance.h"
#include "tests/testing/status_matchers.h"

namespace optstep {
namespace testing_internal {
namespace {

INSTANTIATE_TEST_SUITE_P(
    FaultInjecting, DeviceConformanceTest,
    ::testing::Values(DeviceFactory{
        "CpuWithoutFaults",
        [](int num_threads) -> absl::StatusOr<std::unique_ptr<Device>> {
          DeviceOptions options;
          options.num_threads = num_threads;
          absl::StatusOr<std::unique_ptr<Device>> cpu = CreateDevice(options);
          if (!cpu.ok()) return cpu.status();
          return std::unique_ptr<Device>(
              std::make_unique<testutil::FaultInjectingDevice>(*std::move(cpu)));
        }}),
    [](const ::testing::TestParamInfo<DeviceFactory>& info) { return info.param.name; });

}  // namespace
}  // namespace testing_internal

namespace testutil {
namespace {

class FaultInjectingDeviceTest : public ::testing::Test {
 protected:
  void SetUp() override {
    DeviceOptions options;
    options.num_threads = 1;
    absl::StatusOr<std::unique_ptr<Device>> cpu = CreateDevice(options);
    ASSERT_THAT(cpu.status(), IsOk());
    device_ = std::make_unique<FaultInjectingDevice>(*std::move(cpu));
  }

  // An fp32 tensor holding `values`, written through the base device (not counted).
  Tensor Upload(const std::vector<float>& values) {
    const int64_t n = static_cast<int64_t>(values.size());
    absl::StatusOr<Tensor> t = device_->base().Allocate(DType::kF32, {n});
    EXPECT_THAT(t.status(), IsOk());
    EXPECT_THAT(device_->base().CopyFromHost(values.data(), DType::kF32, n, *t, 0), IsOk());
    return *std::move(t);
  }

  std::vector<float> Download(const Tensor& t) {
    std::vector<float> values(t.numel());
    EXPECT_THAT(device_->base().CopyToHost(t, 0, t.numel(), DType::kF32, values.data()), IsOk());
    return values;
  }

  std::unique_ptr<FaultInjectingDevice> device_;
};

TEST_F(FaultInjectingDeviceTest, FailsExactlyTheNthCallWithoutForwardingIt) {
  Tensor x = Upload({1, 2});
  device_->faults().FailCall("Scale", 3, absl::DataLossError("injected"));
  EXPECT_THAT(device_->Scale(2, x), IsOk());
  EXPECT_THAT(device_->Scale(2, x), IsOk());
  EXPECT_EQ(absl::DataLossError("injected"), device_->Scale(2, x));
  EXPECT_EQ(Download(x), (std::vector<float>{4, 8}));  // the failed call did not scale
  EXPECT_THAT(device_->Scale(2, x), IsOk());
  EXPECT_EQ(Download(x), (std::vector<float>{8, 16}));
  EXPECT_EQ(device_->faults().calls("Scale"), 4);
  EXPECT_EQ(device_->faults().calls("Add"), 0);
}

TEST_F(FaultInjectingDeviceTest, FailsARangeOfCallsAndStatusOrMethods) {
  device_->faults().FailCalls("Allocate", 2, FaultInjector::kForever,
                              absl::ResourceExhaustedError("injected: out of memory"));
  EXPECT_THAT(device_->Allocate(DType::kF32, {3}).status(), IsOk());
  for (int i = 0; i < 3; ++i) {
    EXPECT_THAT(device_->Allocate(DType::kF32, {3}).status(),
                StatusIs(absl::StatusCode::kResourceExhausted, "injected: out of memory"));
  }
  device_->faults().Clear();
  EXPECT_THAT(device_->Allocate(DType::kF32, {3}).status(), IsOk());
  EXPECT_EQ(device_->faults().calls("Allocate"), 5);

  Tensor g = Upload({3, 4});
  device_->faults().FailCall("ComputeGradientStats", 1, absl::InternalError("injected: stats"));
  EXPECT_THAT(device_->ComputeGradientStats(g).status(),
              StatusIs(absl::StatusCode::kInternal, "injected: stats"));
  absl::StatusOr<GradientStats> stats = device_->ComputeGradientStats(g);
  ASSERT_THAT(stats.status(), IsOk());
  EXPECT_EQ(stats->sum_squares, 25.0);
  EXPECT_TRUE(stats->all_finite);
}

TEST_F(FaultInjectingDeviceTest, ForwardsArgumentErrorsOfTheWrappedDevice) {
  Tensor a = Upload({1, 2, 3});
  Tensor b = Upload({1, 2});
  absl::Status direct = device_->base().Add(a, b);
  ASSERT_EQ(direct.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(device_->Add(a, b), direct);
  EXPECT_EQ(device_->name(), device_->base().name());
  EXPECT_EQ(device_->allocated_bytes(), device_->base().allocated_bytes());
}

TEST_F(FaultInjectingDeviceTest, DelaysTheCallsItIsTold) {
  Tensor x = Upload({1});
  device_->faults().DelayCalls("Zero", 1, 1, absl::Milliseconds(300));
  absl::Time start = absl::Now();
  EXPECT_THAT(device_->Zero(x), IsOk());
  EXPECT_GE(absl::Now() - start, absl::Milliseconds(300));
  // A delayed call that also fails fails after the delay.
  device_->faults().DelayCalls("Zero", 2, 2, absl::Milliseconds(300));
  device_->faults().FailCall("Zero", 2, absl::UnavailableError("injected"));
  start = absl::Now();
  EXPECT_THAT(device_->Zero(x), StatusIs(absl::StatusCode::kUnavailable, "injected"));
  EXPECT_GE(absl::Now() - start, absl::Milliseconds(300));
}

TEST_F(FaultInjectingDeviceTest, CorruptsTheFirstElementOfTheOutput) {
  Tensor dst = Upload({0, 0, 0});
  const std::vector<float> values = {1, 2, 3};
  device_->faults().CorruptCall("CopyFromHost", 2);
  ASSERT_THAT(device_->CopyFromHost(values.data(), DType::kF32, 3, dst, 0), IsOk());
  EXPECT_EQ(Download(dst), values);
  ASSERT_THAT(device_->CopyFromHost(values.data(), DType::kF32, 3, dst, 0), IsOk());
  std::vector<float> corrupted = Download(dst);
  EXPECT_TRUE(std::isnan(corrupted[0]));
  EXPECT_EQ(corrupted[1], 2);
  EXPECT_EQ(corrupted[2], 3);

  // Host output: every byte of the first element.
  Tensor src = Upload({1, 2});
  uint16_t bf16[2] = {0, 0};
  device_->faults().CorruptCall("CopyToHost", 1);
  ASSERT_THAT(device_->CopyToHost(src, 0, 2, DType::kBF16, bf16), IsOk());
  EXPECT_EQ(bf16[0], 0xffff);
  EXPECT_EQ(bf16[1], 0x4000);  // 2.0

  device_->faults().CorruptCall("ComputeGradientStats", 1);
  absl::StatusOr<GradientStats> stats = device_->ComputeGradientStats(src);
  ASSERT_THAT(stats.status(), IsOk());
  EXPECT_FALSE(stats->all_finite);
  EXPECT_TRUE(std::isnan(stats->sum_squares));
}

// SymmetricGemm reaches the wrapped device's own (the CPU's panels, not its full Gemm) and is
// counted, failed and corrupted under its own name.
TEST_F(FaultInjectingDeviceTest, ForwardsSymmetricGemmUnderItsOwnName) {
  // X {2, 3}; C = X·Xᵀ.
  Tensor x = *device_->base().Allocate(DType::kF32, {2, 3});
  const std::vector<float> values = {1, 2, 3, 4, 5, 6};
  ASSERT_THAT(device_->base().CopyFromHost(values.data(), DType::kF32, 6, x, 0), IsOk());
  Tensor c = *device_->base().Allocate(DType::kF32, {2, 2});
  const GemmArgs gram{MatmulPrecision::kHighest, false, true, 1.0f, 0.0f};
  ASSERT_THAT(device_->matrix().SymmetricGemm(gram, x, x, c), IsOk());
  EXPECT_EQ(Download(c), (std::vector<float>{14, 32, 32, 77}));
  EXPECT_EQ(device_->faults().calls("SymmetricGemm"), 1);
  EXPECT_EQ(device_->faults().calls("Gemm"), 0);
  device_->faults().FailCall("SymmetricGemm", 2, absl::InternalError("injected"));
  EXPECT_THAT(device_->matrix().SymmetricGemm(gram, x, x, c),
              StatusIs(absl::StatusCode::kInternal, "injected"));
  device_->faults().CorruptCall("SymmetricGemm", 3);
  ASSERT_THAT(device_->matrix().SymmetricGemm(gram, x, x, c), IsOk());
  EXPECT_TRUE(std::isnan(Download(c)[0]));
}

// Device::GemmFrom's default, which FaultInjectingDevice keeps: Copy(d, c), then the product,
// each counted under its own name (so faults reach Newton–Schulz's copies there); an invalid d
// is refused before anything is copied.
TEST_F(FaultInjectingDeviceTest, GemmFromIsTheCopyThenTheProduct) {
  // X {2, 3}; C = X·Xᵀ + 2·D.
  Tensor x = *device_->base().Allocate(DType::kF32, {2, 3});
  const std::vector<float> values = {1, 2, 3, 4, 5, 6}, ones = {1, 1, 1, 1};
  ASSERT_THAT(device_->base().CopyFromHost(values.data(), DType::kF32, 6, x, 0), IsOk());
  Tensor d = *device_->base().Allocate(DType::kF32, {2, 2});
  ASSERT_THAT(device_->base().CopyFromHost(ones.data(), DType::kF32, 4, d, 0), IsOk());
  Tensor c = *device_->base().Allocate(DType::kF32, {2, 2});
  const GemmArgs gram{MatmulPrecision::kHighest, false, true, 1.0f, 2.0f};
  ASSERT_THAT(device_->GemmFrom(gram, /*symmetric=*/true, x, x, d, c), IsOk());
  EXPECT_EQ(Download(c), (std::vector<float>{16, 34, 34, 79}));
  EXPECT_EQ(device_->faults().calls("Copy"), 1);
  EXPECT_EQ(device_->faults().calls("SymmetricGemm"), 1);
  Tensor flat = *device_->base().Allocate(DType::kF32, {4});
  EXPECT_THAT(device_->GemmFrom(gram, /*symmetric=*/true, x, x, flat, c),
              StatusIs(absl::StatusCode::kInvalidArgument, "GemmFrom: d must have c's shape"));
  EXPECT_EQ(device_->faults().calls("Copy"), 1);
}

TEST_F(FaultInjectingDeviceTest, FailsExactlyOneCallAcrossThreads) {
  constexpr int kThreads = 4, kCallsEach = 50;
  Tensor src = Upload({1, 2, 3, 4});
  device_->faults().FailCall("CopyToHost", 100, absl::InternalError("injected"));
  std::vector<int> failures(kThreads, 0);
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      float out[4];
      for (int i = 0; i < kCallsEach; ++i) {
        absl::Status s = device_->CopyToHost(src, 0, 4, DType::kF32, out);
        if (!s.ok()) {
          EXPECT_EQ(s, absl::InternalError("injected"));
          ++failures[t];
        }
      }
    });
  }
  for (std::thread& t : threads) t.join();
  int total = 0;
  for (int f : failures) total += f;
  EXPECT_EQ(total, 1);
  EXPECT_EQ(device_->faults().calls("CopyToHost"), kThreads * kCallsEach);
}

TEST(FaultInjectorDeathTest, AMisspeltMethodAborts) {
  FaultInjector faults({"AllReduce", "Barrier"}, {"AllReduce"});
  EXPECT_DEATH(faults.FailCall("Allreduce", 1, absl::InternalError("x")),
               "no counted method 'Allreduce'; there are: AllReduce, Barrier");
  EXPECT_DEATH(faults.CorruptCall("Barrier", 1), "no corruptible method 'Barrier'");
  EXPECT_DEATH(faults.FailCall("Barrier", 1, absl::OkStatus()), "needs an error status");
}

}  // namespace
}  // namespace testutil
}  // namespace optstep
