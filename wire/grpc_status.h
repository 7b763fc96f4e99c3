#ifndef OPTSTEP_WIRE_GRPC_STATUS_H_
#define OPTSTEP_WIRE_GRPC_STATUS_H_

// The one bridge between absl::Status and grpc::Status, for the server's services and its calls
// to other ranks and for the client. Both enums number OK = 0 .. UNAUTHENTICATED = 16, so codes
// map one to one. The payloads servers send (IsWirePayload, base/status_payload.h) travel in the
// status details (v1.StatusDetails). Stateless; thread-safe.

#include <grpcpp/support/status.h>

#include <cstddef>

#include "absl/status/status.h"

namespace optstep {

// Longest message ToGrpcStatus sends, so that a status always fits in trailers.
inline constexpr size_t kMaxStatusMessageBytes = 2048;
// How large a payload crossing gRPC may be.
inline constexpr size_t kMaxPayloadBytes = 256;

// Keeps the code; a message longer than kMaxStatusMessageBytes is cut there and marked
// "... (truncated)". The wire payloads of at most kMaxPayloadBytes go in the details; other
// payloads are dropped.
grpc::Status ToGrpcStatus(const absl::Status& status);

// Keeps the code and the message verbatim, and the wire payloads of the details (of at most
// kMaxPayloadBytes); details that do not parse, and other payloads, are ignored. A code outside OK
// .. UNAUTHENTICATED (a peer that speaks another numbering) becomes UNKNOWN.
absl::Status FromGrpcStatus(const grpc::Status& status);

}  // namespace optstep

#endif  // OPTSTEP_WIRE_GRPC_STATUS_H_
