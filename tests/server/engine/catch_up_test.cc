// A heal's catch-up (server/rpc/heal.h, kCatchUp; docs/design.md, "State redundancy"): a ring
// collective cut by a rank's death can complete on some ranks and fail on others, and the ranks
// a step behind take that step's masters and counters from one that finished it, also a rank
// just healed in; the run then ends bit for bit as an undisturbed one. A rank whose own update of
// the step was not applied is refused the catch-up. Ranks are engines in this process joined by
// gloo (RedundancyGroup).

#include <optional>
#include <vector>

#include "gtest/gtest.h"
#include "server/engine/engine.h"
#include "tests/server/engine/redundancy_group.h"
#include "tests/testing/status_matchers.h"

namespace optstep {
namespace {

using ::optstep::testutil::ConfigOf;
using ::optstep::testutil::Difference;
using ::optstep::testutil::ExpectSameState;
using ::optstep::testutil::FaultInjector;
using ::optstep::testutil::RedundancyGroup;
using ::optstep::testutil::StatusIs;

// Rank 2 dies in step 3's last collective (the all-gather; the barrier under OWNERS storage) once
// its part went out, and rank 1's fails with it while rank 0's completes (a ring collective cut
// by a death can end so): rank 0 finished step 3 and its trainers may have seen it; rank 1 is
// interrupted in it. Rank 1's shadow of rank 0 takes step 3 all the same. Rank 2 is healed (from
// rank 0: its buddy and a rank that finished the step), rank 1 takes rank 0's masters and
// counters (the heal's catch-up, heal.h), and the run ends as an undisturbed one.
class SplitStepTest : public testing::TestWithParam<ParameterStorage> {};

TEST_P(SplitStepTest, ACollectiveCompletedOnSomeRanksOnlyIsCaughtUpByTheOthers) {
  SessionConfig config = ConfigOf("muon");
  config.storage = GetParam();
  const char* last = GetParam() == ParameterStorage::kOwners ? "Barrier" : "AllGatherV";
  RedundancyGroup reference(3, config);
  for (uint64_t step = 1; step <= 5; ++step) ASSERT_NO_FATAL_FAILURE(reference.StepOk(step));

  RedundancyGroup group(3, config);
  for (uint64_t step = 1; step <= 2; ++step) ASSERT_NO_FATAL_FAILURE(group.StepOk(step));
  for (int r : {1, 2}) {
    FaultInjector& faults = group.comm(r).faults();
    faults.FailAfterCall(last, faults.calls(last) + 1,
                         absl::UnavailableError("injected: rank 2 dies"));
  }
  const std::vector<absl::StatusOr<StepOutcome>> outcomes = group.Step(3);
  OPTSTEP_EXPECT_OK(outcomes[0].status());
  EXPECT_THAT(outcomes[1].status(), StatusIs(absl::StatusCode::kUnavailable));
  EXPECT_EQ(group.session(1).interrupted_step(), std::optional<uint64_t>(3));
  EXPECT_EQ(Difference(group.Shadow(1), group.OwnedState(0)), "");

  group.Regroup(/*replaced=*/2);
  OPTSTEP_ASSERT_OK(group.ImportMasters(2, group.Masters(0)));
  OPTSTEP_ASSERT_OK(group.ImportOwnedState(2, group.Shadow(0)));
  OPTSTEP_ASSERT_OK(group.ImportShadow(2, group.OwnedState(1)));
  OPTSTEP_ASSERT_OK(group.CatchUp(1, group.Masters(0)));
  EXPECT_EQ(group.session(1).interrupted_step(), std::nullopt);  // nothing left to redo
  for (int r = 0; r < 3; ++r) group.session(r).ResumeAfterHeal();
  for (uint64_t step = 4; step <= 5; ++step) ASSERT_NO_FATAL_FAILURE(group.StepOk(step));
  ExpectSameState(group, reference);
}

// As above, but rank 0 is the one interrupted in step 3 and rank 1 finished it. Rank 2, healed,
// takes its masters and counters from rank 0 (step 2) and its own state from rank 0's shadow of
// it, which took step 3: it is a step behind too, and both catch up from rank 1.
TEST_P(SplitStepTest, AHealedRankBehindTheFinishedOneIsCaughtUpToo) {
  SessionConfig config = ConfigOf("muon");
  config.storage = GetParam();
  const char* last = GetParam() == ParameterStorage::kOwners ? "Barrier" : "AllGatherV";
  RedundancyGroup reference(3, config);
  for (uint64_t step = 1; step <= 5; ++step) ASSERT_NO_FATAL_FAILURE(reference.StepOk(step));

  RedundancyGroup group(3, config);
  for (uint64_t step = 1; step <= 2; ++step) ASSERT_NO_FATAL_FAILURE(group.StepOk(step));
  for (int r : {0, 2}) {
    FaultInjector& faults = group.comm(r).faults();
    faults.FailAfterCall(last, faults.calls(last) + 1,
                         absl::UnavailableError("injected: rank 2 dies"));
  }
  const std::vector<absl::StatusOr<StepOutcome>> outcomes = group.Step(3);
  OPTSTEP_EXPECT_OK(outcomes[1].status());
  EXPECT_EQ(group.session(0).interrupted_step(), std::optional<uint64_t>(3));

  group.Regroup(/*replaced=*/2);
  OPTSTEP_ASSERT_OK(group.ImportMasters(2, group.Masters(0)));
  OPTSTEP_ASSERT_OK(group.ImportOwnedState(2, group.Shadow(0)));
  OPTSTEP_ASSERT_OK(group.ImportShadow(2, group.OwnedState(1)));
  OPTSTEP_ASSERT_OK(group.CatchUp(0, group.Masters(1)));
  OPTSTEP_ASSERT_OK(group.CatchUp(2, group.Masters(1)));
  for (int r = 0; r < 3; ++r) group.session(r).ResumeAfterHeal();
  for (uint64_t step = 4; step <= 5; ++step) ASSERT_NO_FATAL_FAILURE(group.StepOk(step));
  ExpectSameState(group, reference);
}

// A state import cut part way leaves ranks a step apart, with no update of the step applied on
// the one behind: here rank 1 is at step 2, and a peer's masters are at step 3. Before, a heal's
// catch-up gave rank 1 those masters and counters beside its own optimizer state of step 2; it
// is refused now, and rank 1 keeps what it had.
TEST(CatchUpTest, ARankWhoseUpdateOfTheStepWasNotAppliedIsRefused) {
  const SessionConfig config = ConfigOf("adamw");
  RedundancyGroup ahead(3, config);
  for (uint64_t step = 1; step <= 3; ++step) ASSERT_NO_FATAL_FAILURE(ahead.StepOk(step));
  RedundancyGroup group(3, config);
  for (uint64_t step = 1; step <= 2; ++step) ASSERT_NO_FATAL_FAILURE(group.StepOk(step));
  const StateDict before = group.Masters(1);
  EXPECT_THAT(group.CatchUp(1, ahead.Masters(0)),
              StatusIs(absl::StatusCode::kFailedPrecondition, "cannot take the masters of step 3"));
  EXPECT_EQ(Difference(group.Masters(1), before), "");
  EXPECT_EQ(group.session(1).stats().step, 2u);
}

INSTANTIATE_TEST_SUITE_P(Storage, SplitStepTest,
                         testing::Values(ParameterStorage::kReplicated, ParameterStorage::kOwners),
                         [](const testing::TestParamInfo<ParameterStorage>& info) {
                           return info.param == ParameterStorage::kOwners ? "Owners" : "Replicated";
                         });

}  // namespace
}  // namespace optstep
