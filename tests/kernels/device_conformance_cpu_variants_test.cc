// The conformance suite on the CPU device's narrower instruction-set variants (OPTSTEP_CPU_ISA;
// device_conformance_cpu_test runs the widest this CPU supports): the baseline always, AVX2
// where the CPU has it.

#include <memory>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/cpu/cpu_device.h"
#include "kernels/cpu/cpu_isa.h"
#include "tests/kernels/device_conformance.h"

namespace optstep {
namespace testing_internal {
namespace {

std::vector<DeviceFactory> NarrowerVariants() {
  std::vector<DeviceFactory> out;
  for (CpuIsa isa : {CpuIsa::kBaseline, CpuIsa::kAvx2}) {
    if (static_cast<int>(isa) >= static_cast<int>(DetectCpuIsa())) break;
    out.push_back(DeviceFactory{
        CpuIsaName(isa), [isa](int num_threads) -> absl::StatusOr<std::unique_ptr<Device>> {
          CpuDevice::Options options;
          options.num_threads = num_threads == 0 ? 2 : num_threads;
          options.isa = CpuIsaName(isa);
          absl::StatusOr<std::unique_ptr<CpuDevice>> device = CpuDevice::Create(options);
          if (!device.ok()) return device.status();
          return std::unique_ptr<Device>(*std::move(device));
        }});
  }
  return out;
}

GTEST_ALLOW_UNINSTANTIATED_PARAMETERIZED_TEST(DeviceConformanceTest);
INSTANTIATE_TEST_SUITE_P(CpuVariants, DeviceConformanceTest,
                         ::testing::ValuesIn(NarrowerVariants()),
                         [](const ::testing::TestParamInfo<DeviceFactory>& info) {
                           return info.param.name;
                         });

}  // namespace
}  // namespace testing_internal
}  // namespace optstep
