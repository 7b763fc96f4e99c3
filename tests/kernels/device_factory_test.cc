#include "kernels/device_factory.h"

#include <memory>

#include "absl/status/status.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/status_matchers.h"

namespace optstep {
namespace {

using ::optstep::testutil::StatusIs;

absl::StatusOr<std::unique_ptr<Device>> Make(const std::string& kind, int num_threads = 0) {
  DeviceOptions options;
  options.kind = kind;
  options.num_threads = num_threads;
  return CreateDevice(options);
}

TEST(DeviceFactoryTest, CreatesCpu) {
  OPTSTEP_ASSERT_OK_AND_ASSIGN(std::unique_ptr<Device> device, Make("cpu", 2));
  EXPECT_EQ(device->name(), "cpu");
}

TEST(DeviceFactoryTest, AutoPicksAWorkingDevice) {
  OPTSTEP_ASSERT_OK_AND_ASSIGN(std::unique_ptr<Device> device, Make("auto"));
  if (!BuiltWithCuda()) {
    EXPECT_EQ(device->name(), "cpu");
  }
}

TEST(DeviceFactoryTest, CudaWithoutCudaBuildIsFailedPrecondition) {
  if (BuiltWithCuda()) GTEST_SKIP() << "this build has CUDA; see device_conformance_cuda_test";
  for (const char* kind : {"cuda", "cuda:0", "cuda:3"}) {
    EXPECT_THAT(Make(kind), StatusIs(absl::StatusCode::kFailedPrecondition,
                                     "this build has no CUDA support; rebuild with --config=cuda"))
        << kind;
  }
}

TEST(DeviceFactoryTest, RejectsUnknownKinds) {
  for (const char* kind :
       {"", "gpu", "CPU", "cuda:", "cuda:-1", "cuda:+1", "cuda: 1", "cuda:1x", "cuda:1234567"}) {
    EXPECT_THAT(Make(kind), StatusIs(absl::StatusCode::kInvalidArgument,
                                     std::string("unknown device kind '") + kind + "'"))
        << kind;
  }
}

TEST(DeviceFactoryTest, RejectsNegativeThreadCount) {
  EXPECT_THAT(Make("cpu", -2),
              StatusIs(absl::StatusCode::kInvalidArgument, "num_threads must be >= 0, got -2"));
}

}  // namespace
}  // namespace optstep
