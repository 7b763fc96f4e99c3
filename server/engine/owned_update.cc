#include "server/engine/owned_update.h"

#include "base/status_macros.h"

namespace optstep {

OwnedUpdate PlanOwnedUpdate(ReplicaState& replica, const StepSchedule& schedule) {
  OwnedUpdate update;
  const std::vector<GroupRuntime>& groups = replica.groups();
  update.args.resize(groups.size());
  for (size_t g = 0; g < groups.size(); ++g) {
    const GroupRuntime& group = groups[g];
    update.args[g].lr = schedule[group.def.id].lr;
    update.args[g].weight_decay = schedule[group.def.id].weight_decay * group.def.wd_mult;
    update.args[g].group_step = static_cast<int64_t>(group.applied_steps) + 1;
    for (int p : group.def.param_ids) {
      if (replica.owns(p)) update.work.emplace_back(static_cast<int>(g), p);
    }
  }
  return update;
}

absl::Status ApplyOwnedItem(ReplicaState& replica, const OwnedUpdate& update, int i,
                            double clip_scale) {
  Device& device = replica.device();
  const auto [g, p] = update.work[i];
  if (clip_scale < 1.0) {
    OPTSTEP_RETURN_IF_ERROR(device.Scale(static_cast<float>(clip_scale), replica.grad(p)));
  }
  return replica.groups()[g].optimizer->Step(device, update.args[g], replica.grad(p),
                                             replica.param(p), replica.state(p));
}

void CountOwnedUpdate(ReplicaState& replica) {
  for (GroupRuntime& group : replica.groups()) ++group.applied_steps;
}

}  // namespace optstep
