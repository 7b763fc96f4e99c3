// What meets a heal: the end of a heal reaches every rank although a call to one of them is lost,
// and a session closed while a heal runs waits for it to end.

#include <signal.h>

#include <memory>
#include <string>
#include <vector>

#include "absl/time/time.h"
#include "client/cpp/client.h"
#include "gtest/gtest.h"
#include "tests/integration/healing_group.h"
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
using ::optstep::testutil::SpreadSpec;
using ::optstep::testutil::SteppedReference;
using ::optstep::testutil::StepSpread;
using ::optstep::testutil::Trainer;

constexpr int kWorld = 3;
constexpr int kDead = 1;

// Rank 0 (with --drop_first_peer_call) drops its first call that ends the heal on rank 2, as a
// connection reset would, and makes it again. Before, the heal's end was sent once: rank 2 kept
// its sessions paused and answered NOT_SERVING for ever, though live, so nothing restarted it.
TEST(HealRacesTest, AHealsEndLostOnTheWayToARankIsMadeAgain) {
  std::vector<std::string> flags = testutil::HealingFlags();
  flags.push_back("--drop_first_peer_call=HealEnd:2");
  OPTSTEP_ASSERT_OK_AND_ASSIGN(Group group, testutil::StartGroup(kWorld, flags));
  ASSERT_TRUE(AwaitHealth(*group[0], true, absl::Seconds(20)));
  std::unique_ptr<Client> trainer = Trainer(group);
  ASSERT_NE(trainer, nullptr);
  OPTSTEP_ASSERT_OK_AND_ASSIGN(v1::SessionInfo reference, SteppedReference(*trainer, 4));
  OPTSTEP_ASSERT_OK_AND_ASSIGN(v1::SessionInfo healed,
                               trainer->CreateSession(SpreadSpec("healed")));
  for (uint64_t step = 1; step <= 2; ++step) {
    ASSERT_THAT(StepSpread(*trainer, healed.session_id(), step).status(), IsOk());
  }
  group[kDead]->SignalAndWait(SIGKILL);
  ASSERT_TRUE(AwaitHealth(*group[0], false, absl::Seconds(10)));
  ASSERT_THAT(Restart(group, kDead, flags), IsOk());
  for (int r = 0; r < kWorld; ++r) {
    EXPECT_TRUE(AwaitHealth(*group[r], true, absl::Seconds(20))) << "rank " << r;
  }
  for (uint64_t step = 3; step <= 4; ++step) {
    ASSERT_THAT(StepSpread(*trainer, healed.session_id(), step).status(), IsOk());
  }
  EXPECT_THAT(SameStateAndParameters(*trainer, reference.session_id(), healed.session_id()),
              IsOk());
  for (int r = 0; r < kWorld; ++r) EXPECT_TRUE(Live(*group[r])) << "rank " << r;
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

// A session closed while a restarted rank heals in (its transfer slowed by
// --delay_heal_fetch_ms) is closed once the heal ended. Before, the close ran during the heal: the
// healed rank found the session gone from its buddy, the heal failed and the group restarted.
TEST(HealRacesTest, ASessionClosedWhileARankHealsInIsClosedAfterTheHeal) {
  const std::vector<std::string> flags = testutil::HealingFlags();
  OPTSTEP_ASSERT_OK_AND_ASSIGN(Group group, testutil::StartGroup(kWorld, flags));
  ASSERT_TRUE(AwaitHealth(*group[0], true, absl::Seconds(20)));
  std::unique_ptr<Client> trainer = Trainer(group);
  ASSERT_NE(trainer, nullptr);
  OPTSTEP_ASSERT_OK_AND_ASSIGN(v1::SessionInfo reference, SteppedReference(*trainer, 4));
  OPTSTEP_ASSERT_OK_AND_ASSIGN(v1::SessionInfo kept, trainer->CreateSession(SpreadSpec("kept")));
  OPTSTEP_ASSERT_OK_AND_ASSIGN(v1::SessionInfo closed,
                               trainer->CreateSession(SpreadSpec("closed")));
  for (uint64_t step = 1; step <= 2; ++step) {
    ASSERT_THAT(StepSpread(*trainer, kept.session_id(), step).status(), IsOk());
  }
  group[kDead]->SignalAndWait(SIGKILL);
  ASSERT_TRUE(AwaitHealth(*group[0], false, absl::Seconds(10)));
  std::vector<std::string> slow = flags;
  slow.push_back("--delay_heal_fetch_ms=1500");  // three sessions: a transfer of seconds
  ASSERT_THAT(Restart(group, kDead, slow), IsOk());
  absl::SleepFor(absl::Seconds(1));  // the heal runs
  EXPECT_THAT(trainer->CloseSession(closed.session_id()), IsOk());
  for (int r = 0; r < kWorld; ++r) {
    EXPECT_TRUE(AwaitHealth(*group[r], true, absl::Seconds(30))) << "rank " << r;
    EXPECT_TRUE(Running(*group[r])) << "rank " << r;
  }
  EXPECT_THAT(trainer->GetSession(closed.session_id()).status(),
              testutil::StatusIs(absl::StatusCode::kNotFound));
  for (uint64_t step = 3; step <= 4; ++step) {
    ASSERT_THAT(StepSpread(*trainer, kept.session_id(), step).status(), IsOk());
  }
  EXPECT_THAT(SameStateAndParameters(*trainer, reference.session_id(), kept.session_id()), IsOk());
}

}  // namespace
}  // namespace optstep
