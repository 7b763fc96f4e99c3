// CreateCommunicator for --config=cuda builds: local, gloo and nccl.

#include <memory>

#include "kernels/comm/communicator.h"
#include "kernels/comm/host_communicators.h"
#include "kernels/comm/nccl_communicator.h"
#include "base/status_macros.h"

namespace optstep {

absl::StatusOr<std::unique_ptr<Communicator>> CreateCommunicator(
    const CommunicatorOptions& options) {
  if (internal::IsHostCommunicatorKind(options)) return internal::CreateHostCommunicator(options);
  if (options.kind == "nccl") {
    OPTSTEP_ASSIGN_OR_RETURN(std::unique_ptr<NcclCommunicator> nccl,
                             NcclCommunicator::Create(options));
    return std::unique_ptr<Communicator>(std::move(nccl));
  }
  return internal::UnknownKindError(options);
}

}  // namespace optstep
