#ifndef OPTSTEP_KERNELS_DEVICE_FACTORY_H_
#define OPTSTEP_KERNELS_DEVICE_FACTORY_H_

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "kernels/device.h"

namespace optstep {

struct DeviceOptions {
  // "cpu" or "cuda" (or "cuda:N"). "auto" picks cuda when built with it and a GPU is present.
  std::string kind = "cpu";
  // CPU: worker threads for the element-wise loops; 0 = all cores.
  int num_threads = 0;
};

// Creates the device `options` names. Bazel links one of two implementations of this function:
// device_factory_cpu.cc (default build; "cuda" is FAILED_PRECONDITION) or device_factory_cuda.cc
// (--config=cuda). Application code never tests for CUDA support itself.
absl::StatusOr<std::unique_ptr<Device>> CreateDevice(const DeviceOptions& options);

// Whether this build can create CUDA devices.
bool BuiltWithCuda();

}  // namespace optstep

#endif  // OPTSTEP_KERNELS_DEVICE_FACTORY_H_
