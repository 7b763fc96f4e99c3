// PeerLiveness with the time passed in: a peer is lost only after the timeout without an answer,
// counted from when it is first watched; an answer before the timeout keeps it alive; loss and
// leaving last until the rank rejoins, are reported once, and the status names the first rank
// and what to do. A peer whose answers come from a new process (it restarted within the timeout)
// is lost at once; after a rejoin its new process is learnt afresh.

#include "server/rpc/peer_liveness.h"

#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/status_matchers.h"

namespace optstep {
namespace {

using ::optstep::testutil::IsOk;
using ::optstep::testutil::StatusIs;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::IsEmpty;

const absl::Time kStart = absl::FromUnixSeconds(1000);
const absl::Duration kTimeout = absl::Seconds(5);

std::vector<int> Ranks(const std::vector<PeerLiveness::LostPeer>& lost) {
  std::vector<int> ranks;
  for (const PeerLiveness::LostPeer& peer : lost) ranks.push_back(peer.rank);
  return ranks;
}

TEST(PeerLivenessTest, AnUnwatchedPeerIsNeverLost) {
  PeerLiveness liveness(/*rank=*/0, /*world_size=*/3, kTimeout);
  EXPECT_FALSE(liveness.watched(1));
  EXPECT_THAT(liveness.Check(kStart + absl::Hours(1)), IsEmpty());
  EXPECT_THAT(liveness.status(), IsOk());
}

TEST(PeerLivenessTest, APeerSilentBeyondTheTimeoutIsLostOnce) {
  PeerLiveness liveness(0, 3, kTimeout);
  liveness.Watch(1, kStart);
  liveness.Watch(2, kStart);
  EXPECT_TRUE(liveness.watched(2));
  liveness.Answered(1, kStart + absl::Seconds(4));
  // Exactly at the timeout: still there.
  EXPECT_THAT(liveness.Check(kStart + kTimeout), IsEmpty());
  const std::vector<PeerLiveness::LostPeer> lost =
      liveness.Check(kStart + kTimeout + absl::Milliseconds(1));
  EXPECT_THAT(Ranks(lost), ElementsAre(2));
  EXPECT_THAT(lost[0].why,
              StatusIs(absl::StatusCode::kUnavailable, "rank 2 lost (no heartbeat for 5.0 s)"));
  EXPECT_THAT(std::string(lost[0].why.message()), HasSubstr("restart the group"));
  EXPECT_THAT(liveness.status(), StatusIs(absl::StatusCode::kUnavailable, "rank 2 lost"));
  // Reported once; an answer afterwards does not bring it back.
  liveness.Answered(2, kStart + absl::Seconds(6));
  EXPECT_THAT(liveness.Check(kStart + absl::Seconds(7)), IsEmpty());
  EXPECT_THAT(liveness.status(), StatusIs(absl::StatusCode::kUnavailable, "rank 2 lost"));
}

TEST(PeerLivenessTest, AnswersBeforeTheTimeoutKeepAPeerAlive) {
  PeerLiveness liveness(1, 2, kTimeout);
  liveness.Watch(0, kStart);
  for (int s = 1; s <= 60; ++s) {
    liveness.Answered(0, kStart + absl::Seconds(s));
    EXPECT_THAT(liveness.Check(kStart + absl::Seconds(s) + absl::Milliseconds(4900)), IsEmpty());
  }
  EXPECT_THAT(liveness.status(), IsOk());
  // Watching again does not restart the clock.
  liveness.Watch(0, kStart + absl::Hours(1));
  EXPECT_THAT(Ranks(liveness.Check(kStart + absl::Seconds(66))), ElementsAre(0));
}

TEST(PeerLivenessTest, TheFirstFailureIsTheStatus) {
  PeerLiveness liveness(0, 4, kTimeout);
  for (int r = 1; r < 4; ++r) liveness.Watch(r, kStart);
  liveness.Answered(1, kStart + absl::Seconds(3));
  EXPECT_THAT(Ranks(liveness.Check(kStart + absl::Seconds(6))), ElementsAre(2, 3));
  EXPECT_THAT(Ranks(liveness.Check(kStart + absl::Seconds(9))), ElementsAre(1));
  EXPECT_THAT(liveness.status(),
              StatusIs(absl::StatusCode::kUnavailable, "rank 2 lost (no heartbeat for 6.0 s)"));
}

TEST(PeerLivenessTest, APeerThatLeftIsGoneNotLost) {
  PeerLiveness liveness(0, 3, kTimeout);
  liveness.Watch(1, kStart);
  EXPECT_TRUE(liveness.Left(1));
  EXPECT_FALSE(liveness.Left(1));
  EXPECT_THAT(liveness.Check(kStart + absl::Minutes(1)), IsEmpty());
  EXPECT_THAT(liveness.status(), StatusIs(absl::StatusCode::kUnavailable, "rank 1 left the group"));
  EXPECT_THAT(std::string(liveness.status().message()), HasSubstr("restart the group"));
  // Gone is not lost: only a lost peer is in lost_status.
  EXPECT_THAT(liveness.lost_status(), IsOk());
  // A rank never counts itself.
  EXPECT_FALSE(liveness.Left(0));
  liveness.Watch(0, kStart);
  EXPECT_FALSE(liveness.watched(0));
}

TEST(PeerLivenessTest, ALossAfterALeaveIsTheLostStatus) {
  PeerLiveness liveness(0, 3, kTimeout);
  liveness.Watch(1, kStart);
  liveness.Watch(2, kStart);
  EXPECT_TRUE(liveness.Left(1));
  EXPECT_THAT(Ranks(liveness.Check(kStart + absl::Seconds(6))), ElementsAre(2));
  // The first failure is the leave; the first loss is rank 2's.
  EXPECT_THAT(liveness.status(), StatusIs(absl::StatusCode::kUnavailable, "rank 1 left"));
  EXPECT_THAT(liveness.lost_status(), StatusIs(absl::StatusCode::kUnavailable, "rank 2 lost"));
}

TEST(PeerLivenessTest, ARankThatRejoinedIsAliveAgainAndJudgedAfresh) {
  PeerLiveness liveness(0, 3, kTimeout);
  liveness.Watch(1, kStart);
  liveness.Watch(2, kStart);
  EXPECT_TRUE(liveness.Left(2));
  EXPECT_THAT(Ranks(liveness.Check(kStart + absl::Seconds(6))), ElementsAre(1));
  EXPECT_EQ(liveness.lost_count(), 2);
  EXPECT_EQ(liveness.lost_count(/*except=*/1), 1);
  liveness.Rejoined(1, kStart + absl::Seconds(7));
  // Rank 2 is still gone; rank 1 counts no more.
  EXPECT_EQ(liveness.lost_count(), 1);
  EXPECT_THAT(liveness.lost_status(), IsOk());
  EXPECT_THAT(liveness.status(), StatusIs(absl::StatusCode::kUnavailable, "rank 2 left"));
  liveness.Rejoined(2, kStart + absl::Seconds(7));
  EXPECT_THAT(liveness.status(), IsOk());
  // The timeout counts from the rejoin; a rank lost again is reported again.
  EXPECT_THAT(liveness.Check(kStart + absl::Seconds(12)), IsEmpty());
  EXPECT_THAT(Ranks(liveness.Check(kStart + absl::Seconds(13))), ElementsAre(1, 2));
  EXPECT_THAT(liveness.status(), StatusIs(absl::StatusCode::kUnavailable, "rank 1 lost"));
}

TEST(PeerLivenessTest, AnAnswerFromANewProcessLosesThePeerAtOnce) {
  PeerLiveness liveness(1, 3, kTimeout);
  liveness.Watch(0, kStart);
  liveness.Watch(2, kStart);
  liveness.Answered(0, kStart + absl::Seconds(1), /*incarnation=*/111);
  liveness.Answered(2, kStart + absl::Seconds(1), /*incarnation=*/222);
  // The same processes, and an answer that carries none: nothing changes.
  liveness.Answered(0, kStart + absl::Seconds(2), 111);
  liveness.Answered(2, kStart + absl::Seconds(2), 0);
  EXPECT_FALSE(liveness.failed(0));
  EXPECT_THAT(liveness.Check(kStart + absl::Seconds(2)), IsEmpty());
  // Rank 0 restarted well within the timeout.
  liveness.Answered(0, kStart + absl::Seconds(3), 333);
  EXPECT_TRUE(liveness.failed(0));
  EXPECT_FALSE(liveness.failed(2));
  const std::vector<PeerLiveness::LostPeer> lost = liveness.Check(kStart + absl::Seconds(3));
  EXPECT_THAT(Ranks(lost), ElementsAre(0));
  EXPECT_THAT(lost[0].why, StatusIs(absl::StatusCode::kUnavailable,
                                    "rank 0 lost (it restarted: a new process answers)"));
  EXPECT_THAT(liveness.Check(kStart + absl::Seconds(4)), IsEmpty());  // reported once
  EXPECT_EQ(liveness.lost_count(), 1);
  // Healed in: the new process is learnt at its first answer, and judged by it from then on.
  liveness.Rejoined(0, kStart + absl::Seconds(5));
  EXPECT_FALSE(liveness.failed(0));
  liveness.Answered(0, kStart + absl::Seconds(6), 333);
  liveness.Answered(0, kStart + absl::Seconds(7), 333);
  EXPECT_THAT(liveness.Check(kStart + absl::Seconds(7)), IsEmpty());
  liveness.Answered(2, kStart + absl::Seconds(8), 222);
  liveness.Answered(0, kStart + absl::Seconds(8), 444);
  EXPECT_THAT(Ranks(liveness.Check(kStart + absl::Seconds(8))), ElementsAre(0));
}

TEST(PeerLivenessTest, ARestartSeenJustBeforeARejoinIsStillReported) {
  PeerLiveness liveness(1, 3, kTimeout);
  liveness.Watch(0, kStart);
  liveness.Answered(0, kStart + absl::Seconds(1), 111);
  liveness.Answered(0, kStart + absl::Seconds(2), 222);
  // Healed in before the heartbeat thread checked: the loss happened, and is counted once.
  liveness.Rejoined(0, kStart + absl::Seconds(2));
  EXPECT_FALSE(liveness.failed(0));
  const std::vector<PeerLiveness::LostPeer> lost = liveness.Check(kStart + absl::Seconds(2));
  EXPECT_THAT(Ranks(lost), ElementsAre(0));
  EXPECT_THAT(liveness.Check(kStart + absl::Seconds(3)), IsEmpty());
  EXPECT_FALSE(liveness.failed(0));
}

TEST(PeerLivenessTest, ARankRejoinedAsAKnownProcessIsLostOnAnAnswerFromAnother) {
  PeerLiveness liveness(1, 3, kTimeout);
  liveness.Watch(0, kStart);
  liveness.Answered(0, kStart + absl::Seconds(1), 111);
  liveness.Answered(0, kStart + absl::Seconds(2), 222);
  ASSERT_THAT(Ranks(liveness.Check(kStart + absl::Seconds(2))), ElementsAre(0));
  // Process 333 began its heal (Regroup kBegin carries it), failed and exited; its successor
  // answers before any answer of 333 came.
  liveness.Rejoined(0, kStart + absl::Seconds(3), /*incarnation=*/333);
  liveness.Answered(0, kStart + absl::Seconds(4), 444);
  EXPECT_TRUE(liveness.failed(0));
  EXPECT_THAT(Ranks(liveness.Check(kStart + absl::Seconds(4))), ElementsAre(0));
}

// A rank's own process heals in while its stand-in (another process, at another address) still
// serves: a heartbeat sent to the stand-in before the heal began may be answered after it. That
// answer is not the new process's, and loses nothing; answers to later heartbeats are judged.
TEST(PeerLivenessTest, AnAnswerToAHeartbeatSentBeforeARejoinIsNotTheNewProcesss) {
  PeerLiveness liveness(0, 3, kTimeout);
  liveness.Watch(1, kStart);
  liveness.Answered(1, kStart + absl::Seconds(1), /*incarnation=*/111);  // the stand-in
  liveness.Rejoined(1, kStart + absl::Seconds(3), /*incarnation=*/222);  // the own process
  liveness.Answered(1, kStart + absl::Seconds(4), 111, /*asked=*/kStart + absl::Seconds(2));
  EXPECT_FALSE(liveness.failed(1));
  EXPECT_THAT(liveness.Check(kStart + absl::Seconds(4)), IsEmpty());
  liveness.Answered(1, kStart + absl::Seconds(5), 222, kStart + absl::Seconds(5));
  EXPECT_FALSE(liveness.failed(1));
  liveness.Answered(1, kStart + absl::Seconds(6), 111, kStart + absl::Seconds(6));
  EXPECT_TRUE(liveness.failed(1));
  EXPECT_THAT(Ranks(liveness.Check(kStart + absl::Seconds(6))), ElementsAre(1));
}

}  // namespace
}  // namespace optstep
