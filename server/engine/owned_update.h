#ifndef OPTSTEP_SERVER_ENGINE_OWNED_UPDATE_H_
#define OPTSTEP_SERVER_ENGINE_OWNED_UPDATE_H_

// One step's update of the parameters a replica owns (docs/design.md §3, steps 4-5): clip, then
// each group's optimizer, in group order, a batch of a group's parameters at a time
// (Optimizer::StepBatch: one device loop for the batch where the optimizer can). The same code
// steps a rank's own replica and the shadow of its predecessor's (shadow_state.h), so that both
// end bit for bit alike.

#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "server/engine/replica_state.h"
#include "server/engine/step_schedule.h"
#include "server/optim/optimizer.h"

namespace optstep {

// Consecutive parameters of one group that step together (one parameter when the group's
// optimizer has no batched loop: Optimizer::batches).
struct OwnedBatch {
  int group = 0;
  std::vector<int> params;
};

// The updates of one step, in the order they run.
struct OwnedUpdate {
  std::vector<StepArgs> args;    // by group: lr, weight decay, the group's step
  std::vector<OwnedBatch> work;  // in the order they step
};

// The update of `replica`'s owned parameters with `schedule` (the groups' counters + 1), in
// batches of at most `batch_bytes` of parameters (BatchLengths; a larger parameter alone).
OwnedUpdate PlanOwnedUpdate(ReplicaState& replica, const StepSchedule& schedule,
                            int64_t batch_bytes = kStepBatchBytes);

// Runs batch `i` of `update`: clips each gradient by `clip_scale` when below 1 (in the update
// itself where the optimizer scales_gradient(), else by scaling the gradient buffer first), then
// steps the parameters and their state. On the device worker.
absl::Status ApplyOwnedItem(ReplicaState& replica, const OwnedUpdate& update, int i,
                            double clip_scale);

// Counts the step in every group's counter (every rank advances every group, so they agree).
void CountOwnedUpdate(ReplicaState& replica);

}  // namespace optstep

#endif  // OPTSTEP_SERVER_ENGINE_OWNED_UPDATE_H_
