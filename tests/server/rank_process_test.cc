// RankProcess in this process: it starts on a free port, turns health SERVING once its group (of
// one) is joined, and stops on Shutdown(), on AdminService.Shutdown and when destroyed.
// Stale temporaries of checkpoint saves are removed at start. Inconsistent options are refused
// before anything starts.

#include "server/rank_process.h"

#include <fcntl.h>
#include <grpcpp/create_channel.h>
#include <sys/stat.h>

#include <fstream>
#include <memory>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "gmock/gmock.h"
#include "grpc/health/v1/health.grpc.pb.h"
#include "gtest/gtest.h"
#include "optstep/v1/admin_service.grpc.pb.h"
#include "tests/integration/test_pki.h"
#include "tests/testing/status_matchers.h"

namespace optstep {
namespace {

using ::optstep::testutil::StatusIs;
using ::testing::HasSubstr;

RankProcess::Options LocalOptions() {
  RankProcess::Options options;
  options.host = "127.0.0.1";
  options.port = 0;
  options.num_threads = 1;
  options.shutdown_grace = absl::Seconds(2);
  return options;
}

std::shared_ptr<grpc::Channel> ChannelTo(const RankProcess& process) {
  return grpc::CreateChannel("127.0.0.1:" + std::to_string(process.port()),
                             grpc::InsecureChannelCredentials());
}

// Whether grpc.health.v1 answers SERVING for the whole server.
bool Serving(const std::shared_ptr<grpc::Channel>& channel) {
  grpc::ClientContext context;
  context.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(5)));
  grpc::health::v1::HealthCheckResponse response;
  grpc::Status status = grpc::health::v1::Health::NewStub(channel)->Check(
      &context, grpc::health::v1::HealthCheckRequest(), &response);
  return status.ok() && response.status() == grpc::health::v1::HealthCheckResponse::SERVING;
}

// Polls health until SERVING (true) or 10 s have passed (false).
bool AwaitServing(const std::shared_ptr<grpc::Channel>& channel) {
  const absl::Time deadline = absl::Now() + absl::Seconds(10);
  while (absl::Now() < deadline) {
    if (Serving(channel)) return true;
    absl::SleepFor(absl::Milliseconds(10));
  }
  return false;
}

TEST(RankProcessTest, ServesOnAFreePortAndStopsOnShutdown) {
  OPTSTEP_ASSERT_OK_AND_ASSIGN(std::unique_ptr<RankProcess> process,
                               RankProcess::Start(LocalOptions()));
  EXPECT_GT(process->port(), 0);
  EXPECT_EQ(process->metrics_port(), 0);
  std::shared_ptr<grpc::Channel> channel = ChannelTo(*process);
  ASSERT_TRUE(AwaitServing(channel));

  process->Shutdown();
  process->Shutdown();  // idempotent
  process->WaitForShutdown();
  process->WaitForShutdown();  // returns at once once stopped
  EXPECT_FALSE(Serving(channel)) << "still serving after WaitForShutdown";
}

TEST(RankProcessTest, AdminShutdownStopsIt) {
  OPTSTEP_ASSERT_OK_AND_ASSIGN(std::unique_ptr<RankProcess> process,
                               RankProcess::Start(LocalOptions()));
  std::shared_ptr<grpc::Channel> channel = ChannelTo(*process);
  ASSERT_TRUE(AwaitServing(channel));
  grpc::ClientContext context;
  v1::ShutdownRequest request;
  request.set_reason("test");
  v1::ShutdownResponse response;
  ASSERT_TRUE(v1::AdminService::NewStub(channel)->Shutdown(&context, request, &response).ok());
  process->WaitForShutdown();  // would block for ever if the request were lost
}

TEST(RankProcessTest, DestroyingARunningProcessStopsIt) {
  OPTSTEP_ASSERT_OK_AND_ASSIGN(std::unique_ptr<RankProcess> process,
                               RankProcess::Start(LocalOptions()));
  std::shared_ptr<grpc::Channel> channel = ChannelTo(*process);
  ASSERT_TRUE(AwaitServing(channel));
  process.reset();
  EXPECT_FALSE(Serving(channel));
}

TEST(RankProcessTest, ServesMetricsOnAFreePortAndWritesItsPortFile) {
  RankProcess::Options options = LocalOptions();
  options.metrics_port = -1;
  options.metrics_port_file = ::testing::TempDir() + "/metrics_port";
  OPTSTEP_ASSERT_OK_AND_ASSIGN(std::unique_ptr<RankProcess> process, RankProcess::Start(options));
  EXPECT_GT(process->metrics_port(), 0);
  std::ifstream in(options.metrics_port_file);
  int written = 0;
  in >> written;
  EXPECT_EQ(written, process->metrics_port());
}

