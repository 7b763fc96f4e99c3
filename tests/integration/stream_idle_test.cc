// The stream idle bound (--stream_idle_timeout_ms) through the real process, for every stream a
// caller opens: a caller that stops taking part while its connection stays up (it never reads
// what the rank writes, or sends nothing more) has its stream ended once the bound passes, so
// that the rank lets go of what the stream held (a snapshot of the parameters, a copy of the
// state, staged values, the session's stream slots), and the rank goes on serving.

#include <grpcpp/grpcpp.h>

#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "client/cpp/client.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "optstep/v1/checkpoint_service.grpc.pb.h"
#include "optstep/v1/optimizer_service.grpc.pb.h"
#include "tests/integration/test_metrics.h"
#include "tests/integration/test_session.h"
#include "tests/testing/status_matchers.h"
#include "wire/grpc_status.h"

namespace optstep {
namespace {

using ::optstep::testutil::AwaitMetric;
using ::optstep::testutil::IsOk;
using ::optstep::testutil::StatusIs;

constexpr char kStreams[] = "optstep_active_streams";
constexpr int kElements = 1 << 20;  // 4 MiB of fp32 values: far more than a 64 KiB window

class StreamIdleTest : public testing::Test {
 protected:
  void SetUp() override {
    OPTSTEP_ASSERT_OK_AND_ASSIGN(
        c_, testutil::StartConnected({"--stream_idle_timeout_ms=500", "--metrics_port=-1"}));
    port_ = c_.server->metrics_port();
    v1::SessionSpec spec;
    spec.set_name("wide");
    auto* p = spec.add_parameters();
    p->set_name("wide.weight");
    p->add_shape(kElements);
    spec.set_num_trainers(1);
    spec.set_gradient_mode(v1::GRADIENT_MODE_SHARDED);
    spec.mutable_optimizer()->set_preset("adam");
    OPTSTEP_ASSERT_OK_AND_ASSIGN(v1::SessionInfo info, c_.client->CreateSession(spec));
    session_ = info.session_id();
    channel_ = testutil::SlowReaderChannel(c_.server->address());  // a caller that reads nothing
    ASSERT_THAT(AwaitMetric(port_, kStreams, 0), IsOk());
  }

  // The stream the test opened is open on the server, and then ended by it, without the caller
  // doing anything.
  void ExpectEndedByTheServer() {
    ASSERT_THAT(AwaitMetric(port_, kStreams, 1), IsOk());
    EXPECT_THAT(AwaitMetric(port_, kStreams, 0), IsOk()) << "the stream was left open";
  }

