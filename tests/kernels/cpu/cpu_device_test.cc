// CPU-specific behaviour; everything a Device must do is in the conformance suite.

#include "kernels/cpu/cpu_device.h"

#include <cstdint>
#include <memory>
#include <vector>

#include "absl/status/status.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "kernels/dtype.h"
#include "kernels/tensor.h"
#include "tests/testing/status_matchers.h"

namespace optstep {
namespace {

using ::optstep::testutil::StatusIs;

std::unique_ptr<CpuDevice> MakeCpu(int num_threads, int64_t limit = 0) {
  CpuDevice::Options options;
  options.num_threads = num_threads;
  options.memory_limit_bytes = limit;
  absl::StatusOr<std::unique_ptr<CpuDevice>> device = CpuDevice::Create(options);
  EXPECT_TRUE(device.ok()) << device.status();
  return device.ok() ? *std::move(device) : nullptr;
}

TEST(CpuDeviceTest, CreateValidatesOptions) {
  CpuDevice::Options options;
  options.memory_limit_bytes = -1;
  EXPECT_THAT(CpuDevice::Create(options),
              StatusIs(absl::StatusCode::kInvalidArgument, "memory_limit_bytes must be >= 0"));
  std::unique_ptr<CpuDevice> device = MakeCpu(0);
  ASSERT_NE(device, nullptr);
  EXPECT_GE(device->num_threads(), 1);
  EXPECT_EQ(MakeCpu(3)->num_threads(), 3);
}

TEST(CpuDeviceTest, AllocationsAreCacheLineAligned) {
  std::unique_ptr<CpuDevice> device = MakeCpu(2);
  ASSERT_NE(device, nullptr);
  std::vector<Tensor> tensors;
  for (int64_t n : {1, 3, 17, 1000, 100000}) {
    OPTSTEP_ASSERT_OK_AND_ASSIGN(Tensor t, device->Allocate(DType::kBF16, {n}));
    EXPECT_EQ(reinterpret_cast<uintptr_t>(t.data()) % CpuDevice::kAlignment, 0u) << n;
    tensors.push_back(std::move(t));
  }
}

TEST(CpuDeviceTest, MemoryLimitIsResourceExhausted) {
  std::unique_ptr<CpuDevice> device = MakeCpu(1, /*limit=*/4096);
  ASSERT_NE(device, nullptr);
  OPTSTEP_ASSERT_OK_AND_ASSIGN(Tensor a, device->Allocate(DType::kF32, {768}));  // 3072 bytes
  EXPECT_THAT(device->Allocate(DType::kF32, {512}),
              StatusIs(absl::StatusCode::kResourceExhausted,
                       "needs 2048 bytes; the device holds 3072 of its limit 4096"));
  EXPECT_EQ(device->allocated_bytes(), 3072);
  OPTSTEP_ASSERT_OK_AND_ASSIGN(Tensor b, device->Allocate(DType::kF16, {512}));  // 1024 bytes
  EXPECT_EQ(device->allocated_bytes(), 4096);
}

TEST(CpuDeviceTest, TensorsMayOutliveTheirDevice) {
  std::unique_ptr<CpuDevice> device = MakeCpu(1);
  ASSERT_NE(device, nullptr);
  OPTSTEP_ASSERT_OK_AND_ASSIGN(Tensor t, device->Allocate(DType::kF32, {1000}));
  device.reset();
  t = Tensor();  // releases memory and accounting without touching the device
  SUCCEED();
}

}  // namespace
}  // namespace optstep
