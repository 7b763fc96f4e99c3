#include "tests/integration/auto_checkpoint_run.h"

#include "absl/time/time.h"
#include "base/status_macros.h"
#include "tests/integration/test_session.h"

namespace optstep {
namespace testutil {

absl::StatusOr<Running> StartRunning(int world, const std::vector<std::string>& flags) {
  Running run;
  OPTSTEP_ASSIGN_OR_RETURN(run.group, StartGroup(world, flags));
  ClientOptions options;
  for (const auto& rank : run.group) options.rank_targets.push_back(rank->address());
  options.connect_timeout = absl::Seconds(20);
  OPTSTEP_ASSIGN_OR_RETURN(run.client, Client::Connect(options));
  OPTSTEP_RETURN_IF_ERROR(WaitServing(*run.client));
  return run;
}

std::vector<std::string> AutoFlags(const std::string& root) {
  return {"--checkpoint_root=" + root, "--checkpoint_every_steps=1"};
}

absl::Status StepRange(Client& client, const std::string& session, uint64_t first, uint64_t last) {
  for (uint64_t step = first; step <= last; ++step) {
    OPTSTEP_RETURN_IF_ERROR(StepSmall(client, session, step).status());
  }
  return absl::OkStatus();
}

}  // namespace testutil
}  // namespace optstep
