// A rank of a real group on loopback dies while the group is idle (SIGKILL): with heartbeats every
// 100 ms and a 1 s peer timeout, every survivor turns NOT_SERVING within a few seconds, counts
// the loss, and answers the next CreateSession and Step with UNAVAILABLE naming the lost rank and
// what to do. A group whose ranks keep answering (also with TLS and tokens, through the peers'
// credentials) stays SERVING well past the timeout; a rank that shuts down on purpose is gone,
// not lost, and, like a rank shutting down itself, lets the trainers of a step already begun
// complete it while it refuses steps that have not begun. A rank that hangs mid-call (stopped,
// its connections up) ends the call within a few seconds.

#include <grpcpp/grpcpp.h>
#include <signal.h>

#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "client/cpp/client.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/integration/test_metrics.h"
#include "tests/integration/test_pki.h"
#include "tests/integration/test_session.h"
#include "tests/testing/directory_listing.h"
#include "tests/testing/server_process.h"
#include "tests/testing/status_matchers.h"

namespace optstep {
namespace {

using ::optstep::testutil::IsOk;
using ::optstep::testutil::OpenStep;
using ::optstep::testutil::ServerProcess;
using ::optstep::testutil::SmallSpec;
using ::optstep::testutil::StatusIs;
using ::testing::HasSubstr;

using Group = std::vector<std::unique_ptr<ServerProcess>>;

// The survivors stay up to be looked at (by default they exit for their supervisor).
const std::vector<std::string> kHeartbeatFlags = {
    "--heartbeat_interval_ms=100", "--peer_timeout_ms=1000", "--exit_on_peer_loss=false"};
// Time a survivor may take to turn NOT_SERVING: the timeout, a heartbeat, the health watch, and
// room for a loaded machine.
constexpr absl::Duration kBound = absl::Seconds(5);

std::vector<std::string> With(std::vector<std::string> flags,
                              const std::vector<std::string>& more) {
  flags.insert(flags.end(), more.begin(), more.end());
  return flags;
}

// A client of one rank (its health), with `base`'s security.
std::unique_ptr<Client> RankClient(const ServerProcess& rank, ClientOptions base = {}) {
  base.target = rank.address();
  base.rank_targets.clear();
  base.connect_timeout = absl::Seconds(20);
  auto client = Client::Connect(base);
  EXPECT_THAT(client.status(), IsOk());
  return client.ok() ? *std::move(client) : nullptr;
}

// Waits until `client`'s rank answers health with `serving`; answers how long that took, or
// DEADLINE_EXCEEDED after `bound`.
absl::StatusOr<absl::Duration> AwaitHealth(Client& client, bool serving, absl::Duration bound) {
  const absl::Time start = absl::Now();
  while (absl::Now() - start < bound) {
    absl::StatusOr<bool> health = client.CheckHealth();
    if (health.ok() && *health == serving) return absl::Now() - start;
    absl::SleepFor(absl::Milliseconds(50));
  }
  return absl::DeadlineExceededError(absl::StrCat("health did not turn ",
                                                  serving ? "SERVING" : "NOT_SERVING", " within ",
                                                  absl::FormatDuration(bound)));
}

bool Serving(Client& client) {
  absl::StatusOr<bool> health = client.CheckHealth();
  return health.ok() && *health;
}

// Every rank answers SERVING (they turn SERVING once the group is joined).
void ExpectAllServing(const std::vector<std::unique_ptr<Client>>& clients) {
  for (size_t r = 0; r < clients.size(); ++r) {
    ASSERT_NE(clients[r], nullptr);
    EXPECT_THAT(AwaitHealth(*clients[r], true, absl::Seconds(20)).status(), IsOk()) << "rank " << r;
  }
}

class PeerLossTest : public ::testing::TestWithParam<int> {};

TEST_P(PeerLossTest, SurvivorsOfASigkilledRankStopServingAndNameIt) {
  const int dead = GetParam();
  OPTSTEP_ASSERT_OK_AND_ASSIGN(
      Group group, testutil::StartGroup(3, With(kHeartbeatFlags, {"--metrics_port=-1"})));
  std::vector<std::unique_ptr<Client>> clients;
  for (const auto& rank : group) clients.push_back(RankClient(*rank));
  ExpectAllServing(clients);
  // A session made while the group is whole (three ranks, all of them own parameters).
  ClientOptions options;
  for (const auto& rank : group) options.rank_targets.push_back(rank->address());
  OPTSTEP_ASSERT_OK_AND_ASSIGN(auto trainer, Client::Connect(options));
  OPTSTEP_ASSERT_OK_AND_ASSIGN(v1::SessionInfo info, trainer->CreateSession(SmallSpec("loss")));
  // Idle for longer than the timeout: heartbeats answered, nobody lost.
  absl::SleepFor(absl::Milliseconds(1500));
  for (size_t r = 0; r < clients.size(); ++r) {
    EXPECT_TRUE(Serving(*clients[r])) << "rank " << r;
  }

  group[dead]->SignalAndWait(SIGKILL);
  for (int r = 0; r < 3; ++r) {
    if (r == dead) continue;
    auto took = AwaitHealth(*clients[r], false, kBound);
    ASSERT_THAT(took.status(), IsOk()) << "rank " << r;
    // Counted once on each survivor.
    EXPECT_THAT(testutil::AwaitMetric(group[r]->metrics_port(), "optstep_peers_lost_total", 1),
                IsOk())
        << "rank " << r;
    // A new Step stream is refused, naming the lost rank and what to do.
    const grpc::Status step = OpenStep::TryBegin(
        grpc::CreateChannel(group[r]->address(), grpc::InsecureChannelCredentials()),
        info.session_id(), 1);
    EXPECT_EQ(step.error_code(), grpc::StatusCode::UNAVAILABLE) << "rank " << r;
    EXPECT_THAT(step.error_message(), HasSubstr(absl::StrCat("rank ", dead, " lost")));
    EXPECT_THAT(step.error_message(), HasSubstr("restart the group"));
  }
  if (dead != 0) {
    // Rank 0 creates sessions: it refuses, naming the lost rank.
    auto created = clients[0]->CreateSession(SmallSpec("after"));
    EXPECT_THAT(created.status(), StatusIs(absl::StatusCode::kUnavailable,
                                           absl::StrCat("rank ", dead, " lost (no heartbeat for")));
  }
}

INSTANTIATE_TEST_SUITE_P(DeadRank, PeerLossTest, ::testing::Values(0, 2),
                         [](const auto& info) { return absl::StrCat("Rank", info.param); });

TEST(PeerLeaveTest, ARankShutDownOnPurposeIsGoneNotLost) {
  OPTSTEP_ASSERT_OK_AND_ASSIGN(
      Group group, testutil::StartGroup(2, With(kHeartbeatFlags, {"--metrics_port=-1"})));
  std::vector<std::unique_ptr<Client>> clients;
  for (const auto& rank : group) clients.push_back(RankClient(*rank));
  ExpectAllServing(clients);
  EXPECT_EQ(group[1]->SignalAndWait(SIGTERM), 0);
  ASSERT_THAT(AwaitHealth(*clients[0], false, kBound).status(), IsOk());
  auto created = clients[0]->CreateSession(SmallSpec("after"));
  EXPECT_THAT(created.status(),
              StatusIs(absl::StatusCode::kUnavailable, "rank 1 left the group (it was shut down)"));
  // Past the timeout: still gone, never lost.
  absl::SleepFor(absl::Milliseconds(1500));
  EXPECT_EQ(testutil::ScrapeMetrics(group[0]->metrics_port())["optstep_peers_lost_total"], 0);
}

TEST(PeerLeaveTest, TheOtherTrainersOfAStepBegunBeforeARankLeftMayStillJoinIt) {
  OPTSTEP_ASSERT_OK_AND_ASSIGN(
      Group group, testutil::StartGroup(2, With(kHeartbeatFlags, {"--metrics_port=-1",
                                                                  "--shutdown_grace_ms=10000"})));
  std::vector<std::unique_ptr<Client>> clients;
  for (const auto& rank : group) clients.push_back(RankClient(*rank));
  ExpectAllServing(clients);
  ClientOptions options;
  for (const auto& rank : group) options.rank_targets.push_back(rank->address());
  OPTSTEP_ASSERT_OK_AND_ASSIGN(auto trainer0, Client::Connect(options));
  OPTSTEP_ASSERT_OK_AND_ASSIGN(auto trainer1, Client::Connect(options));
  v1::SessionSpec spec = SmallSpec("pair");
  spec.set_num_trainers(2);
  spec.set_gradient_mode(v1::GRADIENT_MODE_REPLICATED);
  OPTSTEP_ASSERT_OK_AND_ASSIGN(v1::SessionInfo info, trainer0->CreateSession(spec));
  // Both ranks own parameters (fc.weight: 32 elements, fc.bias: 8), so the step needs both.
  std::vector<double> gradient_bytes(2, 0);
  for (int p = 0; p < info.layout().owner_size(); ++p) {
    gradient_bytes[info.layout().owner(p)] += (p == 0 ? 32 : 8) * sizeof(float);
  }
  ASSERT_GT(gradient_bytes[0], 0);
  ASSERT_GT(gradient_bytes[1], 0);

  // Trainer 0 begins step 1 on both ranks (its gradients arrived), then waits for trainer 1.
  absl::StatusOr<StepReply> first;
  std::thread step_first([&] { first = testutil::StepSmall(*trainer0, info.session_id(), 1, 0); });
  for (int r = 0; r < 2; ++r) {
    EXPECT_THAT(testutil::AwaitMetric(group[r]->metrics_port(),
                                      "optstep_gradient_bytes_received_total", gradient_bytes[r]),
                IsOk())
        << "rank " << r;
  }
  group[1]->Signal(SIGTERM);
  // Rank 0 has heard that rank 1 leaves.
  EXPECT_THAT(AwaitHealth(*clients[0], false, kBound).status(), IsOk());
  // Trainer 1 arrives afterwards: it joins step 1 on both ranks, which completes for both.
  absl::StatusOr<StepReply> second = testutil::StepSmall(*trainer1, info.session_id(), 1, 1);
  step_first.join();
  for (const auto* result : {&first, &second}) {
    ASSERT_THAT(result->status(), IsOk());
    EXPECT_EQ((*result)->step, 1u);
  }
  EXPECT_EQ(group[1]->Wait(), 0);
  // A step that had not begun is refused, naming the rank that left.
  const grpc::Status refused = OpenStep::TryBegin(
      grpc::CreateChannel(group[0]->address(), grpc::InsecureChannelCredentials()),
      info.session_id(), 2);
  EXPECT_EQ(refused.error_code(), grpc::StatusCode::UNAVAILABLE);
  EXPECT_THAT(refused.error_message(), HasSubstr("rank 1 left the group"));
}

// A rank that hangs as it writes its shard of a Save (--hang_in_save_shard stops its process: a
// host lost mid-save, whose connections stay up and answer nothing) ends the Save within a few
// seconds of its last answered ping, naming the rank and what the Save waited for; every other
// call of the Save to it (releasing its hold, renewing it) ends as soon. (Before, the Save waited
// a day for the shard.)
TEST(PeerHangTest, ASaveWhoseRankHangsWritingItsShardEndsNamingIt) {
  testutil::ScopedTempDir root("optstep-ckpt");
  OPTSTEP_ASSERT_OK_AND_ASSIGN(
      Group group,
      testutil::StartGroup(2, With(kHeartbeatFlags, {"--metrics_port=-1", "--hang_in_save_shard",
                                                     "--checkpoint_root=" + root.path()})));
  std::vector<std::unique_ptr<Client>> clients;
  for (const auto& rank : group) clients.push_back(RankClient(*rank));
  ExpectAllServing(clients);
  ClientOptions options;
  for (const auto& rank : group) options.rank_targets.push_back(rank->address());
  options.stream_timeout = absl::Seconds(60);  // the old code's Save lasts to here
  OPTSTEP_ASSERT_OK_AND_ASSIGN(auto trainer, Client::Connect(options));
  OPTSTEP_ASSERT_OK_AND_ASSIGN(v1::SessionInfo info, trainer->CreateSession(SmallSpec("hang")));

  const absl::Time start = absl::Now();
  absl::StatusOr<v1::CheckpointProgress> saved = trainer->Save(info.session_id(), "hung");
  // Twice the peer timeout without an answered ping, for the shard and again for the release.
  EXPECT_LT(absl::Now() - start, absl::Seconds(15));
  EXPECT_THAT(saved.status(),
              StatusIs(absl::StatusCode::kDeadlineExceeded,
                       "rank 1: no progress for 2s while waiting for its shard to be written"));
  // Rank 0 serves on (its checkpoint root holds no complete checkpoint).
  EXPECT_THAT(trainer->GetSession(info.session_id()).status(), IsOk());
}

TEST(PeerLossTlsTest, HeartbeatsUseThePeersCredentials) {
  const std::string dir = testutil::TestTmpDir();
  OPTSTEP_ASSERT_OK_AND_ASSIGN(testutil::TestPki pki, testutil::MakeTestPki(dir, "heartbeat"));
  const std::string tokens = testutil::WriteTestFile(
      dir, "heartbeat_tokens",
      "alice user user-token-1b2c3d4e5f\nranks peer peer-token-4e5f6a7b8c\n");
  OPTSTEP_ASSERT_OK_AND_ASSIGN(
      Group group,
      testutil::StartGroup(
          2, With(kHeartbeatFlags, {"--tls_cert=" + pki.server_cert, "--tls_key=" + pki.server_key,
                                    "--tls_client_ca=" + pki.ca, "--auth_tokens_file=" + tokens})));
  ClientOptions tls;
  tls.tls = true;
  tls.tls_ca_file = pki.ca;
  tls.tls_cert_file = pki.client_cert;
  tls.tls_key_file = pki.client_key;
  tls.token = "user-token-1b2c3d4e5f";
  std::vector<std::unique_ptr<Client>> clients;
  for (const auto& rank : group) clients.push_back(RankClient(*rank, tls));
  ExpectAllServing(clients);
  // Authenticated heartbeats are answered: both ranks stay SERVING well past the timeout.
  absl::SleepFor(absl::Milliseconds(2500));
  for (size_t r = 0; r < clients.size(); ++r) {
    EXPECT_TRUE(Serving(*clients[r])) << "rank " << r;
  }
  group[1]->SignalAndWait(SIGKILL);
  EXPECT_THAT(AwaitHealth(*clients[0], false, kBound).status(), IsOk());
  auto created = clients[0]->CreateSession(SmallSpec("after"));
  EXPECT_THAT(created.status(), StatusIs(absl::StatusCode::kUnavailable, "rank 1 lost"));
}

}  // namespace
}  // namespace optstep
