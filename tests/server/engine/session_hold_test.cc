// Holds (consistent points for checkpoints and state dicts) on one rank: a held session starts
// no new step resolution, settles at the resolution it is told, lets go when released or when
// its lease passes, and replaces its state only through a validated, staged state.

#include <cstdlib>
#include <cstring>
#include <memory>
#include <thread>
#include <vector>

#include "absl/synchronization/notification.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/engine/engine.h"
#include "tests/server/engine/session_test_util.h"
#include "tests/testing/fault_injecting_device.h"
#include "tests/testing/status_matchers.h"

namespace optstep {
namespace {

using ::optstep::testutil::IsOk;
using ::optstep::testutil::Outcome;
using ::optstep::testutil::StatusIs;

class SessionHoldTest : public ::testing::Test {
 protected:
  void SetUp() override {
    engine_ = testutil::MakeEngine(/*num_threads=*/1);
    ASSERT_NE(engine_, nullptr);
    s_ = testutil::MakeSession(*engine_, testutil::TwoParamConfig(testutil::AdamW(0.1, 0.0)));
    ASSERT_NE(s_, nullptr);
  }

  // Sends a whole step's gradients from trainer 0 and commits it.
  void CommitStep(uint64_t step, Outcome& outcome) {
    StepBegin begin;
    begin.step = step;
    auto c = s_->Begin(begin);
    ASSERT_THAT(c.status(), IsOk());
    std::vector<float> w = {0.5f, -1, 2, 0.25f, 1, -0.5f}, b = {1, 2, 3};
    ASSERT_THAT(s_->AddGradient(*c, 0, 0, DType::kF32, w.data(), 24), IsOk());
    ASSERT_THAT(s_->AddGradient(*c, 1, 0, DType::kF32, b.data(), 12), IsOk());
    ASSERT_THAT(s_->Commit(*c, 0, outcome.Callback()), IsOk());
  }

  std::string Param(uint64_t token) {
    auto dict = s_->holds().ExportHeld(token, StateSelection{});
    EXPECT_THAT(dict.status(), IsOk());
    return dict.ok() ? (*dict)->at("param/w").bytes : "";
  }

