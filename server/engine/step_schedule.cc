#include "server/engine/step_schedule.h"

#include "absl/strings/str_cat.h"
#include "base/status_macros.h"
#include "server/optim/hyperparameter_checks.h"

namespace optstep {
namespace {

// Puts `value` (when set) into `slot` if it is finite and in [0, max]: the bounds a group's lr
// and weight decay have at creation (server/optim/hyperparameter_checks.h).
absl::Status Override(uint64_t step, int group, const char* name,
                      const std::optional<double>& value, double max, double& slot) {
  if (!value) return absl::OkStatus();
  OPTSTEP_RETURN_IF_ERROR(
      CheckNonNegative(absl::StrCat("step ", step, ": group ", group), name, *value, max));
  slot = *value;
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<StepSchedule> ResolveSchedule(const StepSchedule& defaults, uint64_t step,
                                             const std::map<int, GroupStepValues>& values) {
  StepSchedule schedule = defaults;
  for (const auto& [group, given] : values) {
    if (group < 0 || group >= static_cast<int>(schedule.size())) {
      return absl::InvalidArgumentError(absl::StrCat(
          "step ", step, ": unknown group ", group, " (session has ", schedule.size(), " groups)"));
    }
    OPTSTEP_RETURN_IF_ERROR(
        Override(step, group, "lr", given.lr, kMaxLearningRate, schedule[group].lr));
    OPTSTEP_RETURN_IF_ERROR(Override(step, group, "weight_decay", given.weight_decay,
                                     kMaxWeightDecay, schedule[group].weight_decay));
  }
  return schedule;
}

absl::Status CheckSameSchedule(uint64_t step, int trainer, const StepSchedule& mine,
                               const StepSchedule& theirs) {
  for (size_t g = 0; g < mine.size(); ++g) {
    if (mine[g] != theirs[g]) {
      return absl::InvalidArgumentError(
          absl::StrCat("step ", step, ": trainer ", trainer, " gives group ", g, " lr ", mine[g].lr,
                       ", weight_decay ", mine[g].weight_decay, " but another trainer gave lr ",
                       theirs[g].lr, ", weight_decay ", theirs[g].weight_decay));
    }
  }
  return absl::OkStatus();
}

}  // namespace optstep
