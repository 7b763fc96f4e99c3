// A step's schedule: the groups' defaults with the trainers' values in their place, checked
// (known group, finite and >= 0), and the same for every trainer of the step.

#include "server/engine/step_schedule.h"

#include <cmath>
#include <limits>
#include <map>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/status_matchers.h"

namespace optstep {
namespace {

using ::optstep::testutil::IsOk;
using ::optstep::testutil::StatusIs;

const StepSchedule kDefaults = {{0.1, 0.01}, {0.02, 0.0}};

TEST(StepScheduleTest, NoValuesKeepTheDefaults) {
  auto schedule = ResolveSchedule(kDefaults, 1, {});
  ASSERT_THAT(schedule.status(), IsOk());
  EXPECT_EQ(*schedule, kDefaults);
}

TEST(StepScheduleTest, GivenValuesReplaceOnlyTheirOwnField) {
  std::map<int, GroupStepValues> values;
  values[1].lr = 0.5;
  values[0].weight_decay = 0.0;
  auto schedule = ResolveSchedule(kDefaults, 4, values);
  ASSERT_THAT(schedule.status(), IsOk());
  EXPECT_EQ((*schedule)[0], (GroupStepSchedule{0.1, 0.0}));
  EXPECT_EQ((*schedule)[1], (GroupStepSchedule{0.5, 0.0}));
}

TEST(StepScheduleTest, UnknownGroupsAndInvalidValuesAreRefusedByName) {
  std::map<int, GroupStepValues> unknown;
  unknown[2].lr = 0.1;
  EXPECT_THAT(ResolveSchedule(kDefaults, 3, unknown).status(),
              StatusIs(absl::StatusCode::kInvalidArgument, "step 3: unknown group 2"));
  std::map<int, GroupStepValues> negative;
  negative[-1].lr = 0.1;
  EXPECT_THAT(ResolveSchedule(kDefaults, 3, negative).status(),
              StatusIs(absl::StatusCode::kInvalidArgument, "unknown group -1"));
  for (double bad : {-1.0, std::numeric_limits<double>::infinity(), std::nan("")}) {
    std::map<int, GroupStepValues> values;
    values[1].weight_decay = bad;
    EXPECT_THAT(ResolveSchedule(kDefaults, 5, values).status(),
                StatusIs(absl::StatusCode::kInvalidArgument, "group 1: weight_decay"));
    values[1].weight_decay.reset();
    values[0].lr = bad;
    EXPECT_THAT(ResolveSchedule(kDefaults, 5, values).status(),
                StatusIs(absl::StatusCode::kInvalidArgument, "must be finite and >= 0"));
  }
  // The bounds a group has at creation hold for a step's values too.
  std::map<int, GroupStepValues> huge;
  huge[0].lr = 1e30;
  EXPECT_THAT(
      ResolveSchedule(kDefaults, 5, huge).status(),
      StatusIs(absl::StatusCode::kInvalidArgument, "step 5: group 0: lr = 1e+30 must be <= 1000"));
  huge[0].lr = 1000.0;
  huge[1].weight_decay = 1001.0;
  EXPECT_THAT(ResolveSchedule(kDefaults, 5, huge).status(),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       "step 5: group 1: weight_decay = 1001 must be <= 1000"));
  huge[1].weight_decay = 1000.0;
  EXPECT_THAT(ResolveSchedule(kDefaults, 5, huge).status(), IsOk());
}

TEST(StepScheduleTest, TrainersOfAStepMustGiveTheSameValues) {
  EXPECT_THAT(CheckSameSchedule(2, 1, kDefaults, kDefaults), IsOk());
  StepSchedule other = kDefaults;
  other[1].weight_decay = 0.25;
  EXPECT_THAT(CheckSameSchedule(2, 1, other, kDefaults),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       "trainer 1 gives group 1 lr 0.02, weight_decay 0.25 but another trainer "
                       "gave lr 0.02, weight_decay 0"));
}

}  // namespace
}  // namespace optstep
