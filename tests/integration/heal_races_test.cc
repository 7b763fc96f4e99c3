// What meets a heal: the end of a heal reaches every rank although a call to one of them is lost,
// a rank that missed it for good heals in again, a heal whose begin is lost is made again with
// the rank's next process, a session closed while a heal runs waits for it to end, and one whose
// close the loss of rank 0 cut is closed as rank 0 heals in.

#include <grpcpp/create_channel.h>
#include <signal.h>
#include <sys/wait.h>

#include <filesystem>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "client/cpp/client.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "optstep/v1/internal.grpc.pb.h"
#include "optstep/v1/optimizer_service.grpc.pb.h"
#include "tests/integration/healing_group.h"
#include "tests/testing/directory_listing.h"
#include "tests/testing/server_process.h"
#include "tests/testing/status_matchers.h"

namespace optstep {
namespace {

using ::optstep::testutil::AwaitHealth;
using ::optstep::testutil::Group;
using ::optstep::testutil::IsOk;
using ::optstep::testutil::Live;
using ::optstep::testutil::Restart;
using ::optstep::testutil::Running;
using ::optstep::testutil::SameStateAndParameters;
using ::optstep::testutil::ServerProcess;
using ::optstep::testutil::SpreadSpec;
using ::optstep::testutil::SteppedReference;
using ::optstep::testutil::StepSpread;
using ::optstep::testutil::Trainer;

constexpr int kWorld = 3;
constexpr int kDead = 1;

// A group of kWorld ranks run with `flags`, and a trainer: a reference session stepped 4 times
// undisturbed, and the session `healed_` stepped twice, then rank kDead killed and restarted.
class HealEndTest : public ::testing::Test {
 protected:
  // Kills rank `dead` once the healed session stepped twice, and starts it again with
  // `restart_flags` (`flags` when empty).
  void KillAndRestartMidway(const std::vector<std::string>& flags, int dead = kDead,
                            std::vector<std::string> restart_flags = {}) {
    OPTSTEP_ASSERT_OK_AND_ASSIGN(group_, testutil::StartGroup(kWorld, flags));
    ASSERT_TRUE(AwaitHealth(*group_[0], true, absl::Seconds(20)));
    trainer_ = Trainer(group_);
    ASSERT_NE(trainer_, nullptr);
    OPTSTEP_ASSERT_OK_AND_ASSIGN(reference_, SteppedReference(*trainer_, 4));
    OPTSTEP_ASSERT_OK_AND_ASSIGN(healed_, trainer_->CreateSession(SpreadSpec("healed")));
    for (uint64_t step = 1; step <= 2; ++step) {
      ASSERT_THAT(StepSpread(*trainer_, healed_.session_id(), step).status(), IsOk());
    }
    group_[dead]->SignalAndWait(SIGKILL);
    ASSERT_TRUE(AwaitHealth(*group_[dead == 0 ? 1 : 0], false, absl::Seconds(10)));
    ASSERT_THAT(Restart(group_, dead, restart_flags.empty() ? flags : restart_flags), IsOk());
  }

  // Every rank serves and lives, and the healed session, stepped on, ends bit for bit with the
  // reference.
  void ExpectHealedAndSteppedOn() {
    for (int r = 0; r < kWorld; ++r) {
      EXPECT_TRUE(AwaitHealth(*group_[r], true, absl::Seconds(20))) << "rank " << r;
    }
    for (uint64_t step = 3; step <= 4; ++step) {
      ASSERT_THAT(StepSpread(*trainer_, healed_.session_id(), step).status(), IsOk());
    }
    EXPECT_THAT(SameStateAndParameters(*trainer_, reference_.session_id(), healed_.session_id()),
                IsOk());
    for (int r = 0; r < kWorld; ++r) EXPECT_TRUE(Live(*group_[r])) << "rank " << r;
  }