TEST(RankProcessTest, RemovesStaleSaveTemporariesFromTheCheckpointRootAtStart) {
  const std::string root = absl::StrCat(std::getenv("TEST_TMPDIR"), "/sweep");
  ASSERT_EQ(::mkdir(root.c_str(), 0755), 0);
  const absl::Time two_hours_ago = absl::Now() - absl::Hours(2);
  const timespec times[2] = {absl::ToTimespec(two_hours_ago), absl::ToTimespec(two_hours_ago)};
  for (const char* dir : {"/.crashed.tmp", "/.running.tmp", "/kept"}) {
    ASSERT_EQ(::mkdir((root + dir).c_str(), 0755), 0);
    std::ofstream(root + dir + "/shard-0-of-1.safetensors") << "partial";
  }
  for (const char* path : {"/.crashed.tmp/shard-0-of-1.safetensors", "/.crashed.tmp", "/kept"}) {
    ASSERT_EQ(::utimensat(AT_FDCWD, (root + path).c_str(), times, 0), 0) << path;
  }
  RankProcess::Options options = LocalOptions();
  options.checkpoint_root = root;
  auto process = RankProcess::Start(options);
  ASSERT_TRUE(process.ok()) << process.status();
  struct stat st;
  EXPECT_NE(::stat((root + "/.crashed.tmp").c_str(), &st), 0);  // idle for two hours
  EXPECT_EQ(::stat((root + "/.running.tmp").c_str(), &st), 0);  // written just now
  EXPECT_EQ(::stat((root + "/kept").c_str(), &st), 0);          // not a temporary
}

TEST(RankProcessTest, RefusesInconsistentOptions) {
  RankProcess::Options outside = LocalOptions();
  outside.rank = 2;
  outside.world_size = 2;
  EXPECT_THAT(RankProcess::Start(outside).status(),
              StatusIs(absl::StatusCode::kInvalidArgument, "rank 2 is not in [0, 2)"));

  RankProcess::Options lost = LocalOptions();
  lost.rank = 1;
  lost.world_size = 2;
  EXPECT_THAT(RankProcess::Start(lost).status(),
              StatusIs(absl::StatusCode::kInvalidArgument, "needs --rendezvous"));

  RankProcess::Options nowhere = LocalOptions();
  nowhere.checkpoint_on_shutdown = "final";
  EXPECT_THAT(RankProcess::Start(nowhere).status(),
              StatusIs(absl::StatusCode::kInvalidArgument, "needs --checkpoint_root"));
}

TEST(RankProcessTest, SubjectRolesOnlyUnderMutualTlsWithoutTokens) {
  const std::string dir = testutil::TestTmpDir();
  OPTSTEP_ASSERT_OK_AND_ASSIGN(testutil::TestPki pki, testutil::MakeTestPki(dir, "subjects"));
  RankProcess::Options tls = LocalOptions();
  tls.tls.cert_file = pki.server_cert;
  tls.tls.key_file = pki.server_key;
  // Without a client CA no certificate names a caller: the flag would be ignored.
  RankProcess::Options no_client_ca = tls;
  no_client_ca.admin_subjects = {"ops"};
  EXPECT_THAT(RankProcess::Start(no_client_ca).status(),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       "--peer_subjects and --admin_subjects name roles under mutual TLS without "
                       "tokens"));
  // With tokens, their entries name the roles.
  RankProcess::Options with_tokens = tls;
  with_tokens.tls.client_ca_file = pki.ca;
  with_tokens.auth_tokens_file =
      testutil::WriteTestFile(dir, "subjects-tokens", "root admin root-secret-0123456789\n");
  with_tokens.peer_subjects = {"rank"};
  EXPECT_THAT(RankProcess::Start(with_tokens).status(),
              StatusIs(absl::StatusCode::kInvalidArgument, "--auth_tokens_file unset"));
  // The ranks' own common name (the default peers) also listed as an admin.
  RankProcess::Options both = tls;
  both.tls.client_ca_file = pki.ca;
  both.admin_subjects = {"subjects-server"};
  EXPECT_THAT(RankProcess::Start(both).status(),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       "subject 'subjects-server' is both a peer and an admin"));
}

TEST(RankProcessTest, ReportsAnEngineThatCannotStart) {
  RankProcess::Options options = LocalOptions();
  options.device = "abacus";
  EXPECT_THAT(RankProcess::Start(options).status().message(), HasSubstr("cannot start the engine"));
}

}  // namespace
}  // namespace optstep