  testutil::ConnectedServer c_;
  int port_ = 0;
  std::string session_;
  std::shared_ptr<grpc::Channel> channel_;
};

TEST_F(StreamIdleTest, APullNotReadIsEnded) {
  auto stub = v1::OptimizerService::NewStub(channel_);
  v1::PullParametersRequest request;
  request.set_session_id(session_);
  grpc::ClientContext context;
  auto reader = stub->PullParameters(&context, request);
  ExpectEndedByTheServer();
  v1::PullParametersResponse response;
  while (reader->Read(&response)) {
  }
  EXPECT_FALSE(reader->Finish().ok());
  // The rank goes on serving the session, and a pull that reads gets all of it.
  OPTSTEP_ASSERT_OK_AND_ASSIGN(std::string pulled, testutil::Pulled(*c_.client, session_));
  EXPECT_EQ(pulled.size(), size_t{kElements} * 4);
}

TEST_F(StreamIdleTest, ExportsNotReadAreEndedAndTheirSlotsComeBack) {
  auto stub = v1::CheckpointService::NewStub(channel_);
  v1::ExportStateDictRequest request;
  request.set_session_id(session_);
  // Two exports open that are never read hold both of the session's slots, until the bound.
  grpc::ClientContext first_context, second_context;
  auto first = stub->ExportStateDict(&first_context, request);
  auto second = stub->ExportStateDict(&second_context, request);
  ASSERT_THAT(AwaitMetric(port_, kStreams, 2), IsOk());
  EXPECT_THAT(AwaitMetric(port_, kStreams, 0), IsOk()) << "the exports were left open";
  EXPECT_THAT(c_.client->ExportStateDict(request).status(), IsOk());
  v1::StateDictChunk chunk;
  while (first->Read(&chunk)) {
  }
  while (second->Read(&chunk)) {
  }
  EXPECT_FALSE(first->Finish().ok());
  EXPECT_FALSE(second->Finish().ok());
}

TEST_F(StreamIdleTest, AnInitThatSendsNothingMoreIsEndedAndWritesNothing) {
  auto stub = v1::OptimizerService::NewStub(channel_);
  grpc::ClientContext context;
  v1::InitParametersResponse response;
  auto writer = stub->InitParameters(&context, &response);
  v1::InitParametersRequest request;
  request.set_session_id(session_);
  v1::TensorChunk* values = request.mutable_values();
  values->set_param_id(0);
  values->set_dtype(v1::DTYPE_FP32);
  const float one = 1.0f;
  for (int i = 0; i < 1024; ++i)
    values->mutable_data()->append(reinterpret_cast<const char*>(&one), 4);
  ASSERT_TRUE(writer->Write(request));
  ExpectEndedByTheServer();  // the caller neither sends its StreamEnd nor half-closes
  EXPECT_FALSE(writer->Finish().ok());
  OPTSTEP_ASSERT_OK_AND_ASSIGN(std::string pulled, testutil::Pulled(*c_.client, session_));
  EXPECT_EQ(pulled, std::string(size_t{kElements} * 4, '\0')) << "values were written";
}

class StepIdleTest : public StreamIdleTest, public testing::WithParamInterface<std::string> {};

// After its commit the trainer does nothing more (""), half-closes its side ("half-close"), or
// sends one more message ("message"). Before, a half-close or a message after the commit, read
// by the stream's read after the commit, restarted the wait of the blocked parameter write, and
// the stream was never ended.
INSTANTIATE_TEST_SUITE_P(AfterTheCommit, StepIdleTest, testing::Values("", "half-close", "message"),
                         [](const testing::TestParamInfo<std::string>& info) {
                           return info.param.empty()        ? std::string("nothing")
                                  : info.param == "message" ? "message"
                                                            : "half_close";
                         });

TEST_P(StepIdleTest, AStepWhoseParametersAreNotTakenIsEnded) {
  auto stub = v1::OptimizerService::NewStub(channel_);
  grpc::ClientContext context;
  auto stream = stub->Step(&context);
  v1::StepRequest request;
  request.mutable_header()->set_session_id(session_);
  request.mutable_header()->set_step(1);
  ASSERT_TRUE(stream->Write(request));
  request.Clear();
  v1::TensorChunk* gradient = request.mutable_gradient();
  gradient->set_param_id(0);
  gradient->set_dtype(v1::DTYPE_FP32);
  gradient->mutable_data()->assign(size_t{kElements} * 4, '\0');
  ASSERT_TRUE(stream->Write(request));
  request.Clear();
  request.mutable_commit()->set_num_elements(kElements);
  ASSERT_TRUE(stream->Write(request));
  // The step applies; its 4 MiB of parameters wait on a trainer that takes none of them.
  // Open, its write blocked by now (the bound is 500 ms from the write on).
  absl::SleepFor(absl::Milliseconds(200));
  ASSERT_THAT(AwaitMetric(port_, kStreams, 1), IsOk());
  if (GetParam() == "half-close") {
    ASSERT_TRUE(stream->WritesDone());
  } else if (GetParam() == "message") {
    request.Clear();
    request.mutable_commit()->set_num_elements(0);
    ASSERT_TRUE(stream->Write(request));
  }
  EXPECT_THAT(AwaitMetric(port_, kStreams, 0), IsOk()) << "the stream was left open";
  v1::StepResponse response;
  while (stream->Read(&response)) {
  }
  EXPECT_FALSE(stream->Finish().ok());
  // The step stays applied, and the session goes on with the next one.
  OPTSTEP_ASSERT_OK_AND_ASSIGN(v1::SessionInfo info, c_.client->GetSession(session_));
  EXPECT_EQ(info.step(), 1u);
}

// Upload streams (InitParameters, ImportStateDict) that have sent nothing name no session, so no
// session's bound counts them, and each may make the rank hold its window and a message: each
// caller (here, the host) has at most 64 of them open, as Step streams have their bound before
// their header. Before, a caller could open any number.
TEST(SilentUploadsTest, ACallerHasItsBoundOfUploadStreamsThatSentNothing) {
  OPTSTEP_ASSERT_OK_AND_ASSIGN(testutil::ConnectedServer c,
                               testutil::StartConnected({"--metrics_port=-1"}));
  auto channel = grpc::CreateChannel(c.server->address(), grpc::InsecureChannelCredentials());
  auto optimizer = v1::OptimizerService::NewStub(channel);
  auto checkpoints = v1::CheckpointService::NewStub(channel);
  struct Init {
    grpc::ClientContext context;
    v1::InitParametersResponse response;
    std::unique_ptr<grpc::ClientWriter<v1::InitParametersRequest>> writer;
  };
  std::vector<std::unique_ptr<Init>> silent;
  for (int i = 0; i < 64; ++i) {
    silent.push_back(std::make_unique<Init>());
    silent.back()->writer =
        optimizer->InitParameters(&silent.back()->context, &silent.back()->response);
  }
  ASSERT_THAT(AwaitMetric(c.server->metrics_port(), kStreams, 64), IsOk());
  // An upload of the other kind, empty: refused for the bound before it is looked at.
  const auto import_empty = [&] {
    grpc::ClientContext context;
    v1::ImportStateDictResponse response;
    auto writer = checkpoints->ImportStateDict(&context, &response);
    writer->WritesDone();
    return FromGrpcStatus(writer->Finish());
  };
  EXPECT_THAT(import_empty(),
              StatusIs(absl::StatusCode::kResourceExhausted,
                       "peer ipv4:127.0.0.1 has 64 upload streams open on this rank that sent no "
                       "message yet"));
  // One ends: its place goes to the next, which is looked at (and refused as empty).
  silent[0]->context.TryCancel();
  (void)silent[0]->writer->Finish();
  ASSERT_THAT(AwaitMetric(c.server->metrics_port(), kStreams, 63), IsOk());
  EXPECT_THAT(import_empty(),
              StatusIs(absl::StatusCode::kInvalidArgument, "empty state dict stream"));
  for (size_t i = 1; i < silent.size(); ++i) silent[i]->context.TryCancel();
  for (size_t i = 1; i < silent.size(); ++i) (void)silent[i]->writer->Finish();
}

}  // namespace
}  // namespace optstep