  Group group_;
  std::unique_ptr<Client> trainer_;
  v1::SessionInfo reference_;
  v1::SessionInfo healed_;
};

// Rank 0 (with --drop_first_peer_call) drops its first call that ends the heal on rank 2, as a
// connection reset would, and makes it again. Before, the heal's end was sent once: rank 2 kept
// its sessions paused and answered NOT_SERVING for ever, though live, so nothing restarted it.
TEST_F(HealEndTest, AHealsEndLostOnTheWayToARankIsMadeAgain) {
  std::vector<std::string> flags = testutil::HealingFlags();
  flags.push_back("--drop_first_peer_call=HealEnd:2");
  ASSERT_NO_FATAL_FAILURE(KillAndRestartMidway(flags));
  ExpectHealedAndSteppedOn();
}

// Rank 0 (with --drop_first_peer_call=HealEnd:2:every) drops every attempt of its call that ends
// the heal on rank 2, until the group's timeout ends the call: rank 2 misses the heal's end for
// good. Before, rank 2 stayed paused in the heal and answered NOT_SERVING for ever, though live,
// and nothing restarted it. Now rank 0's heartbeat answers tell it that the heal ended without
// it: it exits for its supervisor to restart it, and heals in again from its buddy's copy.
TEST_F(HealEndTest, ARankThatMissedAHealsEndForGoodExitsAndHealsInAgain) {
  constexpr int kMissing = 2;
  std::vector<std::string> flags = testutil::HealingFlags();
  flags.push_back("--drop_first_peer_call=HealEnd:2:every");
  flags.push_back("--comm_timeout_ms=4000");  // how long rank 0 makes the dropped call
  ASSERT_NO_FATAL_FAILURE(KillAndRestartMidway(flags));
  const int missed = group_[kMissing]->WaitFor(absl::Seconds(30));
  ASSERT_NE(missed, -1) << "rank 2 waits for the end of a heal that rank 0 ended";
  ASSERT_TRUE(WIFEXITED(missed));
  EXPECT_EQ(WEXITSTATUS(missed), 75);
  ASSERT_THAT(Restart(group_, kMissing, flags), IsOk());
  ExpectHealedAndSteppedOn();
}

// Rank 0 (--drop_first_peer_call=HealBegin:2) loses its first call that begins a heal on rank 2,
// as a connection reset would: the heal of rank 1 fails with every process alive. Before, rank 0
// took that for a heal that would fail again, and exited for a restart of the whole group. Now
// the group waits for rank 1's next process, as when a rank is lost in its heal: rank 1 exits for
// its supervisor, and its next process heals in.
TEST_F(HealEndTest, AHealWhoseBeginIsLostOnTheWayIsMadeAgainWithTheRanksNextProcess) {
  std::vector<std::string> flags = testutil::HealingFlags();
  flags.push_back("--drop_first_peer_call=HealBegin:2");
  ASSERT_NO_FATAL_FAILURE(KillAndRestartMidway(flags));
  const int exited = group_[kDead]->WaitFor(absl::Seconds(30));
  ASSERT_NE(exited, -1) << "rank 1 waits after its failed heal";
  ASSERT_TRUE(WIFEXITED(exited));
  EXPECT_EQ(WEXITSTATUS(exited), 75);
  ASSERT_TRUE(Running(*group_[0])) << "rank 0 exited for a restart of the group";
  ASSERT_THAT(Restart(group_, kDead, flags), IsOk());
  ExpectHealedAndSteppedOn();
}

// Rank 0's next process (--drop_first_peer_call=HealBegin:2) loses its call that begins its own
// heal on rank 2, as a connection reset would: its heal fails with every process alive, and it
// exits for its supervisor. Before, the survivors took that for a heal that would fail again and
// exited too: the whole group restarted. Now they wait for rank 0's next process, which heals in.
TEST_F(HealEndTest, ARankZeroWhoseHealFailsForAPassingReasonHealsInWithItsNextProcess) {
  const std::vector<std::string> flags = testutil::HealingFlags();
  std::vector<std::string> dropping = flags;
  dropping.push_back("--drop_first_peer_call=HealBegin:2");
  ASSERT_NO_FATAL_FAILURE(KillAndRestartMidway(flags, 0, dropping));
  const int exited = group_[0]->WaitFor(absl::Seconds(30));
  ASSERT_NE(exited, -1) << "rank 0 lives on after its failed heal";
  ASSERT_TRUE(WIFEXITED(exited));
  EXPECT_EQ(WEXITSTATUS(exited), 75);
  absl::SleepFor(absl::Seconds(1));  // the survivors took the heal's end
  for (int r = 1; r < kWorld; ++r) {
    ASSERT_TRUE(Running(*group_[r])) << "rank " << r << " exited for a restart of the group";
  }
  ASSERT_THAT(Restart(group_, 0, flags), IsOk());
  ExpectHealedAndSteppedOn();
}

// A rank 0 that has not formed its group (its peers never come here) holds none of its sessions:
// a close is refused UNAVAILABLE, to be made again once it serves. Before, it was answered
// NOT_FOUND, which a client that tried once before reads as closed.
TEST(HealRacesTest, ARankZeroThatHasNotFormedItsGroupRefusesACloseAsUnavailable) {
  std::vector<std::string> flags = testutil::HealingFlags();
  flags.push_back("--rank=0");
  flags.push_back(absl::StrCat("--world_size=", kWorld));
  OPTSTEP_ASSERT_OK_AND_ASSIGN(std::unique_ptr<ServerProcess> rank_zero,
                               ServerProcess::Start(flags));
  auto stub = v1::OptimizerService::NewStub(
      grpc::CreateChannel(rank_zero->address(), grpc::InsecureChannelCredentials()));
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
  v1::CloseSessionRequest close;
  close.set_session_id("s0123456789abcdef0123456789abcdef");
  v1::CloseSessionResponse closed;
  const grpc::Status refused = stub->CloseSession(&context, close, &closed);
  EXPECT_EQ(refused.error_code(), grpc::StatusCode::UNAVAILABLE) << refused.error_message();
  EXPECT_THAT(refused.error_message(), ::testing::HasSubstr("the group is forming"));
}

// Rank 0 (with --drop_first_peer_call) drops its first call that closes a session on rank 2, and
// makes it again. Before, a close was sent once and its error only logged: the replica stayed on
// rank 2 for good (its memory reserved), and that rank's next heal rebuilt a session no other
// rank had, and failed.
TEST(HealRacesTest, AClosesCallLostOnTheWayToARankIsMadeAgain) {
  std::vector<std::string> flags = testutil::HealingFlags();
  flags.push_back("--drop_first_peer_call=CloseReplica:2");
  OPTSTEP_ASSERT_OK_AND_ASSIGN(Group group, testutil::StartGroup(kWorld, flags));
  ASSERT_TRUE(AwaitHealth(*group[0], true, absl::Seconds(20)));
  std::unique_ptr<Client> trainer = Trainer(group);
  ASSERT_NE(trainer, nullptr);
  OPTSTEP_ASSERT_OK_AND_ASSIGN(v1::SessionInfo closed,
                               trainer->CreateSession(SpreadSpec("closed")));
  ASSERT_THAT(StepSpread(*trainer, closed.session_id(), 1).status(), IsOk());
  ASSERT_THAT(trainer->CloseSession(closed.session_id()), IsOk());
  // A listed step of 0: the replica is gone (it was at step 1).
  for (int r = 1; r < kWorld; ++r) {
    absl::StatusOr<uint64_t> listed =
        testutil::AwaitListedStep(*group[r], closed.session_id(), 0, absl::Seconds(5));
    ASSERT_THAT(listed.status(), IsOk());
    EXPECT_EQ(*listed, 0u) << "rank " << r << " still holds the closed session";
  }
}

// A group of kWorld ranks that saves automatic checkpoints after each step, and a trainer: a
// reference session stepped 4 times undisturbed, the session `kept_` stepped twice, and the
// session `closed_` stepped once (its checkpoint saved), which a test closes amid a heal.
class HealCloseTest : public ::testing::Test {
 protected:
  void SetUp() override {
    flags_.push_back("--checkpoint_root=" + root_.path());
    flags_.push_back("--checkpoint_every_steps=1");
    OPTSTEP_ASSERT_OK_AND_ASSIGN(group_, testutil::StartGroupWith(kWorld, [this](int rank) {
                                   std::vector<std::string> flags = flags_;
                                   if (rank == 0) {
                                     flags.insert(flags.end(), rank_zero_flags_.begin(),
                                                  rank_zero_flags_.end());
                                   }
                                   return flags;
                                 }));
    ASSERT_TRUE(AwaitHealth(*group_[0], true, absl::Seconds(20)));
    trainer_ = Trainer(group_);
    ASSERT_NE(trainer_, nullptr);
    OPTSTEP_ASSERT_OK_AND_ASSIGN(reference_, SteppedReference(*trainer_, 4));
    OPTSTEP_ASSERT_OK_AND_ASSIGN(kept_, trainer_->CreateSession(SpreadSpec("kept")));
    OPTSTEP_ASSERT_OK_AND_ASSIGN(closed_, trainer_->CreateSession(SpreadSpec("closed")));
    for (uint64_t step = 1; step <= 2; ++step) {
      ASSERT_THAT(StepSpread(*trainer_, kept_.session_id(), step).status(), IsOk());
    }
    ASSERT_THAT(StepSpread(*trainer_, closed_.session_id(), 1).status(), IsOk());
    const absl::Time end = absl::Now() + absl::Seconds(20);
    while (!std::filesystem::exists(ClosedCheckpoints() / "step-1") && absl::Now() < end) {
      absl::SleepFor(absl::Milliseconds(20));
    }
    ASSERT_TRUE(std::filesystem::exists(ClosedCheckpoints() / "step-1"));
  }

