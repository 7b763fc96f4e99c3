#ifndef OPTSTEP_CLIENT_CPP_GRPC_STATUS_H_
#define OPTSTEP_CLIENT_CPP_GRPC_STATUS_H_

// The client's one bridge from grpc::Status to absl::Status (the inverse of the server's
// ToGrpcStatus). Internal to client/: callers of optstep::Client never see gRPC types.

#include <grpcpp/support/status.h>

#include "absl/status/status.h"

namespace optstep {
namespace client_internal {

// Keeps the code (gRPC and Abseil share the numbering; anything else becomes UNKNOWN) and the
// message verbatim.
absl::Status FromGrpcStatus(const grpc::Status& status);

}  // namespace client_internal
}  // namespace optstep

#endif  // OPTSTEP_CLIENT_CPP_GRPC_STATUS_H_
