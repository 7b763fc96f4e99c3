// A rank of a real 3-rank group on loopback is SIGKILLed between steps and restarted with its
// ordinal on its port (as its supervisor does): with --state_redundancy=1 the other ranks stay up
// (NOT_SERVING while it is away), rank 0 heals it into the running group (a new generation, the
// sessions' communicators rebuilt, its replicas created with the same ids and given the masters
// and counters; their liveness service stays SERVING meanwhile), the group turns SERVING again and
// training goes on, ending bit for bit with an undisturbed run. A session whose lost rank owned
// optimizer state that a step changed cannot be healed without a redundant copy of that state: the
// group exits for a restart (status 75).

#include <grpcpp/grpcpp.h>
#include <signal.h>
#include <sys/wait.h>

#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "client/cpp/client.h"
#include "gmock/gmock.h"
#include "grpc/health/v1/health.grpc.pb.h"
#include "gtest/gtest.h"
#include "tests/integration/test_session.h"
#include "tests/testing/server_process.h"
#include "tests/testing/status_matchers.h"

namespace optstep {
namespace {

using ::optstep::testutil::IsOk;
using ::optstep::testutil::ServerProcess;
using ::optstep::testutil::SmallSpec;
using ::optstep::testutil::StepSmall;

using Group = std::vector<std::unique_ptr<ServerProcess>>;

constexpr int kWorld = 3;
constexpr int kDead = 1;
const std::vector<std::string> kFlags = {"--heartbeat_interval_ms=100", "--peer_timeout_ms=1000",
                                         "--state_redundancy=1", "--rejoin_timeout_ms=30000"};

// SGD without momentum keeps no optimizer state: its masters are all a rank needs.
v1::SessionSpec StatelessSpec(const std::string& name) {
  v1::SessionSpec spec = SmallSpec(name);
  spec.mutable_optimizer()->set_preset("sgd");
  (*spec.mutable_optimizer()->mutable_megatron_args())["sgd_momentum"] = "0";
  return spec;
}

std::unique_ptr<Client> Trainer(const Group& group) {
  ClientOptions options;
  for (const auto& rank : group) options.rank_targets.push_back(rank->address());
  options.connect_timeout = absl::Seconds(20);
  options.recovery_timeout = absl::Seconds(30);
  auto client = Client::Connect(options);
  EXPECT_THAT(client.status(), IsOk());
  return client.ok() ? *std::move(client) : nullptr;
}

// Whether rank `rank`'s health answers `serving` within `bound`.
bool AwaitHealth(const ServerProcess& rank, bool serving, absl::Duration bound) {
  ClientOptions options;
  options.target = rank.address();
  auto client = Client::Connect(options);
  if (!client.ok()) return false;
  for (const absl::Time end = absl::Now() + bound; absl::Now() < end;) {
    absl::StatusOr<bool> health = (*client)->CheckHealth();
    if (health.ok() && *health == serving) return true;
    absl::SleepFor(absl::Milliseconds(50));
  }
  return false;
}

// Whether rank `rank`'s liveness service (what a liveness probe asks) answers SERVING.
bool Live(const ServerProcess& rank) {
  auto health = grpc::health::v1::Health::NewStub(
      grpc::CreateChannel(rank.address(), grpc::InsecureChannelCredentials()));
  grpc::ClientContext context;
  context.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(5)));
  grpc::health::v1::HealthCheckRequest request;
  request.set_service("optstep.liveness");
  grpc::health::v1::HealthCheckResponse response;
  return health->Check(&context, request, &response).ok() &&
         response.status() == grpc::health::v1::HealthCheckResponse::SERVING;
}

// Restarts rank `rank` of `group` (killed) with its ordinal, on its port.
absl::Status Restart(Group& group, int rank, std::vector<std::string> flags) {
  const std::string& address = group[rank]->address();
  flags.push_back(absl::StrCat("--port=", address.substr(address.rfind(':') + 1)));
  flags.push_back(absl::StrCat("--rank=", rank));
  flags.push_back(absl::StrCat("--world_size=", group.size()));
  flags.push_back(absl::StrCat("--rendezvous=", group[0]->address()));
  OPTSTEP_ASSIGN_OR_RETURN(group[rank], ServerProcess::Start(flags));
  return absl::OkStatus();
}

