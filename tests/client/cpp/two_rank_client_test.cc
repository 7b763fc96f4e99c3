// optstep::Client against two in-process fake ranks (tests/testing/fake_optimizer_service.h):
// where it sends each parameter's chunks, where it reads the reply from, and how it follows rank
// 0 to where it is served now (a stand-in) when it does not answer. client_test.cc has the rest.

#include <memory>
#include <string>
#include <vector>

#include "absl/synchronization/notification.h"
#include "client/cpp/client.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/client/cpp/client_test_util.h"
#include "tests/testing/fake_optimizer_service.h"
#include "tests/testing/session_info_helpers.h"
#include "tests/testing/status_matchers.h"

namespace optstep {
namespace {

using ::optstep::testutil::Expected;
using ::optstep::testutil::FakeOptimizerService;
using ::optstep::testutil::FakeServer;
using ::optstep::testutil::FirstStep;
using ::optstep::testutil::IsOk;
using ::optstep::testutil::kChunkBytes;
using ::optstep::testutil::MakeSessionInfo;
using ::optstep::testutil::ReceivedFp32;
using ::optstep::testutil::StatusIs;
using ::testing::ElementsAre;
using ::testing::MatchesRegex;
using ::testing::SizeIs;

// Two fake ranks: w on rank 1, b on rank 0.
class TwoRankClientTest : public ::testing::Test {
 protected:
  TwoRankClientTest()
      : info_(MakeSessionInfo("s", 2, {{"w", {2, 3}, 1}, {"b", {4}, 0}})),
        rank0_(info_),
        rank1_(info_),
        fake0_(testutil::StartFakeServer(&rank0_)),
        fake1_(testutil::StartFakeServer(&rank1_)) {}

  // A client of both ranks' own targets, connected before rank 1 says that rank 0 is served at
  // `stand_in` now (told at the connect, the client would go there at once).
  absl::StatusOr<std::unique_ptr<Client>> ConnectWithRankZeroAt(const FakeServer& stand_in) {
    ClientOptions options;
    options.rank_targets = {fake0_.target, fake1_.target};
    absl::StatusOr<std::unique_ptr<Client>> client = Client::Connect(options);
    FakeOptimizerService::Behaviour told;
    told.rank_targets = {stand_in.target, fake1_.target};
    told.stood_in_ranks = {0};
    rank1_.set_behaviour(told);
    return client;
  }

