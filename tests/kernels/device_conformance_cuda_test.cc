// The conformance suite on CUDA device 0, created through CreateDevice("cuda"). Built only under
// --config=cuda and tagged "gpu": where no GPU can be opened every test FAILS in SetUp (this
// target is never skipped silently; CPU-only CI filters it out by tag instead).

#include <memory>

#include "gtest/gtest.h"
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

}  // namespace
}  // namespace testing_internal
}  // namespace optstep
