// CreateDevice for --config=cuda builds: CPU and CUDA devices.

#include <memory>

#include "kernels/cpu/cpu_device.h"
#include "kernels/cuda/cuda_device.h"
#include "kernels/device_factory.h"
#include "kernels/device_kind.h"
#include "base/status_macros.h"

namespace optstep {

absl::StatusOr<std::unique_ptr<Device>> CreateDevice(const DeviceOptions& options) {
  OPTSTEP_ASSIGN_OR_RETURN(internal::DeviceKind kind, internal::ParseDeviceKind(options.kind));
  const bool use_cuda =
      kind.type == internal::DeviceKind::kCuda ||
      (kind.type == internal::DeviceKind::kAuto && CudaDevice::VisibleDeviceCount() > 0);
  if (use_cuda) {
    CudaDevice::Options cuda;
    cuda.ordinal = kind.ordinal;
    OPTSTEP_ASSIGN_OR_RETURN(std::unique_ptr<CudaDevice> device, CudaDevice::Create(cuda));
    return std::unique_ptr<Device>(std::move(device));
  }
  CpuDevice::Options cpu;
  cpu.num_threads = options.num_threads;
  OPTSTEP_ASSIGN_OR_RETURN(std::unique_ptr<CpuDevice> device, CpuDevice::Create(cpu));
  return std::unique_ptr<Device>(std::move(device));
}

bool BuiltWithCuda() { return true; }

}  // namespace optstep