  v1::SessionInfo info_;
  FakeOptimizerService rank0_, rank1_;
  FakeServer fake0_, fake1_;
};

// A client given a stood-in rank's own address, which answers nothing, connects at once: the
// first rank that answers says where the stand-in is, instead of after the connect timeout.
TEST_F(TwoRankClientTest, ConnectFollowsAStandInAtOnce) {
  FakeOptimizerService stand_in(info_);
  FakeServer stand_in_server = testutil::StartFakeServer(&stand_in);
  FakeOptimizerService::Behaviour told;
  told.rank_targets = {fake0_.target, stand_in_server.target};
  told.stood_in_ranks = {1};
  rank0_.set_behaviour(told);
  ClientOptions options;
  options.rank_targets = {fake0_.target, "127.0.0.1:1"};
  options.connect_timeout = absl::Seconds(10);
  const absl::Time start = absl::Now();
  OPTSTEP_ASSERT_OK_AND_ASSIGN(std::unique_ptr<Client> client, Client::Connect(options));
  EXPECT_LT(absl::Now() - start, absl::Seconds(5)) << "waited for the rank's own address";
}

// Right after a stand-in gave way the group may still list it: a client that connects then takes
// the rank's own process, which answers, rather than failing on the stand-in, which does not.
TEST_F(TwoRankClientTest, ConnectTakesTheRanksOwnProcessOverAStandInThatIsGone) {
  FakeOptimizerService::Behaviour told;
  told.rank_targets = {fake0_.target, "127.0.0.1:1"};
  told.stood_in_ranks = {1};
  rank0_.set_behaviour(told);
  ClientOptions options;
  options.rank_targets = {fake0_.target, fake1_.target};
  options.connect_timeout = absl::Seconds(2);
  OPTSTEP_ASSERT_OK_AND_ASSIGN(std::unique_ptr<Client> client, Client::Connect(options));
  OPTSTEP_ASSERT_OK(client->ListSessions().status());
}

// A close whose answer was lost with rank 0 (its process gone after it closed the session) is
// made again where the other ranks say rank 0 is served now, which no longer knows the session:
// the session is closed, and the client says so.
TEST_F(TwoRankClientTest, ACloseRetriedAfterItsAnswerWasLostIsDone) {
  FakeOptimizerService::Behaviour lost;
  lost.close_error = grpc::Status(grpc::StatusCode::UNAVAILABLE, "connection reset");
  lost.close_then_error = true;
  rank0_.set_behaviour(lost);
  // Rank 0 is served by a stand-in now, which knows no session "s" any more.
  FakeOptimizerService stand_in(MakeSessionInfo("other", 2, {{"w", {2, 3}, 1}, {"b", {4}, 0}}));
  FakeServer stand_in_server = testutil::StartFakeServer(&stand_in);
  OPTSTEP_ASSERT_OK_AND_ASSIGN(std::unique_ptr<Client> client,
                               ConnectWithRankZeroAt(stand_in_server));
  EXPECT_THAT(client->CloseSession("s"), IsOk());
  EXPECT_THAT(rank0_.closed_sessions(), ElementsAre("s"));
  // A close that reached a rank 0 at the first attempt still says when there is no such session.
  EXPECT_THAT(client->CloseSession("nope"), StatusIs(absl::StatusCode::kNotFound));
}

// A stand-in for rank 0 that gives way to rank 0's own process cancels the calls it still runs
// as its server stops. The client never cancels a unary call itself: it takes CANCELLED as rank
// 0 being away and calls where the other ranks say rank 0 is served now.
TEST_F(TwoRankClientTest, ACallCancelledByAStoppingRankZeroIsMadeWhereRankZeroIsServedNow) {
  FakeOptimizerService::Behaviour stopping;
  stopping.get_error = grpc::Status(grpc::StatusCode::CANCELLED, "the server is shutting down");
  rank0_.set_behaviour(stopping);
  FakeOptimizerService stand_in(info_);
  FakeServer stand_in_server = testutil::StartFakeServer(&stand_in);
  OPTSTEP_ASSERT_OK_AND_ASSIGN(std::unique_ptr<Client> client,
                               ConnectWithRankZeroAt(stand_in_server));
  OPTSTEP_ASSERT_OK_AND_ASSIGN(v1::SessionInfo info, client->GetSession("s"));
  EXPECT_EQ(info.session_id(), "s");
}

// A creation whose answer was lost with rank 0 is made again where the other ranks say rank 0 is
// served now, with the same request id: the server answers the session the first attempt made
// instead of making a second one. Another call is another creation.
TEST_F(TwoRankClientTest, ACreationRetriedAfterItsAnswerWasLostKeepsItsRequestId) {
  FakeOptimizerService::Behaviour lost;
  lost.create_error = grpc::Status(grpc::StatusCode::UNAVAILABLE, "connection reset");
  rank0_.set_behaviour(lost);
  FakeOptimizerService stand_in(info_);
  FakeServer stand_in_server = testutil::StartFakeServer(&stand_in);
  OPTSTEP_ASSERT_OK_AND_ASSIGN(std::unique_ptr<Client> client,
                               ConnectWithRankZeroAt(stand_in_server));
  OPTSTEP_ASSERT_OK_AND_ASSIGN(v1::SessionInfo created, client->CreateSession(info_.spec()));
  EXPECT_EQ(created.session_id(), "s");
  const std::vector<v1::CreateSessionRequest> first = rank0_.create_requests();
  std::vector<v1::CreateSessionRequest> retried = stand_in.create_requests();
  ASSERT_EQ(first.size(), 1u);
  ASSERT_EQ(retried.size(), 1u);
  EXPECT_THAT(first[0].request_id(), MatchesRegex("[0-9a-f]{32}"));
  EXPECT_EQ(retried[0].request_id(), first[0].request_id());

  OPTSTEP_ASSERT_OK(client->CreateSession(info_.spec()).status());
  retried = stand_in.create_requests();
  ASSERT_EQ(retried.size(), 2u);
  EXPECT_NE(retried[1].request_id(), first[0].request_id());
}

// Ranks that do not advertise Layout.returns_owned (servers before it): the trainer's home rank
// returns every parameter, the others are told skip_return.
TEST_F(TwoRankClientTest, RoutesChunksToOwnersAndReturnsFromTheHomeRank) {
  ClientOptions options;
  options.rank_targets = {fake0_.target, fake1_.target};
  options.max_chunk_bytes = kChunkBytes;
  OPTSTEP_ASSERT_OK_AND_ASSIGN(std::unique_ptr<Client> client, Client::Connect(options));
  const std::vector<float> w = {1, 2, 3, 4, 5, 6}, b = {-1, -2, -3, -4};
  StepOptions step = FirstStep();
  step.trainer_id = 1;  // returns from rank 1 % 2 = 1
  OPTSTEP_ASSERT_OK_AND_ASSIGN(StepReply reply,
                               client->Step(step, {FullGradient{0, w}, FullGradient{1, b}}));
  EXPECT_EQ(reply.params.at(0).f32, Expected(0, 6));
  const std::vector<v1::StepRequest> at0 = rank0_.step_requests();
  const std::vector<v1::StepRequest> at1 = rank1_.step_requests();
  ASSERT_FALSE(at0.empty());
  ASSERT_FALSE(at1.empty());
  EXPECT_TRUE(at0.front().header().skip_return());
  EXPECT_FALSE(at1.front().header().skip_return());
  EXPECT_FALSE(at0.front().header().return_owned());
  EXPECT_FALSE(at1.front().header().return_owned());
}

// Ranks that advertise Layout.returns_owned, REPLICATED storage: each rank is asked for the
// parameters it owns (return_owned), which it sends as it steps them, and the reply is assembled
// from both.
TEST_F(TwoRankClientTest, RoutesChunksToOwnersAndAsksEveryRankForItsOwn) {
  info_.mutable_layout()->set_returns_owned(true);
  FakeOptimizerService owner0(info_), owner1(info_);
  FakeServer server0 = testutil::StartFakeServer(&owner0);
  FakeServer server1 = testutil::StartFakeServer(&owner1);
  FakeOptimizerService::Behaviour behaviour;
  behaviour.step_returns = {1};  // what a rank answers to return_owned: b on rank 0
  owner0.set_behaviour(behaviour);
  behaviour.step_returns = {0};  // w on rank 1
  owner1.set_behaviour(behaviour);
  ClientOptions options;
  options.rank_targets = {server0.target, server1.target};
  options.max_chunk_bytes = kChunkBytes;
  OPTSTEP_ASSERT_OK_AND_ASSIGN(std::unique_ptr<Client> client, Client::Connect(options));
  EXPECT_EQ(client->num_ranks(), 2);
  const std::vector<float> w = {1, 2, 3, 4, 5, 6}, b = {-1, -2, -3, -4};
  StepOptions step = FirstStep();
  step.trainer_id = 1;
  OPTSTEP_ASSERT_OK_AND_ASSIGN(StepReply reply,
                               client->Step(step, {FullGradient{0, w}, FullGradient{1, b}}));
  EXPECT_EQ(reply.params.at(0).f32, Expected(0, 6));
  EXPECT_EQ(reply.params.at(1).f32, Expected(1, 4));

  const std::vector<v1::StepRequest> at0 = owner0.step_requests();
  const std::vector<v1::StepRequest> at1 = owner1.step_requests();
  ASSERT_THAT(at0, SizeIs(3));  // header, b, commit
  ASSERT_THAT(at1, SizeIs(4));  // header, w in 4 + 2, commit
  for (const auto* at : {&at0, &at1}) {
    EXPECT_FALSE(at->front().header().skip_return());
    EXPECT_TRUE(at->front().header().return_owned());
  }
  EXPECT_EQ(at0.back().commit().num_elements(), 4u);
  EXPECT_EQ(at1.back().commit().num_elements(), 6u);
  EXPECT_EQ(ReceivedFp32(at0, 1, 4), b);
  EXPECT_EQ(ReceivedFp32(at1, 0, 6), w);

  // A rank that owns nothing this trainer pushes still gets the header and a commit.
  OPTSTEP_ASSERT_OK_AND_ASSIGN(reply, client->Step(FirstStep(), {FullGradient{1, b}}));
  const std::vector<v1::StepRequest> again1 = owner1.step_requests();
  ASSERT_THAT(again1, SizeIs(6));
  EXPECT_TRUE(again1[4].has_header());
  EXPECT_EQ(again1[5].commit().num_elements(), 0u);
}

// OWNERS storage: every rank returns the parameters it owns, and the client reads the ranks'
// streams together. Rank 0 holds b's second chunk back until w (all of rank 1's reply) has
// arrived: read one after the other, rank 1's reply would wait in the client until rank 0's
// ended (so rank 0 would wait out its 5 s and b would be ready first).
TEST_F(TwoRankClientTest, OwnersRepliesAreReadTogether) {
  info_.mutable_spec()->set_parameter_storage(v1::PARAMETER_STORAGE_OWNERS);
  FakeOptimizerService owner0(info_), owner1(info_);
  FakeServer server0 = testutil::StartFakeServer(&owner0);
  FakeServer server1 = testutil::StartFakeServer(&owner1);
  absl::Notification w_arrived;
  FakeOptimizerService::Behaviour behaviour;
  behaviour.reply_chunk_elements = 2;
  behaviour.step_returns = {1};  // b, in two chunks
  behaviour.resume = &w_arrived;
  owner0.set_behaviour(behaviour);
  behaviour.step_returns = {0};  // w, in three
  behaviour.resume = nullptr;
  owner1.set_behaviour(behaviour);

  ClientOptions options;
  options.rank_targets = {server0.target, server1.target};
  OPTSTEP_ASSERT_OK_AND_ASSIGN(std::unique_ptr<Client> client, Client::Connect(options));
  OPTSTEP_ASSERT_OK_AND_ASSIGN(std::unique_ptr<StepStream> stream, client->OpenStep(FirstStep()));
  std::vector<uint32_t> ready;
  stream->OnParamReady([&](uint32_t id) {
    ready.push_back(id);
    if (id == 0) w_arrived.Notify();
  });
  OPTSTEP_ASSERT_OK_AND_ASSIGN(StepReply reply, stream->Finish());
  EXPECT_THAT(ready, ElementsAre(0, 1));
  EXPECT_FALSE(owner0.resume_timed_out());
  EXPECT_EQ(reply.params.at(0).f32, Expected(0, 6));
  EXPECT_EQ(reply.params.at(1).f32, Expected(1, 4));
}

TEST_F(TwoRankClientTest, TooFewRankTargetsIsFailedPrecondition) {
  ClientOptions options;
  options.target = fake0_.target;
  OPTSTEP_ASSERT_OK_AND_ASSIGN(std::unique_ptr<Client> client, Client::Connect(options));
  EXPECT_THAT(client->Step(FirstStep(), std::vector<FullGradient>{}),
              StatusIs(absl::StatusCode::kFailedPrecondition,
                       "laid out over 2 ranks but this client knows 1"));
  EXPECT_EQ(rank0_.step_streams(), 0);
}

}  // namespace
}  // namespace optstep
