// A heal's catch-up (server/rpc/heal.h, kCatchUp; docs/design.md, "State redundancy"): a ring
// collective cut by a rank's death can complete on some ranks and fail on others, and the ranks
// a step behind take that step's masters and counters from one that finished it, also a rank
// just healed in; the run then ends bit for bit as an undisturbed one. A rank whose own update of
// the step was not applied is refused the catch-up. Ranks are engines in this process joined by
// gloo (RedundancyGroup).

#include <memory>
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
// its part went out, and of the other two ranks one's fails with it while the other's completes
// (a ring collective cut by a death can end so): that one finished step 3 and its trainers may
// have seen it. Rank 2 is healed from rank 0 (its buddy, which holds its shadow, and the rank it
// takes the masters and counters from), the ranks a step behind take the finished rank's
// masters and counters (the heal's catch-up, heal.h), and the run ends as an undisturbed one.
class SplitStepTest : public testing::TestWithParam<ParameterStorage> {
 protected:
  SplitStepTest() {
    config_ = ConfigOf("muon");
    config_.storage = GetParam();
  }

  // Steps a reference 5 times undisturbed, and group_ twice; then step 3, in which rank 2 and
  // rank `cut` fail their last collective once their parts went out.
  void SplitStepThree(int cut) {
    reference_ = std::make_unique<RedundancyGroup>(3, config_);
    for (uint64_t step = 1; step <= 5; ++step) ASSERT_NO_FATAL_FAILURE(reference_->StepOk(step));
    group_ = std::make_unique<RedundancyGroup>(3, config_);
    for (uint64_t step = 1; step <= 2; ++step) ASSERT_NO_FATAL_FAILURE(group_->StepOk(step));
    const char* last = GetParam() == ParameterStorage::kOwners ? "Barrier" : "AllGatherV";
    for (int r : {cut, 2}) {
      FaultInjector& faults = group_->comm(r).faults();
      faults.FailAfterCall(last, faults.calls(last) + 1,
                           absl::UnavailableError("injected: rank 2 dies"));
    }
    const std::vector<absl::StatusOr<StepOutcome>> outcomes = group_->Step(3);
    OPTSTEP_EXPECT_OK(outcomes[1 - cut].status());
    EXPECT_THAT(outcomes[cut].status(), StatusIs(absl::StatusCode::kUnavailable));
    EXPECT_EQ(group_->session(cut).interrupted_step(), std::optional<uint64_t>(3));
  }

  // Rank 2 healed from rank 0, as rank 0 heals a rank other than itself.
  void HealRankTwo() {
    group_->Regroup(/*replaced=*/2);
    OPTSTEP_ASSERT_OK(group_->ImportMasters(2, group_->Masters(0)));
    OPTSTEP_ASSERT_OK(group_->ImportOwnedState(2, group_->Shadow(0)));
    OPTSTEP_ASSERT_OK(group_->ImportShadow(2, group_->OwnedState(1)));
  }

  // Every rank resumes, steps 4 and 5, and ends as the reference.
  void ExpectSteppedOnAsUndisturbed() {
    for (int r = 0; r < 3; ++r) group_->session(r).ResumeAfterHeal(/*generation=*/1);
    for (uint64_t step = 4; step <= 5; ++step) ASSERT_NO_FATAL_FAILURE(group_->StepOk(step));
    ExpectSameState(*group_, *reference_);
  }

  SessionConfig config_;
  std::unique_ptr<RedundancyGroup> reference_;
  std::unique_ptr<RedundancyGroup> group_;
};

// Rank 1 is interrupted; rank 0 finished the step. Rank 1's shadow of rank 0 takes step 3 all
// the same, and rank 1 catches up from rank 0.
TEST_P(SplitStepTest, ACollectiveCompletedOnSomeRanksOnlyIsCaughtUpByTheOthers) {
  ASSERT_NO_FATAL_FAILURE(SplitStepThree(/*cut=*/1));
  EXPECT_EQ(Difference(group_->Shadow(1), group_->OwnedState(0)), "");
  ASSERT_NO_FATAL_FAILURE(HealRankTwo());
  OPTSTEP_ASSERT_OK(group_->CatchUp(1, group_->Masters(0)));
  EXPECT_EQ(group_->session(1).interrupted_step(), std::nullopt);  // nothing left to redo
  ExpectSteppedOnAsUndisturbed();
}

// Rank 0 is interrupted; rank 1 finished the step. Rank 2, healed, takes its masters and
// counters from rank 0 (step 2) and its own state from rank 0's shadow of it, which took step
// 3: it is a step behind too, and both catch up from rank 1.
TEST_P(SplitStepTest, AHealedRankBehindTheFinishedOneIsCaughtUpToo) {
  ASSERT_NO_FATAL_FAILURE(SplitStepThree(/*cut=*/0));
  ASSERT_NO_FATAL_FAILURE(HealRankTwo());
  OPTSTEP_ASSERT_OK(group_->CatchUp(0, group_->Masters(1)));
  OPTSTEP_ASSERT_OK(group_->CatchUp(2, group_->Masters(1)));
  ExpectSteppedOnAsUndisturbed();
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
