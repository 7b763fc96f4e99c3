#ifndef OPTSTEP_KERNELS_DEVICE_KIND_H_
#define OPTSTEP_KERNELS_DEVICE_KIND_H_

// Parsing of DeviceOptions::kind, shared by the two device_factory_*.cc files. Stateless.

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace optstep {
namespace internal {

struct DeviceKind {
  enum Type { kCpu, kCuda, kAuto };
  Type type = kCpu;
  int ordinal = 0;  // kCuda: "cuda" is ordinal 0, "cuda:N" is N.
};

// "cpu", "cuda", "cuda:N" (N >= 0), "auto"; anything else is INVALID_ARGUMENT.
absl::StatusOr<DeviceKind> ParseDeviceKind(absl::string_view kind);

}  // namespace internal
}  // namespace optstep

#endif  // OPTSTEP_KERNELS_DEVICE_KIND_H_
