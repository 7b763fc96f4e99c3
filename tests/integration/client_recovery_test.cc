// The C++ client's Step survives a group restart (real server processes on loopback, automatic
// checkpoints every step): the whole group is SIGKILLed, a trainer's next step meets it down and
// waits; the group is started again on the same ports (as its supervisor would) and restores the
// session; the step is redone with the same gradients and the run ends bit for bit where an
// undisturbed group ends. A session restored further back answers ABORTED with RewindStep.

#include <signal.h>

#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "absl/time/clock.h"
#include "client/cpp/client.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/integration/test_session.h"
#include "tests/testing/directory_listing.h"
#include "tests/testing/server_process.h"
#include "tests/testing/status_matchers.h"

namespace optstep {
namespace {

using ::optstep::testutil::AwaitAutoCheckpoint;
using ::optstep::testutil::IsOk;
using ::optstep::testutil::Pulled;
using ::optstep::testutil::ServerProcess;
using ::optstep::testutil::SmallSpec;
using ::optstep::testutil::StepSmall;
using ::testing::Optional;

using Group = std::vector<std::unique_ptr<ServerProcess>>;
constexpr int kWorld = 2;
constexpr uint64_t kSteps = 5;

// Ranks 0..kWorld-1 with `flags`, on `ports` (0: free ones).
absl::StatusOr<Group> StartOn(const std::vector<std::string>& flags, std::vector<int> ports) {
  return testutil::StartGroupWith(kWorld, [&](int rank) {
    std::vector<std::string> args = flags;
    args.push_back(absl::StrCat("--port=", ports[rank]));
    return args;
  });
}

int PortOf(const ServerProcess& rank) {
  const std::string& address = rank.address();
  return std::stoi(address.substr(address.rfind(':') + 1));
}

absl::StatusOr<std::unique_ptr<Client>> Connect(const Group& group, absl::Duration recovery) {
  ClientOptions options;
  for (const auto& rank : group) options.rank_targets.push_back(rank->address());
  options.connect_timeout = absl::Seconds(20);
  options.recovery_timeout = recovery;
  OPTSTEP_ASSIGN_OR_RETURN(std::unique_ptr<Client> client, Client::Connect(options));
  OPTSTEP_RETURN_IF_ERROR(testutil::WaitServing(*client));
  return client;
}

class ClientRecoveryTest : public ::testing::Test {
 protected:
  std::vector<std::string> Flags(int every_steps) const {
    return {"--checkpoint_root=" + root_.path(),
            absl::StrCat("--checkpoint_every_steps=", every_steps), "--heartbeat_interval_ms=100",
            "--peer_timeout_ms=1000"};
  }
  // Steps 1..`last` of `session`, each step in `saved` awaited in its automatic checkpoint.
  absl::Status Steps(Client& client, const std::string& session, uint64_t last,
                     const std::vector<uint64_t>& saved) {
    for (uint64_t step = 1; step <= last; ++step) {
      OPTSTEP_RETURN_IF_ERROR(StepSmall(client, session, step).status());
      for (uint64_t s : saved) {
        if (s == step) OPTSTEP_RETURN_IF_ERROR(AwaitAutoCheckpoint(root_.path(), session, step));
      }
    }
    return absl::OkStatus();
  }
  testutil::ScopedTempDir root_{"optstep-recovery"};
};

TEST_F(ClientRecoveryTest, AStepWhileTheGroupRestartsIsRedoneAndEndsBitForBit) {
  std::string reference;
  {
    OPTSTEP_ASSERT_OK_AND_ASSIGN(Group group, StartOn({}, {0, 0}));
    OPTSTEP_ASSERT_OK_AND_ASSIGN(auto client, Connect(group, absl::ZeroDuration()));
    OPTSTEP_ASSERT_OK_AND_ASSIGN(v1::SessionInfo info, client->CreateSession(SmallSpec("r")));
    ASSERT_THAT(Steps(*client, info.session_id(), kSteps, {}), IsOk());
    OPTSTEP_ASSERT_OK_AND_ASSIGN(reference, Pulled(*client, info.session_id()));
  }
  OPTSTEP_ASSERT_OK_AND_ASSIGN(Group group, StartOn(Flags(1), {0, 0}));
  const std::vector<int> ports = {PortOf(*group[0]), PortOf(*group[1])};
  OPTSTEP_ASSERT_OK_AND_ASSIGN(auto client, Connect(group, absl::Seconds(60)));
  OPTSTEP_ASSERT_OK_AND_ASSIGN(v1::SessionInfo info, client->CreateSession(SmallSpec("r")));
  const std::string session = info.session_id();
  ASSERT_THAT(Steps(*client, session, 3, {3}), IsOk());
  for (auto& rank : group) rank->SignalAndWait(SIGKILL);

  absl::StatusOr<StepReply> step4 = absl::UnknownError("not run");
  std::thread trainer([&] { step4 = StepSmall(*client, session, 4); });
  absl::SleepFor(absl::Milliseconds(300));  // the step meets a group that is down
  absl::StatusOr<Group> restarted = StartOn(Flags(1), ports);
  trainer.join();
  ASSERT_THAT(restarted.status(), IsOk());
  ASSERT_THAT(step4.status(), IsOk());
  EXPECT_EQ(step4->step, 4u);
  ASSERT_THAT(StepSmall(*client, session, 5).status(), IsOk());
  OPTSTEP_ASSERT_OK_AND_ASSIGN(std::string pulled, Pulled(*client, session));
  EXPECT_TRUE(pulled == reference) << "parameters differ from the undisturbed run";
}

TEST_F(ClientRecoveryTest, ASessionRestoredFurtherBackAnswersAbortedWithTheRestoredStep) {
  // Saved after steps 1 and 3 (each awaited); killed after step 4.
  OPTSTEP_ASSERT_OK_AND_ASSIGN(Group group, StartOn(Flags(2), {0, 0}));
  const std::vector<int> ports = {PortOf(*group[0]), PortOf(*group[1])};
  OPTSTEP_ASSERT_OK_AND_ASSIGN(auto client, Connect(group, absl::Seconds(60)));
  OPTSTEP_ASSERT_OK_AND_ASSIGN(v1::SessionInfo info, client->CreateSession(SmallSpec("r")));
  ASSERT_THAT(Steps(*client, info.session_id(), 4, {1, 3}), IsOk());
  for (auto& rank : group) rank->SignalAndWait(SIGKILL);
  OPTSTEP_ASSERT_OK_AND_ASSIGN(Group restarted, StartOn(Flags(2), ports));
  absl::StatusOr<StepReply> step5 = StepSmall(*client, info.session_id(), 5);
  EXPECT_THAT(step5.status(), testutil::StatusIs(absl::StatusCode::kAborted, "restored to step 3"));
  EXPECT_THAT(RewindStep(step5.status()), Optional(3u));
  // The loop goes on from step 4.
  EXPECT_THAT(StepSmall(*client, info.session_id(), 4).status(), IsOk());
}

}  // namespace
}  // namespace optstep
