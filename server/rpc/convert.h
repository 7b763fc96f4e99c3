#ifndef OPTSTEP_SERVER_RPC_CONVERT_H_
#define OPTSTEP_SERVER_RPC_CONVERT_H_

// Proto <-> engine conversion with validation. Every request is validated here, on the host,
// before the engine sees it; errors are INVALID_ARGUMENT naming the field, the parameter and the
// values (UNIMPLEMENTED for parts of the v1 API this build does not provide).

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "kernels/dtype.h"
#include "optstep/v1/optimizer_service.pb.h"
#include "optstep/v1/session.pb.h"
#include "server/engine/session.h"
#include "server/engine/session_config.h"

namespace optstep {

// Validates names (non-empty parameter names, unique; a session, sub-optimizer or parameter name
// of at most 255, 255 or 1024 bytes without control characters), shapes (every dim >= 1), QKV
// splits, trainer count, gradient mode, deadline and the optimizer chain (presets, sub-optimizers,
// rules).
absl::StatusOr<SessionConfig> SessionConfigFromProto(const v1::SessionSpec& spec);
// The longest CreateSessionRequest.request_id.
inline constexpr size_t kMaxRequestIdBytes = 128;
// As above, for the session that `owner` creates with `request_id` (at most kMaxRequestIdBytes,
// no control characters; may be empty): what rank 0 creates, restores, and every rank builds its
// replica from.
absl::StatusOr<SessionConfig> SessionConfigFromProto(const v1::SessionSpec& spec,
                                                     const std::string& owner,
                                                     const std::string& request_id);
absl::StatusOr<ChainConfig> ChainConfigFromProto(const v1::OptimizerConfig& config);
// What a session a caller creates must also hold, beyond SessionConfigFromProto: bounds added
// after sessions were saved without them (a step_deadline_ms of 0, or from 100 to an hour), which
// their restores and heals do not refuse (SessionConfigFromProto takes a saved deadline over an
// hour as an hour); and the bounds on routing (at most 256 rules, each glob at most 1024 bytes
// without control characters, and the globs' bytes times the parameter names' bytes at most
// 2^30), which rank 0 does under the lock every creation takes. INVALID_ARGUMENT naming the field
// and the bound.
absl::Status CheckNewSessionSpec(const v1::SessionSpec& spec);

// Header of a Step stream. INVALID_ARGUMENT for a zero step number or a return dtype other than
// fp32/bf16.
absl::StatusOr<StepBegin> StepBeginFromProto(const v1::StepHeader& header);

// NOT_FOUND naming `what` and the first id that is not a parameter of `session`;
// INVALID_ARGUMENT naming the first id listed twice.
absl::Status CheckParamIds(const Session& session,
                           const google::protobuf::RepeatedField<uint32_t>& ids,
                           absl::string_view what);

// The parameters of `requested` (empty: every parameter) that this rank sends back: all of them
// under REPLICATED storage (`requested` as it is, empty meaning all) unless `owned_only` (a Step
// header's return_owned), only those it owns under OWNERS storage or with `owned_only` (then
// nullopt when it owns none of them). REQUIRES: CheckParamIds passed.
std::optional<std::vector<uint32_t>> ServedParamIds(
    const Session& session, const google::protobuf::RepeatedField<uint32_t>& requested,
    bool owned_only = false);

// The session's definition as JSON text (its SessionSpec without the name, which only serves
// to attach): what a checkpoint records and compares by digest.
absl::StatusOr<std::string> DefinitionJson(const Session& session);

}  // namespace optstep

#endif  // OPTSTEP_SERVER_RPC_CONVERT_H_
