#include "server/engine/owned_update.h"

#include "base/status_macros.h"

namespace optstep {

OwnedUpdate PlanOwnedUpdate(ReplicaState& replica, const StepSchedule& schedule,
                            int64_t batch_bytes) {
  OwnedUpdate update;
  const std::vector<GroupRuntime>& groups = replica.groups();
  update.args.resize(groups.size());
  for (size_t g = 0; g < groups.size(); ++g) {
    const GroupRuntime& group = groups[g];
    update.args[g].lr = schedule[group.def.id].lr;
    update.args[g].weight_decay = schedule[group.def.id].weight_decay * group.def.wd_mult;
    update.args[g].group_step = static_cast<int64_t>(group.applied_steps) + 1;
    std::vector<int> owned;
    std::vector<int64_t> bytes;
    for (int p : group.def.param_ids) {
      if (!replica.owns(p)) continue;
      owned.push_back(p);
      bytes.push_back(replica.numels()[p] * 4);
    }
    // An optimizer without a batched loop steps one parameter per batch.
    size_t next = 0;
    for (int length : BatchLengths(bytes, group.optimizer->batches() ? batch_bytes : 0)) {
      OwnedBatch& batch = update.work.emplace_back();
      batch.group = static_cast<int>(g);
      batch.params.assign(owned.begin() + next, owned.begin() + next + length);
      next += length;
    }
  }
  return update;
}

absl::Status ApplyOwnedItem(ReplicaState& replica, const OwnedUpdate& update, int i,
                            double clip_scale) {
  Device& device = replica.device();
  const OwnedBatch& batch = update.work[i];
  Optimizer& optimizer = *replica.groups()[batch.group].optimizer;
  StepArgs args = update.args[batch.group];
  const float scale = static_cast<float>(clip_scale);
  // Clipped in the optimizer's update where it can (no pass of its own over the gradient).
  const bool clip = clip_scale < 1.0;
  const bool folded = clip && optimizer.scales_gradient();
  if (folded) args.grad_scale = scale;
  std::vector<StepOperands> operands;
  operands.reserve(batch.params.size());
  for (int p : batch.params) {
    if (clip && !folded) OPTSTEP_RETURN_IF_ERROR(device.Scale(scale, replica.grad(p)));
    operands.push_back({&replica.grad(p), &replica.param(p), &replica.state(p)});
  }
  return optimizer.StepBatch(device, args, operands);
}

void CountOwnedUpdate(ReplicaState& replica) {
  for (GroupRuntime& group : replica.groups()) ++group.applied_steps;
}

}  // namespace optstep
