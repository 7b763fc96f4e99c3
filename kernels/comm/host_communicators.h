#ifndef OPTSTEP_KERNELS_COMM_HOST_COMMUNICATORS_H_
#define OPTSTEP_KERNELS_COMM_HOST_COMMUNICATORS_H_

// The part of CreateCommunicator that every build has: the host-memory kinds. Internal to the
// two factory files (communicator_factory.cc and communicator_factory_cuda.cc).

#include <memory>

#include "absl/status/statusor.h"
#include "kernels/comm/communicator.h"

namespace optstep {
namespace internal {

// Whether options.kind names a host-memory communicator ("local" or "gloo").
bool IsHostCommunicatorKind(const CommunicatorOptions& options);

// Creates a "local" or "gloo" communicator ("gloo" with world_size 1 is a local one).
// REQUIRES: IsHostCommunicatorKind(options).
absl::StatusOr<std::unique_ptr<Communicator>> CreateHostCommunicator(
    const CommunicatorOptions& options);

// INVALID_ARGUMENT naming the kinds this build knows.
absl::Status UnknownKindError(const CommunicatorOptions& options);

}  // namespace internal
}  // namespace optstep

#endif  // OPTSTEP_KERNELS_COMM_HOST_COMMUNICATORS_H_
