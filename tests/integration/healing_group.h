#ifndef OPTSTEP_TESTS_INTEGRATION_HEALING_GROUP_H_
#define OPTSTEP_TESTS_INTEGRATION_HEALING_GROUP_H_

// What the integration tests of a group that heals share: its ranks as processes (alive, live,
// serving, restarted with their ordinal), a trainer that recovers by itself, and a session whose
// parameters every rank owns some of, compared bit for bit with an undisturbed one.

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "client/cpp/client.h"
#include "optstep/v1/session.pb.h"
#include "tests/testing/server_process.h"

namespace optstep {
namespace testutil {

using Group = std::vector<std::unique_ptr<ServerProcess>>;

// The flags of a group that heals on loopback within about a second: heartbeats every 100 ms, a
// peer lost after 1 s, state redundancy, and `rejoin_timeout` for a lost rank to come back.
std::vector<std::string> HealingFlags(absl::Duration rejoin_timeout = absl::Seconds(30));

// A trainer of `group` (every rank's address) that waits out a heal for up to 30 s; null (and a
// test failure) when it cannot connect.
std::unique_ptr<Client> Trainer(const Group& group);
// Whether rank `rank`'s health answers `serving` within `bound`.
bool AwaitHealth(const ServerProcess& rank, bool serving, absl::Duration bound);
// Whether rank `rank`'s liveness service (what a liveness probe asks) answers SERVING.
bool Live(const ServerProcess& rank);
// Whether `rank`'s process still runs: not exited, nor a child exited and not yet reaped (which
// kill(pid, 0) still reaches).
bool Running(const ServerProcess& rank);
// The step of session `session_id` on rank `rank` (PeerService.ListReplicas) once it is `step`,
// waiting up to `bound`; else the step it has then, or the error.
absl::StatusOr<uint64_t> AwaitListedStep(const ServerProcess& rank, const std::string& session_id,
                                         uint64_t step, absl::Duration bound);
// Restarts rank `rank` of `group` (killed) with its ordinal, on its port.
absl::Status Restart(Group& group, int rank, std::vector<std::string> flags);

// An Adam session of kSpreadParams parameters: each rank of a group of up to 6 owns some.
constexpr int kSpreadParams = 6;
v1::SessionSpec SpreadSpec(const std::string& name,
                           v1::ParameterStorage storage = v1::PARAMETER_STORAGE_REPLICATED);
// The gradients of a SpreadSpec session's step `step`, by parameter.
std::vector<std::vector<float>> SpreadGradients(uint64_t step);
// Step `step` of a SpreadSpec session with SpreadGradients(step).
absl::StatusOr<StepReply> StepSpread(Client& trainer, const std::string& session_id, uint64_t step);
// A SpreadSpec session named "reference" stepped `steps` times before any loss: the run a
// disturbed session of the same definition must end as.
absl::StatusOr<v1::SessionInfo> SteppedReference(
    Client& trainer, uint64_t steps,
    v1::ParameterStorage storage = v1::PARAMETER_STORAGE_REPLICATED);
// The session's parameters and optimizer state, key by key (the masters' bits included).
absl::StatusOr<std::string> StateOf(Client& trainer, const std::string& session_id);
// OK when session `other` holds the optimizer state and the parameters of session `reference`
// bit for bit; else which of them differs.
absl::Status SameStateAndParameters(Client& trainer, const std::string& reference,
                                    const std::string& other);

}  // namespace testutil
}  // namespace optstep

#endif  // OPTSTEP_TESTS_INTEGRATION_HEALING_GROUP_H_
