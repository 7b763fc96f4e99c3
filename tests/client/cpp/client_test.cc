// optstep::Client against in-process fake ranks (tests/testing/fake_optimizer_service.h): what it
// puts on the wire, how it reassembles replies and how it reports errors. The real server is
// exercised by the integration tests.

#include "client/cpp/client.h"

#include <grpcpp/health_check_service_interface.h>

#include <cstdint>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "absl/synchronization/notification.h"
#include "client/cpp/step_stream.h"
#include "glog/logging.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "kernels/math/half.h"
#include "tests/testing/fake_optimizer_service.h"
#include "tests/testing/session_info_helpers.h"
#include "tests/testing/status_matchers.h"

namespace optstep {
namespace {

using ::optstep::testutil::FakeOptimizerService;
using ::optstep::testutil::FakeServer;
using ::optstep::testutil::FakeValue;
using ::optstep::testutil::IsOk;
using ::optstep::testutil::MakeSessionInfo;
using ::optstep::testutil::StatusIs;
using ::testing::ElementsAre;
using ::testing::MatchesRegex;
using ::testing::SizeIs;

constexpr size_t kChunkBytes = 16;  // 4 fp32 elements per wire chunk

std::vector<float> Expected(uint32_t p, uint64_t n) {
  std::vector<float> v(n);
  for (uint64_t i = 0; i < n; ++i) v[i] = FakeValue(p, i);
  return v;
}

StepOptions FirstStep() {
  StepOptions options;
  options.session_id = "s";
  options.step = 1;
  return options;
}

// Reassembles the gradient elements (as fp32 bit patterns widened from any dtype) that one
// rank received for `param_id`, checking that the chunks tile [0, n).
std::vector<float> ReceivedFp32(const std::vector<v1::StepRequest>& requests, uint32_t param_id,
                                uint64_t n) {
  std::vector<float> values(n, -1.0f);
  uint64_t next = 0;
  for (const v1::StepRequest& r : requests) {
    if (!r.has_gradient() || r.gradient().param_id() != param_id) continue;
    EXPECT_EQ(r.gradient().offset(), next);
    EXPECT_LE(r.gradient().data().size(), kChunkBytes);
    const uint64_t count = r.gradient().data().size() / 4;
    std::memcpy(values.data() + next, r.gradient().data().data(), count * 4);
    next += count;
  }
  EXPECT_EQ(next, n);
  return values;
}

class ClientTest : public ::testing::Test {
 protected:
  // Session "s": w [2, 3] and b [4] on rank 0.
  ClientTest()
      : service_(MakeSessionInfo("s", 1, {{"w", {2, 3}, 0}, {"b", {4}, 0}})),
        fake_(testutil::StartFakeServer(&service_)) {}

  std::unique_ptr<Client> Connect() {
    ClientOptions options;
    options.target = fake_.target;
    options.max_chunk_bytes = kChunkBytes;
    options.connect_timeout = absl::Seconds(5);
    options.rpc_timeout = absl::Seconds(5);
    options.stream_timeout = absl::Seconds(5);
    absl::StatusOr<std::unique_ptr<Client>> client = Client::Connect(options);
    CHECK(client.ok()) << client.status();
    return *std::move(client);
  }

