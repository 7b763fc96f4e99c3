// A heal's pause of the sessions (Session::PauseForHeal, server/rpc/rank_group_heal.cc): each
// rank pauses every session as a heal begins, waiting on a session that still resolves a step.
// The rank coordinating the heal may give up on that answer and end the heal (failed) while the
// rank still waits, so the end can reach a session before its pause. Such a pause must not hold:
// no end would come to lift it, and the session would resolve no step again. Ranks are engines in
// this process joined by gloo (RedundancyGroup).

#include <atomic>
#include <thread>
#include <vector>

#include "absl/time/clock.h"
#include "gtest/gtest.h"
#include "server/engine/engine.h"
#include "tests/server/engine/redundancy_group.h"
#include "tests/testing/status_matchers.h"

namespace optstep {
namespace {

using ::optstep::testutil::ConfigOf;
using ::optstep::testutil::IsOk;
using ::optstep::testutil::RedundancyGroup;

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

}  // namespace
}  // namespace optstep
