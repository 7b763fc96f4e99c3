#ifndef OPTSTEP_CLIENT_CLI_FORMAT_H_
#define OPTSTEP_CLIENT_CLI_FORMAT_H_

// Text the `optstep` command prints: health, session tables and session details. Pure
// functions of the session protos, so that they are tested without a server.

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/types/span.h"
#include "optstep/v1/session.pb.h"

namespace optstep {
namespace cli {

// "SERVING" or "NOT_SERVING".
std::string FormatHealth(bool serving);

// "0 B", "512 B", "1.5 KiB", "4.0 MiB", "2.3 GiB", ... (binary units, one decimal).
std::string FormatBytes(uint64_t bytes);

// "[4096, 1024]"; "[]" for a scalar.
std::string FormatShape(const v1::ParameterSpec& param);

// Element count of a parameter (1 for a scalar).
uint64_t NumElements(const v1::ParameterSpec& param);

// "sharded", "replicated", "unspecified".
std::string GradientModeName(v1::GradientMode mode);

// A double as %g: "0.001", "3e-05", "1".
std::string FormatNumber(double value);

// One line per session: ID NAME PARAMS TRAINERS MODE STEP SKIPPED BYTES (BYTES = fp32 masters +
// optimizer state). "no sessions\n" when there are none.
std::string FormatSessionList(absl::Span<const v1::SessionSummary> sessions);

// A summary block (id, name, trainers, gradient mode, step, memory, optimizer, layout) followed
// by a parameters table (ID NAME SHAPE ELEMENTS CHUNK OWNER GROUP FLAGS) and a groups table
// (ID SUB-OPTIMIZER LR WEIGHT_DECAY WD_MULT PARAMS).
std::string FormatSessionDetails(const v1::SessionInfo& session);

// "optstep <command>: <target>: UNAVAILABLE: <message>\n" for a failed call.
std::string FormatError(const std::string& command, const std::string& target,
                        const absl::Status& status);

}  // namespace cli
}  // namespace optstep

#endif  // OPTSTEP_CLIENT_CLI_FORMAT_H_