  FakeOptimizerService service_;
  FakeServer fake_;
};

// A rank that ends the step's stream while the trainer still sends (it refused the step, or
// died): the commit that follows must not start a write on the ended call, which gRPC would run
// after the call was released (a use-after-free under ASan, first seen with a rank lost
// mid-step). The stream answers the rank's error.
TEST_F(ClientTest, ACommitAfterTheRankEndedTheStreamAnswersItsError) {
  FakeOptimizerService::Behaviour behaviour;
  behaviour.step_error = grpc::Status(grpc::StatusCode::FAILED_PRECONDITION, "step 1 refused");
  behaviour.error_at_header = true;
  service_.set_behaviour(behaviour);
  std::unique_ptr<Client> client = Connect();
  for (int round = 0; round < 5; ++round) {
    OPTSTEP_ASSERT_OK_AND_ASSIGN(std::unique_ptr<StepStream> stream, client->OpenStep(FirstStep()));
    const absl::Time end = absl::Now() + absl::Seconds(5);
    while (service_.step_requests().size() < static_cast<size_t>(round + 1) && absl::Now() < end) {
      absl::SleepFor(absl::Milliseconds(5));
    }
    absl::SleepFor(absl::Milliseconds(50));  // the call's end reaches the client
    EXPECT_THAT(stream->Finish().status(),
                StatusIs(absl::StatusCode::kFailedPrecondition, "step 1 refused"));
  }
}

TEST_F(ClientTest, ConnectValidatesOptionsAndReach) {
  ClientOptions options;
  EXPECT_THAT(Client::Connect(options), StatusIs(absl::StatusCode::kInvalidArgument, "target"));
  options.target = "localhost:1";
  options.connect_timeout = absl::Milliseconds(100);
  EXPECT_THAT(Client::Connect(options),
              StatusIs(absl::StatusCode::kUnavailable, "rank 0 at 'localhost:1'"));
  options.connect_timeout = absl::ZeroDuration();  // lazy: fails on the first call instead
  OPTSTEP_ASSERT_OK_AND_ASSIGN(std::unique_ptr<Client> lazy, Client::Connect(options));
  EXPECT_THAT(lazy->ListSessions(), StatusIs(absl::StatusCode::kUnavailable));
}

TEST_F(ClientTest, Sessions) {
  std::unique_ptr<Client> client = Connect();
  bool attached = false;
  OPTSTEP_ASSERT_OK_AND_ASSIGN(
      v1::SessionInfo created,
      client->CreateSession(MakeSessionInfo("s", 1, {}).spec(), &attached));
  EXPECT_EQ(created.session_id(), "s");
  EXPECT_TRUE(attached);
  OPTSTEP_ASSERT_OK_AND_ASSIGN(v1::SessionInfo got, client->GetSession("s"));
  EXPECT_EQ(got.spec().parameters_size(), 2);
  OPTSTEP_ASSERT_OK_AND_ASSIGN(std::vector<v1::SessionSummary> all, client->ListSessions());
  EXPECT_THAT(all, SizeIs(1));
  EXPECT_THAT(client->CloseSession("s"), IsOk());
  EXPECT_THAT(service_.closed_sessions(), ElementsAre("s"));
}

TEST_F(ClientTest, ServerErrorsKeepCodeAndMessage) {
  std::unique_ptr<Client> client = Connect();
  EXPECT_THAT(client->GetSession("nope"),
              StatusIs(absl::StatusCode::kNotFound, "session 'nope' not found"));
  EXPECT_THAT(client->CloseSession("nope"), StatusIs(absl::StatusCode::kNotFound, "'nope'"));
  FakeOptimizerService::Behaviour behaviour;
  behaviour.step_error =
      grpc::Status(grpc::StatusCode::FAILED_PRECONDITION, "session 's': step 3 expected");
  service_.set_behaviour(behaviour);
  StepOptions options;
  options.session_id = "s";
  options.step = 5;
  EXPECT_THAT(client->Step(options, std::vector<FullGradient>{}),
              StatusIs(absl::StatusCode::kFailedPrecondition, "session 's': step 3 expected"));
}

TEST_F(ClientTest, StepSendsHeaderChunksCommitAndAssemblesTheReply) {
  std::unique_ptr<Client> client = Connect();
  const std::vector<float> w = {1, 2, 3, 4, 5, 6}, b = {-1, -2, -3, -4};
  StepOptions options;
  options.session_id = "s";
  options.step = 1;
  options.trainer_id = 0;
  options.groups.push_back({0, 0.01, std::nullopt});
  OPTSTEP_ASSERT_OK_AND_ASSIGN(StepReply reply,
                               client->Step(options, {FullGradient{0, w}, FullGradient{1, b}}));
  EXPECT_EQ(reply.step, 1u);
  EXPECT_FALSE(reply.skipped);
  EXPECT_DOUBLE_EQ(reply.grad_norm, 2.5);
  EXPECT_TRUE(reply.clipped);
  ASSERT_THAT(reply.params, SizeIs(2));
  EXPECT_EQ(reply.params[0].f32, Expected(0, 6));
  EXPECT_EQ(reply.params[1].f32, Expected(1, 4));

  const std::vector<v1::StepRequest> requests = service_.step_requests();
  // header, w in 4 + 2, b in 4, commit.
  ASSERT_THAT(requests, SizeIs(5));
  ASSERT_TRUE(requests.front().has_header());
  const v1::StepHeader& header = requests.front().header();
  EXPECT_EQ(header.session_id(), "s");
  EXPECT_EQ(header.step(), 1u);
  EXPECT_EQ(header.return_dtype(), v1::DTYPE_FP32);
  EXPECT_FALSE(header.skip_return());
  ASSERT_EQ(header.groups_size(), 1);
  EXPECT_DOUBLE_EQ(header.groups(0).lr(), 0.01);
  EXPECT_FALSE(header.groups(0).has_weight_decay());
  ASSERT_TRUE(requests.back().has_commit());
  EXPECT_EQ(requests.back().commit().num_elements(), 10u);
  EXPECT_EQ(ReceivedFp32(requests, 0, 6), w);
  EXPECT_EQ(ReceivedFp32(requests, 1, 4), b);
}

TEST_F(ClientTest, StepWithSlicesInMixedDtypesAndBf16Return) {
  std::unique_ptr<Client> client = Connect();
  std::vector<uint16_t> w_bf16 = {0x3f80, 0x4000, 0x4040, 0x4080, 0x40a0, 0x40c0};
  std::vector<float> b_tail = {7, 8};
  GradientSlice w{
      0, 0, DType::kBF16, {reinterpret_cast<const uint8_t*>(w_bf16.data()), w_bf16.size() * 2}};
  GradientSlice b{
      1, 2, DType::kF32, {reinterpret_cast<const uint8_t*>(b_tail.data()), b_tail.size() * 4}};
  StepOptions options;
  options.session_id = "s";
  options.step = 1;
  options.return_dtype = DType::kBF16;
  options.return_param_ids = {1};
  OPTSTEP_ASSERT_OK_AND_ASSIGN(StepReply reply, client->Step(options, {w, b}));
  ASSERT_THAT(reply.params, SizeIs(1));
  const HostParameter& got = reply.params.at(1);
  EXPECT_EQ(got.dtype, DType::kBF16);
  ASSERT_THAT(got.bf16, SizeIs(4));
  for (uint64_t i = 0; i < 4; ++i) EXPECT_EQ(got.bf16[i], math::FloatToBf16(FakeValue(1, i)));

  const std::vector<v1::StepRequest> requests = service_.step_requests();
  ASSERT_THAT(requests, SizeIs(4));  // header, w (12 bytes: one chunk), b, commit
  EXPECT_EQ(requests[1].gradient().param_id(), 0u);
  EXPECT_EQ(requests[1].gradient().dtype(), v1::DTYPE_BF16);
  EXPECT_EQ(requests[1].gradient().data(),
            std::string(reinterpret_cast<const char*>(w_bf16.data()), 12));
  EXPECT_EQ(requests[2].gradient().param_id(), 1u);
  EXPECT_EQ(requests[2].gradient().dtype(), v1::DTYPE_FP32);
  EXPECT_EQ(requests[2].gradient().offset(), 2u);
  EXPECT_THAT(requests[0].header().return_param_ids(), ElementsAre(1));
  EXPECT_EQ(requests[0].header().return_dtype(), v1::DTYPE_BF16);
  EXPECT_EQ(requests.back().commit().num_elements(), 8u);
}

TEST_F(ClientTest, SkipReturnAndSkippedSteps) {
  std::unique_ptr<Client> client = Connect();
  StepOptions options = FirstStep();
  options.skip_return = true;
  OPTSTEP_ASSERT_OK_AND_ASSIGN(StepReply reply, client->Step(options, std::vector<FullGradient>{}));
  EXPECT_TRUE(reply.params.empty());
  ASSERT_FALSE(service_.step_requests().empty());
  EXPECT_TRUE(service_.step_requests().front().header().skip_return());

  FakeOptimizerService::Behaviour behaviour;
  behaviour.skipped = true;
  service_.set_behaviour(behaviour);
  OPTSTEP_ASSERT_OK_AND_ASSIGN(reply, client->Step(FirstStep(), std::vector<FullGradient>{}));
  EXPECT_TRUE(reply.skipped);
  EXPECT_EQ(reply.grad_norm, 0.0);
  EXPECT_TRUE(reply.params.empty());  // nothing changed, nothing sent back
}

TEST_F(ClientTest, BadRequestsFailBeforeAnythingIsSent) {
  std::unique_ptr<Client> client = Connect();
  const std::vector<float> five(5), six(6);
  EXPECT_THAT(client->Step(FirstStep(), {FullGradient{0, five}}),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       "param 'w': full gradient has 5 elements, expected 6"));
  EXPECT_THAT(client->Step(FirstStep(), {FullGradient{2, six}}),
              StatusIs(absl::StatusCode::kNotFound, "param_id 2 not found"));
  StepOptions options = FirstStep();
  options.step = 0;
  EXPECT_THAT(client->Step(options, {FullGradient{0, six}}),
              StatusIs(absl::StatusCode::kInvalidArgument, "step 0"));
  options = FirstStep();
  options.return_dtype = DType::kF16;
  EXPECT_THAT(client->Step(options, {FullGradient{0, six}}),
              StatusIs(absl::StatusCode::kInvalidArgument, "not fp16"));
  options = FirstStep();
  options.return_param_ids = {0, 0};
  EXPECT_THAT(client->Step(options, {FullGradient{0, six}}),
              StatusIs(absl::StatusCode::kInvalidArgument, "named twice"));
  options = FirstStep();
  options.session_id = "nope";
  EXPECT_THAT(client->Step(options, {FullGradient{0, six}}),
              StatusIs(absl::StatusCode::kNotFound, "session 'nope' not found"));
  EXPECT_EQ(service_.step_streams(), 0);
}

TEST_F(ClientTest, ServerProtocolViolationsAreInternal) {
  std::unique_ptr<Client> client = Connect();
  FakeOptimizerService::Behaviour behaviour;
  behaviour.miscount_chunks = true;
  service_.set_behaviour(behaviour);
  EXPECT_THAT(client->Step(FirstStep(), std::vector<FullGradient>{}),
              StatusIs(absl::StatusCode::kInternal, "announced 5 parameter chunks and sent 4"));
  behaviour.miscount_chunks = false;
  behaviour.leave_out_last_chunk = true;
  service_.set_behaviour(behaviour);
  EXPECT_THAT(client->Step(FirstStep(), std::vector<FullGradient>{}),
              StatusIs(absl::StatusCode::kInternal, "param 'w' incomplete"));
}

TEST_F(ClientTest, InitParametersStreamsChunksToTheOwner) {
  std::unique_ptr<Client> client = Connect();
  const std::vector<float> w = {1, 2, 3, 4, 5, 6};
  EXPECT_THAT(client->InitParameters("s", 0, w), IsOk());
  const std::vector<v1::InitParametersRequest> requests = service_.init_requests();
  ASSERT_THAT(requests, SizeIs(3));  // 4 + 2 elements, then the final message
  EXPECT_EQ(requests[0].session_id(), "s");
  EXPECT_EQ(requests[1].values().offset(), 4u);
  EXPECT_EQ(requests[1].values().dtype(), v1::DTYPE_FP32);
  ASSERT_TRUE(requests[2].has_end());
  EXPECT_FALSE(requests[2].has_values());
  EXPECT_EQ(requests[2].end().chunks(), 2u);
  EXPECT_EQ(requests[2].end().bytes(), 24u);
  EXPECT_EQ(requests[2].end().tensors(), 1u);
  EXPECT_EQ(requests[2].end().crc32(), 423224612u);  // zlib's crc32 of the six floats' bytes
  std::vector<float> got(6);
  std::memcpy(got.data(), requests[0].values().data().data(), 16);
  std::memcpy(got.data() + 4, requests[1].values().data().data(), 8);
  EXPECT_EQ(got, w);
  EXPECT_THAT(client->InitParameters("s", 0, std::vector<float>(7)),
              StatusIs(absl::StatusCode::kInvalidArgument, "7 initial values, expected 6"));
}

// A group that heals refuses initial values (UNAVAILABLE, nothing written): the client sends
// them again once it serves, within its recovery_timeout. Before, the first refusal was the
// caller's error, and a trainer made during a heal before step 1 failed.
TEST_F(ClientTest, InitialValuesRefusedWhileTheGroupHealsAreSentAgain) {
  std::unique_ptr<Client> client = Connect();
  FakeOptimizerService::Behaviour healing;
  healing.init_unavailable = 2;
  service_.set_behaviour(healing);
  EXPECT_THAT(client->InitParameters("s", 0, {1, 2, 3, 4, 5, 6}), IsOk());
  EXPECT_THAT(service_.init_requests(), SizeIs(9));  // three streams of three messages
}

TEST_F(ClientTest, PullParameters) {
  std::unique_ptr<Client> client = Connect();
  OPTSTEP_ASSERT_OK_AND_ASSIGN(Parameters all, client->PullParameters("s", DType::kF32));
  ASSERT_THAT(all.params, SizeIs(2));
  EXPECT_EQ(all.params[0].f32, Expected(0, 6));
  EXPECT_EQ(all.params[1].f32, Expected(1, 4));
  const std::vector<uint32_t> ids = {0};
  OPTSTEP_ASSERT_OK_AND_ASSIGN(Parameters some, client->PullParameters("s", DType::kBF16, ids));
  ASSERT_THAT(some.params, SizeIs(1));
  EXPECT_EQ(some.params[0].bf16[5], math::FloatToBf16(FakeValue(0, 5)));
  EXPECT_THAT(client->PullParameters("nope", DType::kF32),
              StatusIs(absl::StatusCode::kNotFound, "'nope'"));
}

TEST_F(ClientTest, PullParametersWritesIntoDestinations) {
  std::unique_ptr<Client> client = Connect();
  std::vector<float> w(6, -1.0f);
  ParamDestinations into;
  into[0] = absl::Span<uint8_t>(reinterpret_cast<uint8_t*>(w.data()), w.size() * 4);
  OPTSTEP_ASSERT_OK_AND_ASSIGN(Parameters pulled,
                               client->PullParameters("s", DType::kF32, {}, into));
  EXPECT_EQ(w, Expected(0, 6));
  EXPECT_EQ(pulled.destinations_filled, 1u);
  ASSERT_THAT(pulled.params, SizeIs(1));  // b, which has no destination
  EXPECT_EQ(pulled.params[1].f32, Expected(1, 4));

  // Refused before anything is asked: the wrong size, a parameter not pulled, an unknown id.
  std::vector<float> small(5);
  ParamDestinations wrong;
  wrong[0] = absl::Span<uint8_t>(reinterpret_cast<uint8_t*>(small.data()), small.size() * 4);
  EXPECT_THAT(client->PullParameters("s", DType::kF32, {}, wrong),
              StatusIs(absl::StatusCode::kInvalidArgument, "has 20 bytes, expected 24"));
  const std::vector<uint32_t> only_b = {1};
  EXPECT_THAT(client->PullParameters("s", DType::kF32, only_b, into),
              StatusIs(absl::StatusCode::kInvalidArgument, "not among the parameters returned"));
  ParamDestinations unknown;
  unknown[7] = into[0];
  EXPECT_THAT(client->PullParameters("s", DType::kF32, {}, unknown),
              StatusIs(absl::StatusCode::kNotFound, "7"));
  EXPECT_EQ(w, Expected(0, 6));
}

TEST_F(ClientTest, Health) {
  std::unique_ptr<Client> client = Connect();
  OPTSTEP_ASSERT_OK_AND_ASSIGN(bool serving, client->CheckHealth());
  EXPECT_TRUE(serving);
  fake_.server->GetHealthCheckService()->SetServingStatus(false);
  OPTSTEP_ASSERT_OK_AND_ASSIGN(serving, client->CheckHealth());
  EXPECT_FALSE(serving);
  EXPECT_THAT(client->CheckHealth("no.such.Service"), StatusIs(absl::StatusCode::kNotFound));
}

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
