#ifndef OPTSTEP_SERVER_ENGINE_STEP_SCHEDULE_H_
#define OPTSTEP_SERVER_ENGINE_STEP_SCHEDULE_H_

// The learning rate and weight decay each hyperparameter group steps with: the group's
// optimizer defaults, overridden for one step by what the trainers send with it
// (StepBegin::schedules). Every trainer of a step must send the same values.

#include <cstdint>
#include <map>
#include <optional>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace optstep {

// This step's schedule values for one group; unset values keep the group's defaults.
struct GroupStepValues {
  std::optional<double> lr;
  std::optional<double> weight_decay;
};

// The values one group steps with in one step (named apart from the client's GroupSchedule,
// which a binary may link too).
struct GroupStepSchedule {
  double lr = 0.0;
  double weight_decay = 0.0;  // before the parameter's wd_mult

  bool operator==(const GroupStepSchedule& o) const {
    return lr == o.lr && weight_decay == o.weight_decay;
  }
  bool operator!=(const GroupStepSchedule& o) const { return !(*this == o); }
};

// One step's schedule, indexed by group id.
using StepSchedule = std::vector<GroupStepSchedule>;

// `defaults` with the values of `values` (by group id) in their place.
// INVALID_ARGUMENT naming `step` and the group: a group id outside `defaults`, a value that the
// creation checks refuse (CheckLearningRate, CheckWeightDecay: not finite, negative or over its
// bound).
absl::StatusOr<StepSchedule> ResolveSchedule(const StepSchedule& defaults, uint64_t step,
                                             const std::map<int, GroupStepValues>& values);

// OK when `trainer`'s schedule `mine` for `step` equals `theirs` (another trainer's);
// INVALID_ARGUMENT naming the first group that differs and both values otherwise.
// REQUIRES: mine.size() == theirs.size().
absl::Status CheckSameSchedule(uint64_t step, int trainer, const StepSchedule& mine,
                               const StepSchedule& theirs);

}  // namespace optstep

#endif  // OPTSTEP_SERVER_ENGINE_STEP_SCHEDULE_H_