  std::filesystem::path ClosedCheckpoints() const {
    return std::filesystem::path(root_.path()) / "auto" / closed_.session_id();
  }

  // Every rank serves and lives, no rank holds `closed_` (at step 1 before) and its automatic
  // checkpoints are gone, and `kept_`, stepped on, ends bit for bit with the reference.
  void ExpectClosedAndKeptSteppedOn() {
    for (int r = 0; r < kWorld; ++r) {
      EXPECT_TRUE(AwaitHealth(*group_[r], true, absl::Seconds(30))) << "rank " << r;
      EXPECT_TRUE(Running(*group_[r])) << "rank " << r;
    }
    EXPECT_THAT(trainer_->GetSession(closed_.session_id()).status(),
                testutil::StatusIs(absl::StatusCode::kNotFound));
    for (int r = 1; r < kWorld; ++r) {
      absl::StatusOr<uint64_t> listed =
          testutil::AwaitListedStep(*group_[r], closed_.session_id(), 0, absl::Seconds(5));
      ASSERT_THAT(listed.status(), IsOk());
      EXPECT_EQ(*listed, 0u) << "rank " << r << " still holds the closed session";
    }
    EXPECT_FALSE(std::filesystem::exists(ClosedCheckpoints()));
    for (uint64_t step = 3; step <= 4; ++step) {
      ASSERT_THAT(StepSpread(*trainer_, kept_.session_id(), step).status(), IsOk());
    }
    EXPECT_THAT(SameStateAndParameters(*trainer_, reference_.session_id(), kept_.session_id()),
                IsOk());
  }

