#include "kernels/comm/host_communicators.h"

#include <memory>

#include "absl/strings/str_cat.h"
#include "glog/logging.h"
#include "kernels/comm/gloo_communicator.h"
#include "kernels/comm/local_communicator.h"
#include "base/status_macros.h"

namespace optstep {
namespace internal {

bool IsHostCommunicatorKind(const CommunicatorOptions& options) {
  return options.kind == "local" || options.kind == "gloo";
}

absl::StatusOr<std::unique_ptr<Communicator>> CreateHostCommunicator(
    const CommunicatorOptions& options) {
  CHECK(IsHostCommunicatorKind(options)) << options.kind;
  if (options.kind == "local" || options.world_size == 1) {
    OPTSTEP_ASSIGN_OR_RETURN(std::unique_ptr<LocalCommunicator> local,
                             LocalCommunicator::Create(options));
    return std::unique_ptr<Communicator>(std::move(local));
  }
  OPTSTEP_ASSIGN_OR_RETURN(std::unique_ptr<GlooCommunicator> gloo,
                           GlooCommunicator::Create(options));
  return std::unique_ptr<Communicator>(std::move(gloo));
}

absl::Status UnknownKindError(const CommunicatorOptions& options) {
  return absl::InvalidArgumentError(absl::StrCat("unknown communicator kind '", options.kind,
                                                 "' (expected local, gloo or nccl)"));
}

}  // namespace internal
}  // namespace optstep
