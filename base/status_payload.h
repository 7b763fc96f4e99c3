#ifndef OPTSTEP_BASE_STATUS_PAYLOAD_H_
#define OPTSTEP_BASE_STATUS_PAYLOAD_H_

// Numbers a status carries beside its message, for callers that act on more than the code: a
// step the session expects, a step it was restored to. Only the payloads a server sends
// (IsWirePayload) cross gRPC (wire/grpc_status); others stay in the process: a peer cannot make a
// client believe, say, that its session was rolled back. Stateless.

#include <cstdint>
#include <optional>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"

namespace optstep {

// A Step refused FAILED_PRECONDITION as out of sequence carries the step the session expects
// next, in decimal. A client that saw step N applied tells "the session is at N and cannot
// replay it after a restore" (expects N + 1) from a refusal of other gradients (no payload).
inline constexpr absl::string_view kExpectedStepPayload = "type.optstep.dev/optstep.ExpectedStep";

// Whether a payload of `type_url` crosses gRPC: kExpectedStepPayload.
bool IsWirePayload(absl::string_view type_url);

// `status` with the payload `type_url` set to `number` in decimal; OK stays OK.
absl::Status WithPayloadNumber(absl::Status status, absl::string_view type_url, uint64_t number);

// The number in payload `type_url` of a status of code `code`; nullopt for another code, no such
// payload, or one that is not a decimal number.
std::optional<uint64_t> PayloadNumber(const absl::Status& status, absl::StatusCode code,
                                      absl::string_view type_url);

}  // namespace optstep

#endif  // OPTSTEP_BASE_STATUS_PAYLOAD_H_
