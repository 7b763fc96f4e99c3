#ifndef OPTSTEP_SERVER_RPC_STATUS_BRIDGE_H_
#define OPTSTEP_SERVER_RPC_STATUS_BRIDGE_H_

// The one bridge from absl::Status to grpc::Status. Codes map one to one; messages longer than
// kMaxStatusMessageBytes are truncated (with a marker) so that a status always fits in trailers.

#include <cstddef>

#include <grpcpp/support/status.h>

#include "absl/status/status.h"

namespace optstep {

inline constexpr size_t kMaxStatusMessageBytes = 2048;

grpc::Status ToGrpcStatus(const absl::Status& status);

}  // namespace optstep

#endif  // OPTSTEP_SERVER_RPC_STATUS_BRIDGE_H_