  std::unique_ptr<Engine> engine_;
  std::shared_ptr<Session> s_;
};

TEST_F(SessionHoldTest, HeldSessionDefersAStepUntilReleased) {
  auto started = s_->holds().Hold(7, absl::Seconds(30));
  ASSERT_THAT(started.status(), IsOk());
  EXPECT_EQ(*started, 0u);
  Outcome step1;
  CommitStep(1, step1);
  EXPECT_FALSE(step1.WaitFor(absl::Milliseconds(200)));  // held: not resolved
  auto point = s_->holds().Settle(7, 0, absl::Now() + absl::Seconds(5), absl::Seconds(30));
  ASSERT_THAT(point.status(), IsOk());
  EXPECT_EQ(point->step, 0u);
  const std::string before = Param(7);
  // A second holder is refused while the first holds.
  EXPECT_THAT(s_->holds().Hold(8, absl::Seconds(30)).status(),
              StatusIs(absl::StatusCode::kAborted, "in progress"));
  ASSERT_THAT(s_->holds().Release(7), IsOk());
  ASSERT_TRUE(step1.WaitFor(absl::Seconds(10)));
  ASSERT_THAT(step1.result().status(), IsOk());
  EXPECT_EQ(step1.result()->step, 1u);
  // Released: operations under the old token are refused.
  EXPECT_THAT(s_->holds().ExportHeld(7, StateSelection{}).status(),
              StatusIs(absl::StatusCode::kAborted, "not active"));
  ASSERT_THAT(s_->holds().Hold(8, absl::Seconds(30)).status(), IsOk());
  ASSERT_THAT(s_->holds().Settle(8, 1, absl::Now() + absl::Seconds(5), absl::Seconds(30)).status(),
              IsOk());
  EXPECT_NE(Param(8), before);
  ASSERT_THAT(s_->holds().Release(8), IsOk());
}

TEST_F(SessionHoldTest, SettleRunsTheResolutionsAlreadyBegunElsewhere) {
  ASSERT_THAT(s_->holds().Hold(1, absl::Seconds(30)).status(), IsOk());
  Outcome step1;
  CommitStep(1, step1);
  // Another rank started resolution 1: this rank must run it too, then stop.
  auto point = s_->holds().Settle(1, 1, absl::Now() + absl::Seconds(10), absl::Seconds(30));
  ASSERT_THAT(point.status(), IsOk());
  EXPECT_EQ(point->resolutions, 1u);
  EXPECT_EQ(point->step, 1u);
  ASSERT_TRUE(step1.WaitFor(absl::Seconds(1)));
  Outcome step2;
  CommitStep(2, step2);
  EXPECT_FALSE(step2.WaitFor(absl::Milliseconds(200)));
  // A target below what this rank started is refused.
  ASSERT_THAT(s_->holds().Release(1), IsOk());
  ASSERT_TRUE(step2.WaitFor(absl::Seconds(10)));
  ASSERT_THAT(s_->holds().Hold(2, absl::Seconds(30)).status(), IsOk());
  EXPECT_THAT(s_->holds().Settle(2, 1, absl::Now() + absl::Seconds(1), absl::Seconds(30)).status(),
              StatusIs(absl::StatusCode::kInvalidArgument, "already started 2"));
  ASSERT_THAT(s_->holds().Release(2), IsOk());
}

TEST_F(SessionHoldTest, HoldWhenFreeWaitsForTheOtherHoldToEnd) {
  ASSERT_THAT(s_->holds().Hold(7, absl::Seconds(30)).status(), IsOk());
  std::thread release([&] {
    absl::SleepFor(absl::Milliseconds(300));
    ASSERT_THAT(s_->holds().Release(7), IsOk());
  });
  const absl::Time start = absl::Now();
  const absl::StatusOr<uint64_t> held =
      s_->holds().HoldWhenFree(8, absl::Seconds(30), absl::Now() + absl::Seconds(20));
  release.join();
  ASSERT_THAT(held.status(), IsOk());
  EXPECT_GE(absl::Now() - start, absl::Milliseconds(250));
  // Now 8 holds: a third token is refused at once without a wait, and after its wait.
  EXPECT_THAT(s_->holds().Hold(9, absl::Seconds(30)).status(),
              StatusIs(absl::StatusCode::kAborted, "in progress"));
  EXPECT_THAT(s_->holds()
                  .HoldWhenFree(9, absl::Seconds(30), absl::Now() + absl::Milliseconds(100))
                  .status(),
              StatusIs(absl::StatusCode::kAborted, "in progress"));
  ASSERT_THAT(s_->holds().Release(8), IsOk());
}

TEST_F(SessionHoldTest, HoldWhenFreeTakesOverALeaseThatPasses) {
  ASSERT_THAT(s_->holds().Hold(7, absl::Milliseconds(200)).status(), IsOk());  // never released
  EXPECT_THAT(
      s_->holds().HoldWhenFree(8, absl::Seconds(30), absl::Now() + absl::Seconds(20)).status(),
      IsOk());
  ASSERT_THAT(s_->holds().Release(8), IsOk());
}

TEST_F(SessionHoldTest, AnExpiredLeaseLetsStepsContinue) {
  ASSERT_THAT(s_->holds().Hold(3, absl::Milliseconds(100)).status(), IsOk());
  Outcome step1;
  CommitStep(1, step1);
  // Nobody releases: the engine's watcher ends the hold once the lease passes.
  ASSERT_TRUE(step1.WaitFor(absl::Seconds(10)));
  EXPECT_THAT(step1.result().status(), IsOk());
  EXPECT_THAT(s_->holds().ExportHeld(3, StateSelection{}).status(),
              StatusIs(absl::StatusCode::kAborted, "lease"));
}

// A session held and settled with a lease of 300 ms, with `step` its step 1 committed meanwhile
// (deferred by the hold), and every copy of a tensor to the host slowed by `delay`.
class SessionHoldLeaseTest : public ::testing::Test {
 protected:
  static constexpr absl::Duration kLease = absl::Milliseconds(300);

