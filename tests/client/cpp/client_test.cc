// optstep::Client against in-process fake ranks (tests/testing/fake_optimizer_service.h): what it
// puts on the wire, how it reassembles replies and how it reports errors. The real server is
// exercised by the integration tests; two ranks: two_rank_client_test.cc.

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
#include "tests/client/cpp/client_test_util.h"
#include "tests/testing/fake_optimizer_service.h"
#include "tests/testing/session_info_helpers.h"
#include "tests/testing/status_matchers.h"

namespace optstep {
namespace {

using ::optstep::testutil::Expected;
using ::optstep::testutil::FakeOptimizerService;
using ::optstep::testutil::FakeServer;
using ::optstep::testutil::FakeValue;
using ::optstep::testutil::FirstStep;
using ::optstep::testutil::IsOk;
using ::optstep::testutil::kChunkBytes;
using ::optstep::testutil::MakeSessionInfo;
using ::optstep::testutil::ReceivedFp32;
using ::optstep::testutil::StatusIs;
using ::testing::ElementsAre;
using ::testing::SizeIs;

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

}  // namespace
}  // namespace optstep
