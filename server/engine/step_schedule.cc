#include "server/engine/step_schedule.h"

#include <cmath>

#include "absl/strings/str_cat.h"
#include "base/status_macros.h"

namespace optstep {
namespace {

// Puts `value` (when set) into `slot` if it is finite and >= 0.
absl::Status Override(uint64_t step, int group, const char* name,
                      const std::optional<double>& value, double& slot) {
  if (!value) return absl::OkStatus();
  if (!std::isfinite(*value) || *value < 0) {
    return absl::InvalidArgumentError(absl::StrCat("step ", step, ": group ", group, ": ", name,
                                                   " = ", *value, " must be finite and >= 0"));
  }
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
    OPTSTEP_RETURN_IF_ERROR(Override(step, group, "lr", given.lr, schedule[group].lr));
    OPTSTEP_RETURN_IF_ERROR(
        Override(step, group, "weight_decay", given.weight_decay, schedule[group].weight_decay));
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
