// A rank's gRPC server as it starts and stops: its health answers NOT_SERVING from the moment it
// listens until it is ready, and again once it shuts down; a rank that cannot listen answers why.

#include <grpcpp/grpcpp.h>

#include <memory>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "grpc/health/v1/health.grpc.pb.h"
#include "gtest/gtest.h"
#include "server/engine/engine.h"
#include "server/rpc/rank_group.h"
#include "server/rpc/server.h"
#include "tests/testing/status_matchers.h"

namespace optstep {
namespace {

using ::grpc::health::v1::Health;
using ::grpc::health::v1::HealthCheckRequest;
using ::grpc::health::v1::HealthCheckResponse;
using ::optstep::testutil::IsOk;
using ::optstep::testutil::StatusIs;

class ServerStartTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto engine = Engine::Create(EngineOptions{});
    ASSERT_THAT(engine.status(), IsOk());
    engine_ = *std::move(engine);
    group_ = std::make_unique<RankGroup>(RankGroupOptions{}, engine_.get());
  }

  // `service`'s status as the rank's port answers it.
  static HealthCheckResponse::ServingStatus Health(int port, const std::string& service) {
    auto channel =
        grpc::CreateChannel(absl::StrCat("127.0.0.1:", port), grpc::InsecureChannelCredentials());
    grpc::ClientContext context;
    context.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(20)));
    HealthCheckRequest request;
    request.set_service(service);
    HealthCheckResponse response;
    const grpc::Status status = Health::NewStub(channel)->Check(&context, request, &response);
    EXPECT_TRUE(status.ok()) << status.error_message();
    return response.status();
  }

  // Asks until `service` answers `wanted`, for at most 20 s.
  static bool AwaitHealth(int port, const std::string& service,
                          HealthCheckResponse::ServingStatus wanted) {
    for (const absl::Time end = absl::Now() + absl::Seconds(20); absl::Now() < end;) {
      if (Health(port, service) == wanted) return true;
      absl::SleepFor(absl::Milliseconds(20));
    }
    return false;
  }

  std::unique_ptr<Engine> engine_;
  std::unique_ptr<RankGroup> group_;
};

TEST_F(ServerStartTest, HealthIsNotServingUntilReadyAndAfterShutdown) {
  ServerOptions options;
  options.host = "127.0.0.1";
  OPTSTEP_ASSERT_OK_AND_ASSIGN(std::unique_ptr<Server> server,
                               Server::Start(options, engine_.get(), group_.get()));
  EXPECT_EQ(Health(server->port(), ""), HealthCheckResponse::NOT_SERVING);
  EXPECT_TRUE(AwaitHealth(server->port(), kLivenessService, HealthCheckResponse::SERVING));
  EXPECT_EQ(Health(server->port(), ""), HealthCheckResponse::NOT_SERVING);
  server->SetReady(true);
  EXPECT_TRUE(AwaitHealth(server->port(), "", HealthCheckResponse::SERVING));
}

// Before, the server that could not listen was destroyed with its health thread never started,
// and its shutdown joined that thread: the process ended in std::terminate.
TEST_F(ServerStartTest, ARankThatCannotListenSaysSo) {
  ServerOptions options;
  options.host = "256.256.256.256";
  EXPECT_THAT(Server::Start(options, engine_.get(), group_.get()).status(),
              StatusIs(absl::StatusCode::kUnavailable, "cannot listen on 256.256.256.256:0"));
}

}  // namespace
}  // namespace optstep
