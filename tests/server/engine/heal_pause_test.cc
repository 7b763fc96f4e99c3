// A heal's pause of the sessions (Session::PauseForHeal, server/rpc/rank_group_heal.cc): each
// rank pauses every session as a heal begins, waiting on a session that still resolves a step.
// The rank coordinating the heal may give up on that answer and end the heal (failed) while the
// rank still waits, so the end can reach a session before its pause. Such a pause must not hold:
// no end would come to lift it, and the session would resolve no step again. Ranks are engines in
// this process joined by gloo (RedundancyGroup).

#include <atomic>
#include <memory>
#include <thread>
#include <vector>

#include "absl/time/clock.h"
#include "gtest/gtest.h"
#include "server/engine/engine.h"
#include "tests/server/engine/redundancy_group.h"
#include "tests/server/engine/session_test_util.h"
#include "tests/testing/status_matchers.h"

namespace optstep {
namespace {

using ::optstep::testutil::ConfigOf;
using ::optstep::testutil::IsOk;
using ::optstep::testutil::RedundancyGroup;
using ::optstep::testutil::SendGradient;

constexpr int kWorld = 2;

absl::Time Soon() { return absl::Now() + absl::Seconds(5); }

// Before, the pause that came after its heal's end held: step 2 never resolved (the group's
// step waits 30 s, then fails).
TEST(HealPauseTest, APauseThatComesAfterItsHealsEndPausesNothing) {
  RedundancyGroup group(kWorld, ConfigOf("adamw"));
  ASSERT_NO_FATAL_FAILURE(group.StepOk(1));
  for (int r = 0; r < kWorld; ++r) {
    group.session(r).CancelHealPause(/*generation=*/2);  // the heal into generation 2 failed
    EXPECT_THAT(group.session(r).PauseForHeal(/*generation=*/2, Soon()), IsOk());
    // An older heal's pause, later still, holds no more.
    EXPECT_THAT(group.session(r).PauseForHeal(/*generation=*/1, Soon()), IsOk());
  }
  ASSERT_NO_FATAL_FAILURE(group.StepOk(2));
}

// A heal that has not ended here pauses the session until its end, also after an older heal
// ended well, and whatever end of that older heal comes late: the step committed meanwhile
// resolves once the heal ends. (Before, any end lifted any pause.)
TEST(HealPauseTest, APauseOfAHealNotEndedHoldsUntilItsEnd) {
  RedundancyGroup group(kWorld, ConfigOf("adamw"));
  ASSERT_NO_FATAL_FAILURE(group.StepOk(1));
  for (int r = 0; r < kWorld; ++r) {
    group.session(r).ResumeAfterHeal(/*generation=*/2);
    ASSERT_THAT(group.session(r).PauseForHeal(/*generation=*/3, Soon()), IsOk());
  }
  std::atomic<bool> stepped{false};
  std::thread step([&] {
    group.StepOk(2);
    stepped = true;
  });
  absl::SleepFor(absl::Milliseconds(500));
  EXPECT_FALSE(stepped) << "step 2 resolved while the heal into generation 3 ran";
  // The end of the older heal, late, lifts nothing either.
  for (int r = 0; r < kWorld; ++r) group.session(r).ResumeAfterHeal(/*generation=*/2);
  for (int r = 0; r < kWorld; ++r) group.session(r).CancelHealPause(/*generation=*/2);
  absl::SleepFor(absl::Milliseconds(500));
  EXPECT_FALSE(stepped) << "the late end of the heal into generation 2 lifted the pause of 3";
  for (int r = 0; r < kWorld; ++r) group.session(r).ResumeAfterHeal(/*generation=*/3);
  step.join();
  EXPECT_TRUE(stepped);
}

// A trainer began the step before a rank was lost, and the heal outlasted the step's deadline:
// the deadline runs again from the heal's end, so that the trainer's part, sent after the heal,
// is taken. Before, the first check after the heal aborted the step, and the trainer was told
// ABORTED while the group served.
TEST(HealPauseTest, TheStepsDeadlineRunsAgainFromTheHealsEnd) {
  std::unique_ptr<Engine> engine = testutil::MakeEngine();
  ASSERT_NE(engine, nullptr);
  SessionConfig config = testutil::TwoParamConfig(testutil::Sgd(0.1));
  config.step_deadline = absl::Seconds(3);
  std::shared_ptr<Session> session = testutil::MakeSession(*engine, config);
  ASSERT_NE(session, nullptr);
  const StepHandle c = testutil::BeginStep(*session, 1, 0);
  ASSERT_THAT(SendGradient(*session, c, 0, 0, std::vector<float>(6, 0.5f)), IsOk());
  ASSERT_THAT(session->PauseForHeal(/*generation=*/1, Soon()), IsOk());
  absl::SleepFor(absl::Milliseconds(3200));  // the heal outlasts the deadline
  session->ResumeAfterHeal(/*generation=*/1);
  session->AbortIfExpired(absl::Now());
  ASSERT_THAT(SendGradient(*session, c, 1, 0, std::vector<float>(3, 0.5f)), IsOk());
  testutil::Outcome outcome;
  ASSERT_THAT(session->Commit(c, 0, outcome.Callback()), IsOk());
  EXPECT_THAT(outcome.Wait().status(), IsOk());
}

}  // namespace
}  // namespace optstep
