// The calls only rank 0 serves: a session is made and closed on every rank by rank 0. The same
// call at another rank is refused FAILED_PRECONDITION naming the rank, and changes nothing.
// Before, a CloseSession at rank 1 closed rank 1's copy alone: rank 0's next step of the session
// waited for rank 1 in its collectives until they timed out and broke the session.

#include <grpcpp/create_channel.h>

#include <memory>
#include <string>

#include "client/cpp/client.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "optstep/v1/optimizer_service.pb.h"
#include "tests/integration/test_session.h"
#include "tests/testing/server_process.h"
#include "tests/testing/status_matchers.h"
#include "tests/testing/unary_call.h"

namespace optstep {
namespace {

using ::optstep::testutil::IsOk;
using ::optstep::testutil::SmallSpec;
using ::optstep::testutil::StepSmall;
using ::testing::HasSubstr;

TEST(RankRolesTest, SessionsAreMadeAndClosedAtRankZeroOnly) {
  OPTSTEP_ASSERT_OK_AND_ASSIGN(auto ranks, testutil::StartGroup(2, {"--comm_timeout_ms=5000"}));
  ClientOptions options;
  options.rank_targets = {ranks[0]->address(), ranks[1]->address()};
  OPTSTEP_ASSERT_OK_AND_ASSIGN(auto client, Client::Connect(options));
  ASSERT_THAT(testutil::WaitServing(*client), IsOk());
  OPTSTEP_ASSERT_OK_AND_ASSIGN(v1::SessionInfo info, client->CreateSession(SmallSpec("roles")));
  const std::string session = info.session_id();
  ASSERT_THAT(StepSmall(*client, session, 1).status(), IsOk());

  const auto rank1 = grpc::CreateChannel(ranks[1]->address(), grpc::InsecureChannelCredentials());
  v1::CloseSessionRequest close;
  close.set_session_id(session);
  const grpc::Status closed =
      testutil::UnaryCall(rank1, "/optstep.v1.OptimizerService/CloseSession", close);
  EXPECT_EQ(closed.error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  EXPECT_THAT(closed.error_message(), HasSubstr("closed on rank 0; this is rank 1 of 2"));
  v1::CreateSessionRequest create;
  *create.mutable_spec() = SmallSpec("elsewhere");
  const grpc::Status created =
      testutil::UnaryCall(rank1, "/optstep.v1.OptimizerService/CreateSession", create);
  EXPECT_EQ(created.error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  EXPECT_THAT(created.error_message(), HasSubstr("created on rank 0; this is rank 1 of 2"));

  // Both ranks still hold the session: its next step is applied on both, well within the
  // collectives' timeout.
  OPTSTEP_ASSERT_OK_AND_ASSIGN(StepReply reply, StepSmall(*client, session, 2));
  EXPECT_EQ(reply.step, 2u);
  EXPECT_THAT(client->CloseSession(session), IsOk());
}

}  // namespace
}  // namespace optstep
