// CreateDevice for builds without CUDA (the default): only the CPU device exists.

#include <memory>

#include "absl/strings/str_cat.h"
#include "kernels/cpu/cpu_device.h"
#include "kernels/device_factory.h"
#include "kernels/device_kind.h"
#include "base/status_macros.h"

namespace optstep {

absl::StatusOr<std::unique_ptr<Device>> CreateDevice(const DeviceOptions& options) {
  OPTSTEP_ASSIGN_OR_RETURN(internal::DeviceKind kind, internal::ParseDeviceKind(options.kind));
  if (kind.type == internal::DeviceKind::kCuda) {
    return absl::FailedPreconditionError(absl::StrCat(
        "device '", options.kind, "': this build has no CUDA support; rebuild with --config=cuda"));
  }
  CpuDevice::Options cpu;
  cpu.num_threads = options.num_threads;
  OPTSTEP_ASSIGN_OR_RETURN(std::unique_ptr<CpuDevice> device, CpuDevice::Create(cpu));
  return std::unique_ptr<Device>(std::move(device));
}

bool BuiltWithCuda() { return false; }

}  // namespace optstep