  void Hold(absl::Duration delay, bool step) {
    device_ = testutil::FaultInjectingCpuDevice();
    ASSERT_NE(device_, nullptr);
    engine_ = testutil::MakeEngineOn(device_);
    ASSERT_NE(engine_, nullptr);
    s_ = testutil::MakeSession(*engine_, testutil::TwoParamConfig(testutil::AdamW(0.1, 0.0)));
    ASSERT_NE(s_, nullptr);
    ASSERT_THAT(s_->holds().Hold(3, kLease).status(), IsOk());
    ASSERT_THAT(s_->holds().Settle(3, 0, absl::Now() + absl::Milliseconds(100), kLease).status(),
                IsOk());
    if (step) {
      const StepHandle c = testutil::BeginStep(*s_, 1, 0);
      ASSERT_THAT(testutil::SendGradient(*s_, c, 0, 0, std::vector<float>(6, 0.5f)), IsOk());
      ASSERT_THAT(testutil::SendGradient(*s_, c, 1, 0, std::vector<float>(3, 0.5f)), IsOk());
      ASSERT_THAT(s_->Commit(c, 0, step1_.Callback()), IsOk());
    }
    device_->faults().DelayCalls("CopyToHost", device_->faults().calls("CopyToHost") + 1,
                                 testutil::FaultInjector::kForever, delay);
  }

