// The conformance suite on CUDA device 0, created through CreateDevice("cuda"). Built only under
// --config=cuda and tagged "gpu": where no GPU can be opened every test FAILS in SetUp (this
// target is never skipped silently; CPU-only CI filters it out by tag instead).

#include <cuda_runtime_api.h>

#include <cstdint>
#include <memory>

#include "gtest/gtest.h"
#include "kernels/cuda/cuda_device.h"
#include "kernels/device_factory.h"
#include "tests/kernels/device_conformance.h"

namespace optstep {
namespace testing_internal {
namespace {

INSTANTIATE_TEST_SUITE_P(Cuda, DeviceConformanceTest,
                         ::testing::Values(DeviceFactory{"Device0",
                                                         [](int) {
                                                           DeviceOptions options;
                                                           options.kind = "cuda:0";
                                                           return CreateDevice(options);
                                                         }}),
                         [](const ::testing::TestParamInfo<DeviceFactory>& info) {
                           return info.param.name;
                         });

// Stream-ordered scratch freed by one call is kept for the next instead of going back to the
// driver at each synchronization (which made every Newton–Schulz call map its scratch again).
TEST(CudaDeviceTest, TheDefaultMemoryPoolKeepsScratchForReuse) {
  auto device = CudaDevice::Create({/*ordinal=*/0});
  ASSERT_TRUE(device.ok()) << device.status();
  cudaMemPool_t pool = nullptr;
  ASSERT_EQ(cudaDeviceGetDefaultMemPool(&pool, 0), cudaSuccess);
  uint64_t kept = 0;
  ASSERT_EQ(cudaMemPoolGetAttribute(pool, cudaMemPoolAttrReleaseThreshold, &kept), cudaSuccess);
  EXPECT_EQ(kept, CudaDevice::kScratchPoolBytes);
}

}  // namespace
}  // namespace testing_internal
}  // namespace optstep