// The parameters of a stateless session after steps 1..4 and of an Adam session after its steps
// 1..2 (made after step 2 of the first), on `group`; with `kill`, rank kDead is killed after
// step 2 and restarted before step 3.
struct Trained {
  std::string stateless;
  std::string adam;
};
absl::StatusOr<Trained> Train(Group& group, bool kill) {
  if (!AwaitHealth(*group[0], true, absl::Seconds(20))) return absl::InternalError("not serving");
  std::unique_ptr<Client> trainer = Trainer(group);
  if (trainer == nullptr) return absl::InternalError("no trainer");
  OPTSTEP_ASSIGN_OR_RETURN(v1::SessionInfo stateless,
                           trainer->CreateSession(StatelessSpec("stateless")));
  for (uint64_t step = 1; step <= 2; ++step) {
    OPTSTEP_RETURN_IF_ERROR(StepSmall(*trainer, stateless.session_id(), step).status());
  }
  // Made but not stepped before the loss: its fresh optimizer state is its state.
  OPTSTEP_ASSIGN_OR_RETURN(v1::SessionInfo adam, trainer->CreateSession(SmallSpec("adam")));
  if (kill) {
    group[kDead]->SignalAndWait(SIGKILL);
    for (int r = 0; r < kWorld; ++r) {
      if (r != kDead && !AwaitHealth(*group[r], false, absl::Seconds(10))) {
        return absl::InternalError(absl::StrCat("rank ", r, " did not notice the loss"));
      }
      // Not ready, yet alive: a liveness probe leaves it running while it waits.
      if (r != kDead && !Live(*group[r])) {
        return absl::InternalError(absl::StrCat("rank ", r, " is not live while it waits"));
      }
    }
    OPTSTEP_RETURN_IF_ERROR(Restart(group, kDead, kFlags));
    for (int r = 0; r < kWorld; ++r) {
      if (!AwaitHealth(*group[r], true, absl::Seconds(20))) {
        return absl::InternalError(absl::StrCat("rank ", r, " is not SERVING after the rejoin"));
      }
    }
  }
  for (uint64_t step = 3; step <= 4; ++step) {
    OPTSTEP_RETURN_IF_ERROR(StepSmall(*trainer, stateless.session_id(), step).status());
  }
  for (uint64_t step = 1; step <= 2; ++step) {
    OPTSTEP_RETURN_IF_ERROR(StepSmall(*trainer, adam.session_id(), step).status());
  }
  Trained run;
  OPTSTEP_ASSIGN_OR_RETURN(run.stateless, testutil::Pulled(*trainer, stateless.session_id()));
  OPTSTEP_ASSIGN_OR_RETURN(run.adam, testutil::Pulled(*trainer, adam.session_id()));
  return run;
}

TEST(RejoinTest, ARankRestartedBetweenStepsRejoinsAndTrainingEndsBitIdentical) {
  OPTSTEP_ASSERT_OK_AND_ASSIGN(Group reference_group, testutil::StartGroup(kWorld, kFlags));
  OPTSTEP_ASSERT_OK_AND_ASSIGN(Trained reference, Train(reference_group, /*kill=*/false));
  reference_group.clear();

  OPTSTEP_ASSERT_OK_AND_ASSIGN(Group group, testutil::StartGroup(kWorld, kFlags));
  OPTSTEP_ASSERT_OK_AND_ASSIGN(Trained healed, Train(group, /*kill=*/true));
  EXPECT_EQ(healed.stateless, reference.stateless);
  EXPECT_EQ(healed.adam, reference.adam);
  // The survivors never left: the same processes serve.
  for (int r = 0; r < kWorld; ++r) EXPECT_EQ(kill(group[r]->pid(), 0), 0) << "rank " << r;
}

TEST(RejoinTest, LostOptimizerStateWithoutARedundantCopyRestartsTheGroup) {
  OPTSTEP_ASSERT_OK_AND_ASSIGN(Group group, testutil::StartGroup(kWorld, kFlags));
  ASSERT_TRUE(AwaitHealth(*group[0], true, absl::Seconds(20)));
  std::unique_ptr<Client> trainer = Trainer(group);
  ASSERT_NE(trainer, nullptr);
  OPTSTEP_ASSERT_OK_AND_ASSIGN(v1::SessionInfo info, trainer->CreateSession(SmallSpec("adam")));
  int owned = 0;
  for (int p = 0; p < info.layout().owner_size(); ++p) owned += info.layout().owner(p) == kDead;
  ASSERT_GT(owned, 0) << "rank " << kDead << " owns no parameter";
  ASSERT_THAT(StepSmall(*trainer, info.session_id(), 1).status(), IsOk());
  group[kDead]->SignalAndWait(SIGKILL);
  ASSERT_TRUE(AwaitHealth(*group[0], false, absl::Seconds(10)));
  ASSERT_THAT(Restart(group, kDead, kFlags), IsOk());
  // Rank 0 cannot heal it (the Adam moments of its parameters are gone): every rank exits for
  // its supervisor to restart the group from its checkpoints.
  for (int r = 0; r < kWorld; ++r) {
    const int status = group[r]->Wait();
    ASSERT_TRUE(WIFEXITED(status)) << "rank " << r;
    EXPECT_EQ(WEXITSTATUS(status), 75) << "rank " << r;
  }
}

}  // namespace
}  // namespace optstep
