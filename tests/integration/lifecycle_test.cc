// SIGTERM on a real server in the middle of a session: health turns NOT_SERVING at once, new
// Step streams are refused with UNAVAILABLE, the step in progress still completes (or, if its
// trainer never commits, ends UNAVAILABLE at the grace period), and the process exits 0 within
// the grace period (and the second its streams' ends get to go out). With --checkpoint_on_shutdown
// the last applied step is saved on the way out.

#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>

#include <fstream>
#include <iterator>
#include <string>
#include <thread>

#include <grpcpp/create_channel.h>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "client/cpp/client.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/integration/test_metrics.h"
#include "tests/integration/test_pki.h"
#include "tests/integration/test_session.h"
#include "tests/testing/server_process.h"
#include "tests/testing/status_matchers.h"

namespace optstep {
namespace {

using ::optstep::testutil::IsOk;
using ::optstep::testutil::OpenStep;
using ::optstep::testutil::ServerProcess;
using ::optstep::testutil::SmallSpec;
using ::optstep::testutil::StatusIs;
using ::optstep::testutil::StepSmall;
using ::testing::HasSubstr;

struct Running {
  std::unique_ptr<ServerProcess> server;
  std::unique_ptr<Client> client;
  std::shared_ptr<grpc::Channel> channel;
  std::string session_id;
};

// A server with one session that has applied step 1.
absl::StatusOr<Running> StartWithSession(std::vector<std::string> flags) {
  Running r;
  OPTSTEP_ASSIGN_OR_RETURN(r.server, ServerProcess::Start(std::move(flags)));
  ClientOptions options;
  options.target = r.server->address();
  OPTSTEP_ASSIGN_OR_RETURN(r.client, Client::Connect(options));
  OPTSTEP_RETURN_IF_ERROR(testutil::WaitServing(*r.client));
  OPTSTEP_ASSIGN_OR_RETURN(v1::SessionInfo info, r.client->CreateSession(SmallSpec("life")));
  r.session_id = info.session_id();
  OPTSTEP_RETURN_IF_ERROR(StepSmall(*r.client, r.session_id, 1).status());
  r.channel = grpc::CreateChannel(r.server->address(), grpc::InsecureChannelCredentials());
  return r;
}

// Waits until the server has taken the gradients of the step-2 stream opened by hand (so its
// header was accepted before the signal).
absl::Status AwaitGradientsOfStep2(const Running& r) {
  return testutil::AwaitMetric(r.server->metrics_port(), "optstep_gradient_bytes_received_total",
                               2 * testutil::kSmallElements * sizeof(float));
}

// Polls health until it is no longer SERVING; answers how long that took.
absl::Duration UntilNotServing(Client& client) {
  const absl::Time start = absl::Now();
  while (absl::Now() - start < absl::Seconds(5)) {
    auto serving = client.CheckHealth();
    if (!serving.ok() || !*serving) break;
    absl::SleepFor(absl::Milliseconds(5));
  }
  return absl::Now() - start;
}

void ExpectCleanExit(int status) {
  ASSERT_TRUE(WIFEXITED(status)) << "status " << status;
  EXPECT_EQ(WEXITSTATUS(status), 0);
}

TEST(LifecycleTest, SigtermFinishesTheRunningStepRefusesNewOnesAndExits) {
  OPTSTEP_ASSERT_OK_AND_ASSIGN(
      Running r, StartWithSession({"--shutdown_grace_ms=10000", "--metrics_port=-1"}));
  OPTSTEP_ASSERT_OK_AND_ASSIGN(v1::SessionInfo idle, r.client->CreateSession(SmallSpec("idle")));
  OPTSTEP_ASSERT_OK_AND_ASSIGN(auto open, OpenStep::Begin(r.channel, r.session_id, 2));
  ASSERT_THAT(AwaitGradientsOfStep2(r), IsOk());

  const absl::Time sigterm = absl::Now();
  r.server->Signal(SIGTERM);
  // NOT_SERVING while the step is still open (the health service still answers).
  EXPECT_LT(UntilNotServing(*r.client), absl::Seconds(1));
  auto health = r.client->CheckHealth();
  ASSERT_THAT(health.status(), IsOk());
  EXPECT_FALSE(*health);

  // A step that had not begun does not start.
  const grpc::Status refused = OpenStep::TryBegin(r.channel, idle.session_id(), 1);
  EXPECT_EQ(refused.error_code(), grpc::StatusCode::UNAVAILABLE) << refused.error_message();
  EXPECT_THAT(refused.error_message(), HasSubstr("shutting down"));

  // The step in progress completes normally.
  OPTSTEP_ASSERT_OK_AND_ASSIGN(uint64_t applied, open->Commit());
  EXPECT_EQ(applied, 2u);

  ExpectCleanExit(r.server->Wait());
  EXPECT_LT(absl::Now() - sigterm, absl::Seconds(5)) << "waited for nothing";
}

TEST(LifecycleTest, AShutdownCallTakesTheSigtermPath) {
  OPTSTEP_ASSERT_OK_AND_ASSIGN(
      Running r, StartWithSession({"--shutdown_grace_ms=10000", "--metrics_port=-1"}));
  OPTSTEP_ASSERT_OK_AND_ASSIGN(auto open, OpenStep::Begin(r.channel, r.session_id, 2));
  ASSERT_THAT(AwaitGradientsOfStep2(r), IsOk());
  EXPECT_THAT(r.client->Shutdown(1), StatusIs(absl::StatusCode::kOutOfRange, "rank 1"));
  ASSERT_THAT(r.client->Shutdown(0, "lifecycle test"), IsOk());
  EXPECT_LT(UntilNotServing(*r.client), absl::Seconds(1));
  OPTSTEP_ASSERT_OK_AND_ASSIGN(uint64_t applied, open->Commit());  // the running step completes
  EXPECT_EQ(applied, 2u);
  ExpectCleanExit(r.server->Wait());
}

TEST(LifecycleTest, TheOtherTrainersOfABegunStepMayStillJoinIt) {
  OPTSTEP_ASSERT_OK_AND_ASSIGN(
      auto server, ServerProcess::Start({"--metrics_port=-1", "--shutdown_grace_ms=3000"}));
  ClientOptions options;
  options.target = server->address();
  OPTSTEP_ASSERT_OK_AND_ASSIGN(auto client, Client::Connect(options));
  v1::SessionSpec spec = SmallSpec("pair");
  spec.set_num_trainers(2);
  spec.set_gradient_mode(v1::GRADIENT_MODE_REPLICATED);
  OPTSTEP_ASSERT_OK_AND_ASSIGN(v1::SessionInfo info, client->CreateSession(spec));
  auto channel = grpc::CreateChannel(server->address(), grpc::InsecureChannelCredentials());
  OPTSTEP_ASSERT_OK_AND_ASSIGN(auto first, OpenStep::Begin(channel, info.session_id(), 1, 0));
  ASSERT_THAT(testutil::AwaitMetric(server->metrics_port(), "optstep_gradient_bytes_received_total",
                                    testutil::kSmallElements * sizeof(float)),
              IsOk());
  server->Signal(SIGTERM);
  EXPECT_LT(UntilNotServing(*client), absl::Seconds(1));
  // Trainer 1 arrives after the signal: it joins step 1, which then completes for both.
  OPTSTEP_ASSERT_OK_AND_ASSIGN(auto second, OpenStep::Begin(channel, info.session_id(), 1, 1));
  absl::StatusOr<uint64_t> first_result;
  std::thread commit_first([&] { first_result = first->Commit(); });
  absl::StatusOr<uint64_t> second_result = second->Commit();
  commit_first.join();
  for (const auto* result : {&first_result, &second_result}) {
    ASSERT_THAT(result->status(), IsOk());
    EXPECT_EQ(**result, 1u);
  }
  ExpectCleanExit(server->Wait());
}

TEST(LifecycleTest, AStepThatNeverCommitsIsCutAtTheGracePeriod) {
  const absl::Duration grace = absl::Milliseconds(1500);
  OPTSTEP_ASSERT_OK_AND_ASSIGN(
      Running r,
      StartWithSession({absl::StrCat("--shutdown_grace_ms=", absl::ToInt64Milliseconds(grace)),
                        "--metrics_port=-1"}));
  OPTSTEP_ASSERT_OK_AND_ASSIGN(auto open, OpenStep::Begin(r.channel, r.session_id, 2));
  ASSERT_THAT(AwaitGradientsOfStep2(r), IsOk());

  const absl::Time sigterm = absl::Now();
  r.server->Signal(SIGTERM);
  ExpectCleanExit(r.server->Wait());
  const absl::Duration took = absl::Now() - sigterm;
  EXPECT_GE(took, grace - absl::Milliseconds(100));
  EXPECT_LT(took, grace + absl::Seconds(3));
  // The stream ends without a result, UNAVAILABLE: its trainer redoes the step once the group
  // serves (gRPC's own shutdown would have cancelled it).
  const grpc::Status ended = open->Finish();
  EXPECT_EQ(ended.error_code(), grpc::StatusCode::UNAVAILABLE) << ended.error_message();
  EXPECT_THAT(ended.error_message(),
              HasSubstr("step 2: rank 0 shut down before this step ended; redo the step"));
}

TEST(LifecycleTest, CheckpointOnShutdownSavesTheLastAppliedStep) {
  const std::string root = absl::StrCat(testutil::TestTmpDir(), "/checkpoints");
  mkdir(root.c_str(), 0755);
  OPTSTEP_ASSERT_OK_AND_ASSIGN(
      Running r, StartWithSession({"--shutdown_grace_ms=2000", "--checkpoint_root=" + root,
                                   "--checkpoint_on_shutdown=final"}));
  ASSERT_THAT(StepSmall(*r.client, r.session_id, 2).status(), IsOk());
  r.server->Signal(SIGTERM);
  ExpectCleanExit(r.server->Wait());
  struct stat info {};
  const std::string manifest = absl::StrCat(root, "/final-", r.session_id, "/manifest.json");
  ASSERT_EQ(stat(manifest.c_str(), &info), 0) << manifest << " missing";
  std::ifstream in(manifest);
  const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  EXPECT_THAT(text, ::testing::ContainsRegex("\"step\": 2[,\n]")) << text.substr(0, 400);
}

TEST(LifecycleTest, CheckpointOnShutdownNeedsARoot) {
  EXPECT_FALSE(ServerProcess::Start({"--checkpoint_on_shutdown=final"}).ok());
}

}  // namespace
}  // namespace optstep