  testutil::ScopedTempDir root_;
  std::vector<std::string> flags_ = testutil::HealingFlags();
  std::vector<std::string> rank_zero_flags_;  // rank 0's first process only
  Group group_;
  std::unique_ptr<Client> trainer_;
  v1::SessionInfo reference_;
  v1::SessionInfo kept_;
  v1::SessionInfo closed_;
};

// A session closed while a restarted rank heals in (its transfer slowed by
// --delay_heal_fetch_ms) is closed once the heal ended. Before, the close ran during the heal: the
// healed rank found the session gone from its buddy, the heal failed and the group restarted.
TEST_F(HealCloseTest, ASessionClosedWhileARankHealsInIsClosedAfterTheHeal) {
  group_[kDead]->SignalAndWait(SIGKILL);
  ASSERT_TRUE(AwaitHealth(*group_[0], false, absl::Seconds(10)));
  std::vector<std::string> slow = flags_;
  slow.push_back("--delay_heal_fetch_ms=1500");  // three sessions: a transfer of seconds
  ASSERT_THAT(Restart(group_, kDead, slow), IsOk());
  absl::SleepFor(absl::Seconds(1));  // the heal runs
  EXPECT_THAT(trainer_->CloseSession(closed_.session_id()), IsOk());
  ExpectClosedAndKeptSteppedOn();
}

// A close that the loss of rank 0 cut after rank 1 dropped its replica and before rank 2 did
// (made here by closing it on rank 1 alone): rank 0's next process closes it on rank 2 too and
// heals itself in with the other sessions, which step on bit for bit. Before, the survivors'
// lists differed, the heal failed, and the whole group restarted, every session falling back to
// its automatic checkpoints (or lost, without any).
TEST_F(HealCloseTest, ASessionACutCloseLeftOnSomeRanksIsClosedAsRankZeroHealsIn) {
  auto peer = v1::PeerService::NewStub(
      grpc::CreateChannel(group_[1]->address(), grpc::InsecureChannelCredentials()));
  grpc::ClientContext context;
  v1::CloseReplicaRequest close;
  close.set_session_id(closed_.session_id());
  v1::CloseReplicaResponse closed;
  ASSERT_TRUE(peer->CloseReplica(&context, close, &closed).ok());
  group_[0]->SignalAndWait(SIGKILL);
  ASSERT_THAT(Restart(group_, 0, flags_), IsOk());
  ExpectClosedAndKeptSteppedOn();
}

// The fixture with rank 0 killed as it closes a session, once every other rank dropped its
// replica and its own is gone (--kill_during_close).
class HealCutCloseTest : public HealCloseTest {
 protected:
  HealCutCloseTest() { rank_zero_flags_.push_back("--kill_during_close"); }
};

// A close cut by the loss of rank 0 once every survivor had dropped its replica: no survivor
// holds the session, so rank 0's next process heals in without it, and its automatic checkpoints
// are gone too. Before, rank 0 removed them only after every rank dropped the session: they
// stayed, and the next restart of the group brought the closed session back.
TEST_F(HealCutCloseTest, ASessionWhoseCloseEveryRankCompletedBeforeRankZeroWasLostStaysClosed) {
  // Rank 0 dies before it answers; the client may look for it elsewhere meanwhile.
  std::thread close([&] { (void)trainer_->CloseSession(closed_.session_id()); });
  const int died = group_[0]->WaitFor(absl::Seconds(20));
  close.join();
  ASSERT_NE(died, -1) << "rank 0 did not die in the close";
  ASSERT_THAT(Restart(group_, 0, flags_), IsOk());
  ExpectClosedAndKeptSteppedOn();
}

}  // namespace
}  // namespace optstep