  std::shared_ptr<testutil::FaultInjectingDevice> device_;
  std::unique_ptr<Engine> engine_;
  std::shared_ptr<Session> s_;
  Outcome step1_;
};

// A copy of the held state that outlasts the hold's lease is refused: the engine's watcher ended
// the hold meanwhile, which lets a pending step resolve while the tensors are read, so the copy
// may hold parts of two steps (no step is pending here: the test would race with it). Before, it
// was answered, and an automatic save (which copies, then releases) committed it as the held
// step's state.
TEST_F(SessionHoldLeaseTest, ACopyThatOutlastsTheHoldsLeaseIsRefused) {
  ASSERT_NO_FATAL_FAILURE(Hold(absl::Milliseconds(300), /*step=*/false));
  EXPECT_THAT(s_->holds().ExportHeld(3, StateSelection{}).status(),
              StatusIs(absl::StatusCode::kAborted, "lease"));
}

// A copy told the lease renews the hold as it goes, so that a copy longer than the lease (a large
// shard) is answered, and the step waits for it. Before the refusal above had this, such a copy
// was refused every time, and an automatic save never committed.
TEST_F(SessionHoldLeaseTest, ACopyThatRenewsTheLeaseAsItGoesIsAnswered) {
  ASSERT_NO_FATAL_FAILURE(Hold(absl::Milliseconds(100), /*step=*/true));
  EXPECT_THAT(s_->holds().ExportHeld(3, StateSelection{}, kLease).status(), IsOk());
  EXPECT_FALSE(step1_.WaitFor(absl::Milliseconds(10))) << "the step resolved under the hold";
  device_->faults().Clear();
  ASSERT_THAT(s_->holds().Release(3), IsOk());
  ASSERT_TRUE(step1_.WaitFor(absl::Seconds(10)));
  EXPECT_THAT(step1_.result().status(), IsOk());
}

// A copy whose renewal finds the hold gone (a tensor read for longer than the lease) stops there:
// a step may be writing the tensors it has yet to read. Before, it read them all, and was refused
// only at the end.
TEST_F(SessionHoldLeaseTest, ACopyStopsAtTheFirstRenewalThatFindsTheHoldGone) {
  ASSERT_NO_FATAL_FAILURE(Hold(absl::Milliseconds(500), /*step=*/false));
  const int64_t before = device_->faults().calls("CopyToHost");
  EXPECT_THAT(s_->holds().ExportHeld(3, StateSelection{}, kLease).status(),
              StatusIs(absl::StatusCode::kAborted, "lease"));
  EXPECT_LE(device_->faults().calls("CopyToHost") - before, 2) << "it read on";
}

TEST_F(SessionHoldTest, StagedStateIsValidatedThenAppliedAndAbortsThePendingStep) {
  Outcome step1;
  CommitStep(1, step1);
  ASSERT_TRUE(step1.WaitFor(absl::Seconds(10)));
  ASSERT_THAT(s_->holds().Hold(4, absl::Seconds(30)).status(), IsOk());
  ASSERT_THAT(s_->holds().Settle(4, 1, absl::Now() + absl::Seconds(5), absl::Seconds(30)).status(),
              IsOk());
  auto saved = s_->holds().ExportHeld(4, StateSelection{});
  ASSERT_THAT(saved.status(), IsOk());
  ASSERT_THAT(s_->holds().Release(4), IsOk());

  Outcome step2;
  CommitStep(2, step2);
  ASSERT_TRUE(step2.WaitFor(absl::Seconds(10)));
  ASSERT_THAT(s_->holds().Hold(5, absl::Seconds(30)).status(), IsOk());
  Outcome step3;
  CommitStep(3, step3);  // committed while held: deferred, then aborted by the load
  ASSERT_THAT(s_->holds().Settle(5, 2, absl::Now() + absl::Seconds(5), absl::Seconds(30)).status(),
              IsOk());
  const std::string at_step2 = Param(5);

  // Incomplete (a missing key) or invalid: refused, nothing staged, nothing changed.
  StateDict partial = **saved;
  partial.erase("state/adam/w/exp_avg");
  EXPECT_THAT(s_->holds().StageState(5, std::make_shared<StateDict>(partial), /*complete=*/true),
              StatusIs(absl::StatusCode::kDataLoss, "'state/adam/w/exp_avg'"));
  StateDict wrong = **saved;
  wrong["param/b"].shape = {1, 3};
  EXPECT_THAT(s_->holds().StageState(5, std::make_shared<StateDict>(wrong), /*complete=*/false),
              StatusIs(absl::StatusCode::kInvalidArgument, "'param/b'"));
  EXPECT_THAT(s_->holds().ApplyStaged(5),
              StatusIs(absl::StatusCode::kFailedPrecondition, "no state"));
  EXPECT_EQ(Param(5), at_step2);

  ASSERT_THAT(s_->holds().StageState(5, *saved, /*complete=*/true), IsOk());
  ASSERT_THAT(s_->holds().ApplyStaged(5), IsOk());
  ASSERT_TRUE(step3.WaitFor(absl::Seconds(1)));
  EXPECT_THAT(step3.result().status(), StatusIs(absl::StatusCode::kAborted, "state was replaced"));
  EXPECT_EQ(Param(5), (*saved)->at("param/w").bytes);
  EXPECT_EQ(s_->stats().step, 1u);
  ASSERT_THAT(s_->holds().Release(5), IsOk());
  // Training continues from the restored step.
  Outcome again;
  CommitStep(2, again);
  ASSERT_TRUE(again.WaitFor(absl::Seconds(10)));
  ASSERT_THAT(again.result().status(), IsOk());
  EXPECT_EQ(again.result()->step, 2u);
}

// Each applied replacement is counted with the step it set, for the automatic checkpointer to
// abandon the timeline it left from the lowest of those it has not seen; of more than the session
// keeps, the lowest let go stands for those (a lower step, never a higher one).
TEST_F(SessionHoldTest, ReplacementsAreCountedWithTheStepsTheySet) {
  Outcome step1;
  CommitStep(1, step1);
  ASSERT_TRUE(step1.WaitFor(absl::Seconds(10)));
  ASSERT_THAT(s_->holds().Hold(1, absl::Seconds(30)).status(), IsOk());
  ASSERT_THAT(s_->holds().Settle(1, 1, absl::Now() + absl::Seconds(5), absl::Seconds(30)).status(),
              IsOk());
  auto at_step1 = s_->holds().ExportHeld(1, StateSelection{});
  ASSERT_THAT(at_step1.status(), IsOk());
  EXPECT_FALSE(s_->ReplacementsSince(0).lowest_step.has_value());
  // The state of step 1 at step 1 first, then at step 7 and later steps.
  const auto replace_at = [&](uint64_t step) {
    auto dict = std::make_shared<StateDict>(**at_step1);
    StateTensor& counter = dict->at("meta/step");
    std::memcpy(counter.bytes.data(), &step, sizeof(step));
    ASSERT_THAT(s_->holds().StageState(1, dict, /*complete=*/false), IsOk());
    ASSERT_THAT(s_->holds().ApplyStaged(1), IsOk());
  };
  ASSERT_NO_FATAL_FAILURE(replace_at(1));
  for (uint64_t step = 7; step < 7 + Session::kKeptReplacements; ++step) {
    ASSERT_NO_FATAL_FAILURE(replace_at(step));
  }
  ASSERT_THAT(s_->holds().Release(1), IsOk());
  const uint64_t all = Session::kKeptReplacements + 1;
  EXPECT_EQ(s_->ReplacementsSince(0).count, all);
  EXPECT_EQ(s_->ReplacementsSince(0).lowest_step, 1u);  // the first, let go
  EXPECT_EQ(s_->ReplacementsSince(1).lowest_step, 7u);
  EXPECT_EQ(s_->ReplacementsSince(all - 1).lowest_step, 6 + Session::kKeptReplacements);
  EXPECT_FALSE(s_->ReplacementsSince(all).lowest_step.has_value());
}

// Another rank began resolution 1 but no trainer ever committed here: settling at 1 starts this
// rank's step deadline, so the step is aborted (on every rank, through the abort vote) instead of
// leaving the other rank inside its collective.
TEST_F(SessionHoldTest, SettlingAtAResolutionNoTrainerBeganHereAbortsItAtTheDeadline) {
  SessionConfig config = s_->config();
  config.step_deadline = absl::Milliseconds(200);
  auto created = engine_->CreateSession(config);
  ASSERT_THAT(created.status(), IsOk());
  Session& s = *created->session;
  ASSERT_THAT(s.holds().Hold(9, absl::Seconds(30)).status(), IsOk());
  const absl::Time start = absl::Now();
  auto point = s.holds().Settle(9, 1, absl::Now() + absl::Seconds(10), absl::Seconds(30));
  ASSERT_THAT(point.status(), IsOk());
  EXPECT_EQ(point->resolutions, 1u);
  EXPECT_EQ(point->step, 0u);  // aborted: nothing applied
  EXPECT_GE(absl::Now() - start, absl::Milliseconds(200));
  ASSERT_THAT(s.holds().Release(9), IsOk());
}

// ImportState refused (a step is pending) tells its callback without the session's lock, so the
// callback may call the session again.
TEST_F(SessionHoldTest, RefusedImportTellsItsCallbackOutsideTheSessionLock) {
  StepBegin begin;
  begin.step = 1;
  auto c = s_->Begin(begin);
  ASSERT_THAT(c.status(), IsOk());
  std::vector<float> b = {1, 2, 3};
  ASSERT_THAT(s_->AddGradient(*c, 1, 0, DType::kF32, b.data(), 12), IsOk());
  absl::Notification done;
  absl::Status status;
  bool pending = false;
  s_->holds().ImportState(std::make_shared<StateDict>(), [&](absl::Status st) {
    status = st;
    pending = s_->step_pending();  // takes the session's lock
    done.Notify();
  });
  if (!done.WaitForNotificationWithTimeout(absl::Seconds(10))) {
    ADD_FAILURE() << "ImportState's callback did not return: it was told under the session's lock";
    std::_Exit(1);  // that lock stays held: tearing the session down would hang
  }
  EXPECT_THAT(status, StatusIs(absl::StatusCode::kFailedPrecondition, "between steps"));
  EXPECT_TRUE(pending);
}

}  // namespace
}  // namespace optstep
