#ifndef OPTSTEP_WIRE_GRPC_STATUS_H_
#define OPTSTEP_WIRE_GRPC_STATUS_H_

// The one bridge between absl::Status and grpc::Status, for the server's services and its calls
// to other ranks and for the client. Both enums number OK = 0 .. UNAUTHENTICATED = 16, so codes
// map one to one. Payloads whose type URL begins with kPublicPayloadPrefix (base/status_payload.h)
// travel in the status details (v1.StatusDetails). Stateless; thread-safe.

#include <grpcpp/support/status.h>

#include <cstddef>

#include "absl/status/status.h"

namespace optstep {

// Longest message ToGrpcStatus sends, so that a status always fits in trailers.
inline constexpr size_t kMaxStatusMessageBytes = 2048;
// How many public payloads, and how large each, a status carries across gRPC.
inline constexpr size_t kMaxPublicPayloads = 4;
inline constexpr size_t kMaxPayloadBytes = 256;

// Keeps the code; a message longer than kMaxStatusMessageBytes is cut there and marked
// "... (truncated)". The public payloads, at most kMaxPublicPayloads of at most
// kMaxPayloadBytes each, go in the details; other payloads are dropped.
grpc::Status ToGrpcStatus(const absl::Status& status);

// Keeps the code and the message verbatim, and the public payloads of the details; details that
// do not parse are ignored. A code outside OK .. UNAUTHENTICATED (a peer that speaks another
// numbering) becomes UNKNOWN.
absl::Status FromGrpcStatus(const grpc::Status& status);

}  // namespace optstep

#endif  // OPTSTEP_WIRE_GRPC_STATUS_H_
