// The conformance suite on the CPU device: through CreateDevice (all cores) and directly with
// one and with four threads (more than this machine may have: the partition must not care).

#include <memory>

#include "gtest/gtest.h"
#include "kernels/cpu/cpu_device.h"
#include "kernels/device_factory.h"
#include "tests/kernels/device_conformance.h"

namespace optstep {
namespace testing_internal {
namespace {

absl::StatusOr<std::unique_ptr<Device>> CpuWithThreads(int num_threads) {
  CpuDevice::Options options;
  options.num_threads = num_threads;
  absl::StatusOr<std::unique_ptr<CpuDevice>> device = CpuDevice::Create(options);
  if (!device.ok()) return device.status();
  return std::unique_ptr<Device>(*std::move(device));
}

INSTANTIATE_TEST_SUITE_P(
    Cpu, DeviceConformanceTest,
    ::testing::Values(DeviceFactory{"Factory",
                                    [](int num_threads) {
                                      DeviceOptions options;
                                      options.kind = "cpu";
                                      options.num_threads = num_threads;
                                      return CreateDevice(options);
                                    }},
                      DeviceFactory{"OneThread", [](int) { return CpuWithThreads(1); }},
                      DeviceFactory{"FourThreads",
                                    [](int num_threads) {
                                      return CpuWithThreads(num_threads == 0 ? 4 : num_threads);
                                    }}),
    [](const ::testing::TestParamInfo<DeviceFactory>& info) { return info.param.name; });

}  // namespace
}  // namespace testing_internal
}  // namespace optstep
