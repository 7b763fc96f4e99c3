#ifndef OPTSTEP_SERVER_ENGINE_OWNED_UPDATE_H_
#define OPTSTEP_SERVER_ENGINE_OWNED_UPDATE_H_

// One step's update of the parameters a replica owns (docs/design.md §3, steps 4-5): clip, then
// each group's optimizer, in group order. The same code steps a rank's own replica and the
// shadow of its predecessor's (shadow_state.h), so that both end bit for bit alike.

#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "server/engine/replica_state.h"
#include "server/engine/step_schedule.h"
#include "server/optim/optimizer.h"

namespace optstep {

// The updates of one step, in the order they run.
struct OwnedUpdate {
  std::vector<StepArgs> args;             // by group: lr, weight decay, the group's step
  std::vector<std::pair<int, int>> work;  // (group, parameter), in the order they step
};

// The update of `replica`'s owned parameters with `schedule` (the groups' counters + 1).
OwnedUpdate PlanOwnedUpdate(ReplicaState& replica, const StepSchedule& schedule);

// Runs item `i` of `update`: scales the gradient by `clip_scale` when below 1, then steps the
// parameter and its state. On the device worker.
absl::Status ApplyOwnedItem(ReplicaState& replica, const OwnedUpdate& update, int i,
                            double clip_scale);

// Counts the step in every group's counter (every rank advances every group, so they agree).
void CountOwnedUpdate(ReplicaState& replica);

}  // namespace optstep

#endif  // OPTSTEP_SERVER_ENGINE_OWNED_UPDATE_H_
