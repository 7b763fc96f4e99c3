#include "server/engine/step_schedule.h"

#include <string>

#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "base/status_macros.h"
#include "server/optim/hyperparameter_checks.h"

namespace optstep {
namespace {

// Puts `value` (when set) into `slot` if `check` (the check the value has at creation,
// server/optim/hyperparameter_checks.h) accepts it.
absl::Status Override(absl::string_view owner, absl::Status (*check)(absl::string_view, double),
                      const std::optional<double>& value, double& slot) {
  if (!value) return absl::OkStatus();
  OPTSTEP_RETURN_IF_ERROR(check(owner, *value));
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
    const std::string owner = absl::StrCat("step ", step, ": group ", group);
    OPTSTEP_RETURN_IF_ERROR(Override(owner, CheckLearningRate, given.lr, schedule[group].lr));
    OPTSTEP_RETURN_IF_ERROR(
        Override(owner, CheckWeightDecay, given.weight_decay, schedule[group].weight_decay));
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
