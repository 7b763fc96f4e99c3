// CreateCommunicator for builds without CUDA (the default): local and gloo.

#include <memory>

#include "absl/strings/str_cat.h"
#include "kernels/comm/communicator.h"
#include "kernels/comm/host_communicators.h"

namespace optstep {

absl::StatusOr<std::unique_ptr<Communicator>> CreateCommunicator(
    const CommunicatorOptions& options) {
  if (internal::IsHostCommunicatorKind(options)) return internal::CreateHostCommunicator(options);
  if (options.kind == "nccl") {
    return absl::FailedPreconditionError(
        absl::StrCat("communicator '", options.kind,
                     "': this build has no CUDA support; rebuild with --config=cuda"));
  }
  return internal::UnknownKindError(options);
}

}  // namespace optstep
