// ResolutionGate on its own: a hold stops resolutions at its limit, settles once the resolutions
// up to its target finished, keeps one staged state, and ends on release, on a passed lease, or
// when another token takes over a passed lease; Stop ends the waits; a rebase (after a heal) takes
// the group's count with what runs and the hold in place.

#include "server/engine/resolution_gate.h"

#include <memory>
#include <thread>

#include "absl/time/clock.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/engine/replica_state_dict.h"
#include "tests/testing/status_matchers.h"

namespace optstep {
namespace {

using ::optstep::testutil::IsOk;
using ::optstep::testutil::StatusIs;

TEST(ResolutionGateTest, ResolutionsStartFreelyWithoutAHold) {
  ResolutionGate gate("s", 0);
  EXPECT_TRUE(gate.may_start());
  EXPECT_TRUE(gate.TryStart());
  EXPECT_TRUE(gate.TryStart());
  EXPECT_EQ(gate.started(), 2u);
  EXPECT_FALSE(gate.held());
}

TEST(ResolutionGateTest, AHoldStopsResolutionsAtItsLimitUntilRaised) {
  ResolutionGate gate("s", 0);
  ASSERT_TRUE(gate.TryStart());
  auto held = gate.Hold(7, absl::Seconds(30));
  ASSERT_THAT(held.status(), IsOk());
  EXPECT_EQ(*held, 1u);
  EXPECT_FALSE(gate.may_start());
  EXPECT_FALSE(gate.TryStart());
  EXPECT_EQ(gate.started(), 1u);
  ASSERT_THAT(gate.Raise(7, 2, absl::Now(), absl::Seconds(30)), IsOk());
  EXPECT_TRUE(gate.TryStart());
  EXPECT_FALSE(gate.TryStart());
  EXPECT_THAT(gate.Raise(7, 1, absl::Now(), absl::Seconds(30)),
              StatusIs(absl::StatusCode::kInvalidArgument, "already started 2"));
}

TEST(ResolutionGateTest, ARebaseTakesTheGroupsCountKeepingWhatRunsAndTheHoldInPlace) {
  ResolutionGate gate("s", 0);
  for (int i = 0; i < 5; ++i) ASSERT_TRUE(gate.TryStart());
  for (int i = 0; i < 4; ++i) gate.Finish();  // one resolution still runs
  gate.Rebase(9);
  EXPECT_EQ(gate.started(), 9u);
  // The running one ends at 9: a hold settled at 9 waits for it, and no further.
  auto held = gate.Hold(3, absl::Seconds(30));
  ASSERT_THAT(held.status(), IsOk());
  EXPECT_EQ(*held, 9u);
  EXPECT_THAT(gate.AwaitSettled(3, 9, absl::Now() + absl::Milliseconds(20)),
              StatusIs(absl::StatusCode::kDeadlineExceeded, "finished 8"));
  gate.Finish();
  EXPECT_THAT(gate.AwaitSettled(3, 9, absl::Now() + absl::Seconds(10)), IsOk());
  // A hold keeps its limit relative to the count: none more starts until it rises.
  gate.Rebase(4);
  EXPECT_FALSE(gate.TryStart());
  ASSERT_THAT(gate.Raise(3, 5, absl::Now(), absl::Seconds(30)), IsOk());
  EXPECT_TRUE(gate.TryStart());
  EXPECT_FALSE(gate.TryStart());
}

TEST(ResolutionGateTest, SettlesOnceTheTargetResolutionsFinished) {
  ResolutionGate gate("s", 3);
  ASSERT_TRUE(gate.TryStart());
  ASSERT_THAT(gate.Hold(1, absl::Seconds(30)).status(), IsOk());
  EXPECT_THAT(gate.CheckSettled(1), StatusIs(absl::StatusCode::kFailedPrecondition, "not settled"));
  ASSERT_THAT(gate.Raise(1, 1, absl::Now(), absl::Seconds(30)), IsOk());
  EXPECT_THAT(gate.AwaitSettled(1, 1, absl::Now() + absl::Milliseconds(50)),
              StatusIs(absl::StatusCode::kDeadlineExceeded, "finished 0"));
  std::thread finisher([&] {
    absl::SleepFor(absl::Milliseconds(20));
    gate.Finish();
  });
  EXPECT_THAT(gate.AwaitSettled(1, 1, absl::Now() + absl::Seconds(10)), IsOk());
  finisher.join();
  auto done = gate.Settle(1);
  ASSERT_THAT(done.status(), IsOk());
  EXPECT_EQ(*done, 1u);
  EXPECT_THAT(gate.CheckSettled(1), IsOk());
}

TEST(ResolutionGateTest, AwaitFreeReturnsOnReleaseLeaseOrItsOwnDeadline) {
  ResolutionGate gate("s", 0);
  gate.AwaitFree(1, absl::InfiniteFuture());  // not held: at once
  ASSERT_THAT(gate.Hold(1, absl::Seconds(30)).status(), IsOk());
  gate.AwaitFree(1, absl::InfiniteFuture());  // held by the asker: at once
  absl::Time start = absl::Now();
  gate.AwaitFree(2, start + absl::Milliseconds(50));  // held by another: until the deadline
  EXPECT_GE(absl::Now() - start, absl::Milliseconds(50));
  EXPECT_THAT(gate.Hold(2, absl::Seconds(30)).status(), StatusIs(absl::StatusCode::kAborted));
  std::thread release([&] {
    absl::SleepFor(absl::Milliseconds(50));
    gate.Release(1);
  });
  gate.AwaitFree(2, absl::InfiniteFuture());  // released
  release.join();
  ASSERT_THAT(gate.Hold(2, absl::Milliseconds(50)).status(), IsOk());
  gate.AwaitFree(3, absl::InfiniteFuture());  // 2's lease passes
  EXPECT_THAT(gate.Hold(3, absl::Seconds(30)).status(), IsOk());
}

TEST(ResolutionGateTest, AnotherTokenWaitsUntilTheLeasePasses) {
  ResolutionGate gate("s", 0);
  ASSERT_THAT(gate.Hold(1, absl::Milliseconds(50)).status(), IsOk());
  EXPECT_THAT(gate.Hold(2, absl::Seconds(30)).status(),
              StatusIs(absl::StatusCode::kAborted, "(hold 1)"));
  absl::SleepFor(absl::Milliseconds(80));
  ASSERT_THAT(gate.Hold(2, absl::Seconds(30)).status(), IsOk());  // taken over
  EXPECT_THAT(gate.CheckHolder(1), StatusIs(absl::StatusCode::kAborted, "not active"));
  EXPECT_THAT(gate.CheckHolder(2), IsOk());
}

// A held operation renews its lease as it goes. A renewal never shortens it (before, a progress
// callback's 30 s cut the settle's longer lease short, and a rank that finished its part first
// let its hold go while rank 0 waited for the others), and never takes the gate anew once the
// hold is gone (before, it did, unsettled, after steps had run: a save went on writing a state
// that stepped under it, and committed it).
TEST(ResolutionGateTest, ARenewalExtendsTheLeaseOnlyAndNeverTakesTheGateAnew) {
  ResolutionGate gate("s", 0);
  ASSERT_THAT(gate.Hold(1, absl::Minutes(2)).status(), IsOk());
  ASSERT_THAT(gate.Renew(1, absl::Milliseconds(1)), IsOk());
  ASSERT_THAT(gate.Hold(1, absl::Milliseconds(1)).status(), IsOk());
  EXPECT_FALSE(gate.Expire(absl::Now() + absl::Minutes(1))) << "the lease was cut short";
  EXPECT_THAT(gate.Renew(2, absl::Minutes(1)),
              StatusIs(absl::StatusCode::kAborted, "hold 2 is gone"));
  EXPECT_TRUE(gate.Expire(absl::Now() + absl::Minutes(3)));
  EXPECT_THAT(
      gate.Renew(1, absl::Minutes(1)),
      StatusIs(absl::StatusCode::kAborted, "session 's' rank 0: hold 1 is gone (its lease passed"));
  EXPECT_FALSE(gate.held()) << "a renewal took the gate anew";
  EXPECT_TRUE(gate.may_start());
}

TEST(ResolutionGateTest, ReleaseAndExpireEndOnlyTheirHold) {
  ResolutionGate gate("s", 0);
  ASSERT_THAT(gate.Hold(1, absl::Seconds(30)).status(), IsOk());
  EXPECT_FALSE(gate.Release(2));
  EXPECT_FALSE(gate.Expire(absl::Now()));
  EXPECT_TRUE(gate.held());
  EXPECT_TRUE(gate.Expire(absl::Now() + absl::Minutes(1)));
  EXPECT_FALSE(gate.held());
  ASSERT_THAT(gate.Hold(3, absl::Seconds(30)).status(), IsOk());
  EXPECT_TRUE(gate.Release(3));
  EXPECT_FALSE(gate.Release(3));  // idempotent
  EXPECT_TRUE(gate.may_start());
}

TEST(ResolutionGateTest, AStagedStateIsTakenOnceAndOnlyWhileSettled) {
  ResolutionGate gate("s", 0);
  ASSERT_THAT(gate.Hold(1, absl::Seconds(30)).status(), IsOk());
  auto staged = std::make_shared<ResolvedState>();
  EXPECT_THAT(gate.Stage(1, staged), StatusIs(absl::StatusCode::kFailedPrecondition));
  ASSERT_THAT(gate.Raise(1, 0, absl::Now(), absl::Seconds(30)), IsOk());
  ASSERT_THAT(gate.AwaitSettled(1, 0, absl::Now()), IsOk());
  ASSERT_THAT(gate.Settle(1).status(), IsOk());
  EXPECT_THAT(gate.TakeStaged(1).status(),
              StatusIs(absl::StatusCode::kFailedPrecondition, "no state staged"));
  ASSERT_THAT(gate.Stage(1, staged), IsOk());
  auto taken = gate.TakeStaged(1);
  ASSERT_THAT(taken.status(), IsOk());
  EXPECT_EQ(*taken, staged);
  EXPECT_THAT(gate.TakeStaged(1).status(), StatusIs(absl::StatusCode::kFailedPrecondition));
}

TEST(ResolutionGateTest, StopAndReleaseEndAWait) {
  ResolutionGate gate("s", 0);
  ASSERT_THAT(gate.Hold(1, absl::Seconds(30)).status(), IsOk());
  ASSERT_THAT(gate.Raise(1, 1, absl::Now(), absl::Seconds(30)), IsOk());
  std::thread releaser([&] {
    absl::SleepFor(absl::Milliseconds(20));
    gate.Release(1);
  });
  EXPECT_THAT(gate.AwaitSettled(1, 1, absl::Now() + absl::Seconds(10)), IsOk());
  releaser.join();
  EXPECT_THAT(gate.Settle(1).status(), StatusIs(absl::StatusCode::kAborted));

  ASSERT_THAT(gate.Hold(2, absl::Seconds(30)).status(), IsOk());
  ASSERT_THAT(gate.Raise(2, 1, absl::Now(), absl::Seconds(30)), IsOk());
  std::thread stopper([&] {
    absl::SleepFor(absl::Milliseconds(20));
    gate.Stop();
  });
  EXPECT_THAT(gate.AwaitSettled(2, 1, absl::Now() + absl::Seconds(10)), IsOk());
  stopper.join();
}

}  // namespace
}  // namespace optstep
