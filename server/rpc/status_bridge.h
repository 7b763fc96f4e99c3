#ifndef OPTSTEP_SERVER_RPC_STATUS_BRIDGE_H_
#define OPTSTEP_SERVER_RPC_STATUS_BRIDGE_H_

// The one bridge between absl::Status and grpc::Status on the server. Codes map one to one;
// messages longer than kMaxStatusMessageBytes are truncated (with a marker) so that a status
// always fits in trailers.

#include <cstddef>

#include <grpcpp/support/status.h>

#include "absl/status/status.h"

namespace optstep {

inline constexpr size_t kMaxStatusMessageBytes = 2048;

grpc::Status ToGrpcStatus(const absl::Status& status);
// The other way, for the server's own calls to other ranks.
absl::Status FromGrpcStatus(const grpc::Status& status);

}  // namespace optstep

#endif  // OPTSTEP_SERVER_RPC_STATUS_BRIDGE_H_
