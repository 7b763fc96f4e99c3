// The bad-input table: each malformed request gets a precise code and a message naming the
// parameter and the values; the server keeps serving and its state is unchanged. Runs the real
// services, engine and CPU device in process on a free loopback port, driven by raw stubs (the
// client library would refuse some of these requests before sending them).

#include <grpcpp/grpcpp.h>
#include <grpcpp/impl/client_unary_call.h>

#include <cstring>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "optstep/v1/optimizer_service.grpc.pb.h"
#include "server/engine/engine.h"
#include "server/rpc/server.h"
#include "tests/testing/session_info_helpers.h"
#include "tests/testing/status_matchers.h"

namespace optstep {
namespace {

using ::testing::HasSubstr;

std::string Bytes(const std::vector<float>& v) {
  return std::string(reinterpret_cast<const char*>(v.data()), v.size() * 4);
}

class BadInputTest : public ::testing::Test {
 protected:
  void SetUp() override {
    EngineOptions engine_options;
    engine_options.device.num_threads = 1;
    auto engine = Engine::Create(engine_options);
    ASSERT_TRUE(engine.ok()) << engine.status();
    engine_ = *std::move(engine);
    ServerOptions server_options;
    server_options.host = "127.0.0.1";
    group_ = std::make_unique<RankGroup>(RankGroupOptions{}, engine_.get());
    auto server = Server::Start(server_options, engine_.get(), group_.get());
    ASSERT_TRUE(server.ok()) << server.status();
    server_ = *std::move(server);
    ASSERT_TRUE(group_->Join("127.0.0.1:" + std::to_string(server_->port()), nullptr).ok());
    server_->SetReady(true);
    grpc::ChannelArguments args;
    args.SetMaxSendMessageSize(16 << 20);
    channel_ = grpc::CreateCustomChannel("127.0.0.1:" + std::to_string(server_->port()),
                                         grpc::InsecureChannelCredentials(), args);
    stub_ = v1::OptimizerService::NewStub(channel_);

    // A session with w [2, 3] and b [3], AdamW, 2 trainers, SHARDED.
    v1::CreateSessionRequest request;
    *request.mutable_spec() = testutil::MakeAdamWSpec({{"w", {2, 3}}, {"b", {3}}}, 2);
    v1::CreateSessionResponse response;
    grpc::ClientContext context;
    ASSERT_TRUE(stub_->CreateSession(&context, request, &response).ok());
    session_ = response.summary().session_id();
    valid_spec_ = request.spec();
  }

  void TearDown() override {
    // The server still serves and nothing changed: step 0, parameters zero.
    v1::GetSessionRequest request;
    request.set_session_id(session_);
    v1::SessionInfo info;
    grpc::ClientContext context;
    ASSERT_TRUE(stub_->GetSession(&context, request, &info).ok());
    EXPECT_EQ(info.step(), 0u);
    EXPECT_EQ(Pull(), std::vector<float>(9, 0.0f));
    server_.reset();
    group_.reset();
    engine_.reset();
  }

  std::vector<float> Pull() {
    v1::PullParametersRequest request;
    request.set_session_id(session_);
    grpc::ClientContext context;
    auto reader = stub_->PullParameters(&context, request);
    v1::PullParametersResponse response;
    std::vector<float> values;
    while (reader->Read(&response)) {
      const std::string& data = response.parameter().data();
      const size_t n = data.size() / 4;
      values.resize(values.size() + n);
      std::memcpy(values.data() + values.size() - n, data.data(), data.size());
    }
    EXPECT_TRUE(reader->Finish().ok());
    return values;
  }

  v1::StepRequest Header(uint64_t step = 1, uint32_t trainer = 0) {
    v1::StepRequest r;
    r.mutable_header()->set_session_id(session_);
    r.mutable_header()->set_step(step);
    r.mutable_header()->set_trainer_id(trainer);
    return r;
  }

  static v1::StepRequest Chunk(uint32_t param, uint64_t offset, std::string data,
                               v1::DType dtype = v1::DTYPE_FP32) {
    v1::StepRequest r;
    r.mutable_gradient()->set_param_id(param);
    r.mutable_gradient()->set_offset(offset);
    r.mutable_gradient()->set_dtype(dtype);
    r.mutable_gradient()->set_data(std::move(data));
    return r;
  }

  static v1::StepRequest Commit() {
    v1::StepRequest r;
    r.mutable_commit();
    return r;
  }

  // Sends the messages of one Step stream and answers its final status.
  grpc::Status RunStep(const std::vector<v1::StepRequest>& messages) {
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
    auto stream = stub_->Step(&context);
    for (const auto& m : messages) {
      if (!stream->Write(m)) break;
    }
    stream->WritesDone();
    v1::StepResponse response;
    while (stream->Read(&response)) {
    }
    return stream->Finish();
  }

  grpc::Status Create(const v1::SessionSpec& spec) {
    v1::CreateSessionRequest request;
    *request.mutable_spec() = spec;
    v1::CreateSessionResponse response;
    grpc::ClientContext context;
    return stub_->CreateSession(&context, request, &response);
  }

  std::unique_ptr<Engine> engine_;
  std::unique_ptr<RankGroup> group_;
  std::unique_ptr<Server> server_;
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<v1::OptimizerService::Stub> stub_;
  std::string session_;
  v1::SessionSpec valid_spec_;
};

#define EXPECT_STATUS(status, code, substr)                                   \
  do {                                                                        \
    grpc::Status s_ = (status);                                               \
    EXPECT_EQ(s_.error_code(), grpc::StatusCode::code) << s_.error_message(); \
    EXPECT_THAT(s_.error_message(), HasSubstr(substr));                       \
  } while (0)

TEST_F(BadInputTest, UnknownSession) {
  v1::GetSessionRequest request;
  request.set_session_id("nope");
  v1::SessionInfo info;
  grpc::ClientContext context;
  EXPECT_STATUS(stub_->GetSession(&context, request, &info), NOT_FOUND, "session 'nope' not found");
  v1::StepRequest header = Header();
  header.mutable_header()->set_session_id("nope");
  EXPECT_STATUS(RunStep({header}), NOT_FOUND, "session 'nope' not found");
}

TEST_F(BadInputTest, UnknownParameter) {
  EXPECT_STATUS(RunStep({Header(), Chunk(7, 0, Bytes({1}))}), NOT_FOUND,
                "param_id 7 not found: session");
}

TEST_F(BadInputTest, ShapeMismatch) {
  v1::SessionSpec spec = valid_spec_;
  spec.mutable_parameters(0)->set_shape(1, 0);
  EXPECT_STATUS(Create(spec), INVALID_ARGUMENT, "param 'w': dimension 0");
}

TEST_F(BadInputTest, DTypeNotAllowed) {
  EXPECT_STATUS(RunStep({Header(), Chunk(1, 0, Bytes({1}), v1::DTYPE_UNSPECIFIED)}),
                INVALID_ARGUMENT, "gradient chunk of param_id 1: dtype 0");
  v1::StepRequest header = Header();
  header.mutable_header()->set_return_dtype(v1::DTYPE_FP16);
  EXPECT_STATUS(RunStep({header}), INVALID_ARGUMENT, "return_dtype 3 must be fp32 or bf16");
}

TEST_F(BadInputTest, ChunkOutsideTheParameter) {
  EXPECT_STATUS(RunStep({Header(), Chunk(0, 4, Bytes({1, 2, 3}))}), INVALID_ARGUMENT,
                "param 'w': chunk [4, 7) exceeds 6 elements");
}

TEST_F(BadInputTest, OverlappingChunks) {
  EXPECT_STATUS(RunStep({Header(), Chunk(0, 0, Bytes({1, 2, 3})), Chunk(0, 2, Bytes({1, 2}))}),
                INVALID_ARGUMENT, "param 'w': chunk [2, 4) from trainer 0 overlaps chunk [0, 3)");
}

TEST_F(BadInputTest, DuplicatedChunk) {
  EXPECT_STATUS(RunStep({Header(), Chunk(1, 0, Bytes({1, 2})), Chunk(1, 0, Bytes({1, 2}))}),
                INVALID_ARGUMENT, "param 'b': chunk [0, 2) from trainer 0 duplicates");
}

TEST_F(BadInputTest, ByteLengthNotMatchingTheDType) {
  EXPECT_STATUS(RunStep({Header(), Chunk(1, 0, "abcde")}), INVALID_ARGUMENT,
                "param 'b': 5 bytes is not a multiple of the fp32 element size 4");
  EXPECT_STATUS(RunStep({Header(), Chunk(1, 0, "abc", v1::DTYPE_BF16)}), INVALID_ARGUMENT,
                "3 bytes is not a multiple of the bf16 element size 2");
}

TEST_F(BadInputTest, StepOutOfSequence) {
  EXPECT_STATUS(RunStep({Header(5)}), FAILED_PRECONDITION,
                "step 5 out of sequence; expected step 1");
  EXPECT_STATUS(RunStep({Header(0)}), INVALID_ARGUMENT, "step must be >= 1");
}

TEST_F(BadInputTest, CommitWithMissingCoverage) {
  // A one-trainer session: its commit is the last one, so coverage is checked right away.
  v1::SessionSpec spec = valid_spec_;
  spec.set_num_trainers(1);
  v1::CreateSessionRequest request;
  *request.mutable_spec() = spec;
  v1::CreateSessionResponse response;
  grpc::ClientContext context;
  ASSERT_TRUE(stub_->CreateSession(&context, request, &response).ok());
  v1::StepRequest header = Header(1, 0);
  header.mutable_header()->set_session_id(response.summary().session_id());
  EXPECT_STATUS(RunStep({header, Chunk(0, 0, Bytes({1, 2, 3, 4, 5, 6})), Chunk(1, 0, Bytes({1, 2})),
                         Commit()}),
                INVALID_ARGUMENT, "param 'b': gradient elements [2, 3) of 3 missing");
}

TEST_F(BadInputTest, CommitCountMismatch) {
  v1::StepRequest commit = Commit();
  commit.mutable_commit()->set_num_elements(10);
  EXPECT_STATUS(RunStep({Header(), Chunk(1, 0, Bytes({1, 2, 3})), commit}), INVALID_ARGUMENT,
                "trainer 0 commits 10 elements but sent 3");
}

TEST_F(BadInputTest, NegativeLearningRate) {
  v1::StepRequest header = Header();
  auto* group = header.mutable_header()->add_groups();
  group->set_group_id(0);
  group->set_lr(-0.5);
  EXPECT_STATUS(RunStep({header}), INVALID_ARGUMENT, "group 0: lr = -0.5 must be finite and >= 0");
  v1::SessionSpec spec = valid_spec_;
  spec.mutable_optimizer()->mutable_sub_optimizers(0)->mutable_adamw()->set_lr(-1);
  EXPECT_STATUS(Create(spec), INVALID_ARGUMENT, "sub_optimizer 'adam' (group 0): lr = -1");
}

TEST_F(BadInputTest, InvalidHyperparameters) {
  v1::SessionSpec spec = valid_spec_;
  spec.mutable_optimizer()->mutable_sub_optimizers(0)->mutable_adamw()->set_beta1(1.5);
  EXPECT_STATUS(Create(spec), INVALID_ARGUMENT, "beta1 = 1.5 must be in [0, 1)");
  spec = valid_spec_;
  auto* sgd = spec.mutable_optimizer()->mutable_sub_optimizers(0);
  sgd->set_kind("sgd");
  sgd->mutable_sgd()->set_nesterov(true);
  EXPECT_STATUS(Create(spec), INVALID_ARGUMENT, "nesterov requires momentum > 0");
}

TEST_F(BadInputTest, UnknownOptimizerName) {
  v1::SessionSpec spec = valid_spec_;
  spec.mutable_optimizer()->mutable_sub_optimizers(0)->clear_adamw();
  spec.mutable_optimizer()->mutable_sub_optimizers(0)->set_kind("adamax");
  EXPECT_STATUS(Create(spec), INVALID_ARGUMENT, "unknown optimizer kind 'adamax'");
  // A kind that is the caller's text reaches the message (and the rank's log) escaped.
  spec.mutable_optimizer()->mutable_sub_optimizers(0)->set_kind("adamw\nevent=peer_lost rank=9");
  EXPECT_STATUS(Create(spec), INVALID_ARGUMENT,
                "unknown optimizer kind 'adamw\\nevent=peer_lost rank=9'");
}

TEST_F(BadInputTest, MessageOverTheSizeLimit) {
  EXPECT_STATUS(RunStep({Header(), Chunk(0, 0, std::string(5 << 20, '\0'))}), RESOURCE_EXHAUSTED,
                "");
}

TEST_F(BadInputTest, MoreTrainersThanDeclared) {
  EXPECT_STATUS(RunStep({Header(1, 2)}), INVALID_ARGUMENT, "trainer_id 2 out of range: session '");
}

TEST_F(BadInputTest, MessagesOutOfOrder) {
  EXPECT_STATUS(RunStep({Chunk(0, 0, Bytes({1}))}), INVALID_ARGUMENT,
                "gradient chunk before the StepHeader");
  EXPECT_STATUS(RunStep({Header(), Header()}), INVALID_ARGUMENT, "a second StepHeader");
}

// Bytes that are no StepRequest at all, sent on a raw call (the server decodes Step by hand).
TEST_F(BadInputTest, MalformedWireBytes) {
  auto run_raw = [&](const std::string& header, const std::string& wire) {
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
    std::unique_ptr<grpc::ClientReaderWriter<grpc::ByteBuffer, grpc::ByteBuffer>> stream(
        grpc::internal::ClientReaderWriterFactory<grpc::ByteBuffer, grpc::ByteBuffer>::Create(
            channel_.get(),
            grpc::internal::RpcMethod("/optstep.v1.OptimizerService/Step",
                                      grpc::internal::RpcMethod::BIDI_STREAMING),
            &context));
    for (const std::string& bytes : {header, wire}) {
      grpc::Slice slice(bytes);
      if (!stream->Write(grpc::ByteBuffer(&slice, 1))) break;
    }
    stream->WritesDone();
    grpc::ByteBuffer response;
    while (stream->Read(&response)) {
    }
    return stream->Finish();
  };
  const std::string header = Header().SerializeAsString();
  EXPECT_STATUS(run_raw(header, std::string("\x12\x05\x08\x01", 4)), INVALID_ARGUMENT,
                "gradient (field 2): length 5 runs past the end (2 bytes left)");
  EXPECT_STATUS(run_raw(header, std::string("\x12\x02\x0a\x00", 4)), INVALID_ARGUMENT,
                "param_id has wire type 2, expected 0");
  EXPECT_STATUS(run_raw(header, std::string("\x12\x03\x22\x80\x80", 5)), INVALID_ARGUMENT,
                "data length: truncated varint");
  EXPECT_STATUS(run_raw(std::string("\x0a\x02\x08\x80", 4), ""), INVALID_ARGUMENT,
                "header (field 1) does not parse as optstep.v1.StepHeader");
  // The server keeps serving: a well-formed stream still gets its usual answer.
  EXPECT_STATUS(RunStep({Header(), Chunk(7, 0, Bytes({1}))}), NOT_FOUND, "param_id 7 not found");
}

// CreateSession bytes that do not parse, sent on a raw unary call.
TEST_F(BadInputTest, MalformedCreateSessionBytes) {
  auto create_raw = [&](const std::string& bytes) {
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
    grpc::Slice slice(bytes);
    grpc::ByteBuffer request(&slice, 1);
    grpc::ByteBuffer response;
    return grpc::internal::BlockingUnaryCall<grpc::ByteBuffer, grpc::ByteBuffer>(
        channel_.get(),
        grpc::internal::RpcMethod("/optstep.v1.OptimizerService/CreateSession",
                                  grpc::internal::RpcMethod::NORMAL_RPC),
        &context, request, &response);
  };
  // spec (field 1): length 5 runs past the end.
  EXPECT_STATUS(create_raw(std::string("\x0a\x05\x08", 3)), INVALID_ARGUMENT,
                "optstep.v1.CreateSessionRequest");
  // A truncated varint, and a field with wire type 7 (no such type).
  EXPECT_STATUS(create_raw(std::string("\x08\x80", 2)), INVALID_ARGUMENT, "does not parse");
  EXPECT_STATUS(create_raw(std::string("\x0f", 1)), INVALID_ARGUMENT, "does not parse");
  // No spec at all: an empty request parses, and is refused for what it lacks.
  EXPECT_STATUS(create_raw(""), INVALID_ARGUMENT, "declares no parameters");
  // The server keeps serving.
  EXPECT_TRUE(Create(valid_spec_).ok());
}

TEST_F(BadInputTest, SubOptimizerWithoutKindOrOptions) {
  v1::SessionSpec spec = valid_spec_;
  spec.mutable_optimizer()->mutable_sub_optimizers(0)->clear_kind();
  EXPECT_STATUS(Create(spec), INVALID_ARGUMENT, "sub_optimizer 'adam'");
}

TEST_F(BadInputTest, AbsurdLearningRates) {
  v1::SessionSpec spec = valid_spec_;
  spec.mutable_optimizer()->mutable_sub_optimizers(0)->mutable_adamw()->set_lr(1e30);
  EXPECT_STATUS(Create(spec), INVALID_ARGUMENT, "lr = 1e+30 must be <= 1000");
  v1::StepRequest header = Header();
  auto* group = header.mutable_header()->add_groups();
  group->set_group_id(0);
  group->set_lr(1e30);
  EXPECT_STATUS(RunStep({header}), INVALID_ARGUMENT, "step 1: group 0: lr = 1e+30 must be <= 1000");
  group->set_lr(1e-3);
  group->set_weight_decay(std::numeric_limits<double>::infinity());
  EXPECT_STATUS(RunStep({header}), INVALID_ARGUMENT,
                "group 0: weight_decay = inf must be finite and >= 0");
}

TEST_F(BadInputTest, WorkBoundsAtCreation) {
  v1::SessionSpec spec = valid_spec_;
  auto* sub = spec.mutable_optimizer()->mutable_sub_optimizers(0);
  sub->set_name("m");
  sub->set_kind("muon");
  sub->mutable_muon()->set_num_ns_steps(100000000);
  auto* adam = spec.mutable_optimizer()->add_sub_optimizers();
  adam->set_name("adam");
  adam->set_kind("adamw");
  EXPECT_STATUS(Create(spec), INVALID_ARGUMENT,
                "sub_optimizer 'm' (group 0): num_ns_steps = 100000000 must be <= 100");
  sub->clear_muon();
  sub->set_kind("soap");
  sub->mutable_soap()->set_power_iter_steps(1000000);
  EXPECT_STATUS(Create(spec), INVALID_ARGUMENT, "power_iter_steps = 1000000 must be <= 100");
  // A step that waits for its trainers for ever keeps its streams' staged bytes as long.
  spec = valid_spec_;
  spec.set_step_deadline_ms(uint64_t{1} << 50);
  EXPECT_STATUS(Create(spec), INVALID_ARGUMENT,
                "session: step_deadline_ms = 1125899906842624 must be at most 3600000 (an hour)");
  // Nor one so short that every rank aborts the session's steps as fast as they come.
  spec.set_step_deadline_ms(1);
  EXPECT_STATUS(Create(spec), INVALID_ARGUMENT,
                "session: step_deadline_ms = 1 must be 0 (the server's default) or at least 100");
}

// Initial values that are not finite are refused, naming the parameter and the first bad
// element; nothing of the message is applied.
TEST_F(BadInputTest, NonFiniteInitialValues) {
  auto init = [&](uint32_t param, uint64_t offset, const std::vector<float>& values) {
    v1::InitParametersRequest request;
    request.set_session_id(session_);
    request.mutable_values()->set_param_id(param);
    request.mutable_values()->set_offset(offset);
    request.mutable_values()->set_dtype(v1::DTYPE_FP32);
    request.mutable_values()->set_data(Bytes(values));
    v1::InitParametersResponse response;
    grpc::ClientContext context;
    auto writer = stub_->InitParameters(&context, &response);
    writer->Write(request);
    writer->WritesDone();
    return writer->Finish();
  };
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const float inf = std::numeric_limits<float>::infinity();
  EXPECT_STATUS(init(0, 2, {1, 2, nan, 4}), INVALID_ARGUMENT,
                "param 'w': initial value at element 4 is nan");
  EXPECT_STATUS(init(1, 0, {-inf, 1}), INVALID_ARGUMENT,
                "param 'b': initial value at element 0 is -inf");
  // TearDown checks that every parameter is still zero.
}

TEST_F(BadInputTest, SaveAndLoadNeedACheckpointRootAndAKnownSession) {
  auto stub = v1::CheckpointService::NewStub(channel_);
  auto save = [&](const std::string& session, const std::string& name) {
    v1::SaveRequest request;
    request.set_session_id(session);
    request.set_name(name);
    grpc::ClientContext context;
    auto reader = stub->Save(&context, request);
    v1::CheckpointProgress progress;
    while (reader->Read(&progress)) {
    }
    return reader->Finish();
  };
  grpc::Status unknown = save("nope", "a");
  EXPECT_EQ(unknown.error_code(), grpc::StatusCode::NOT_FOUND);
  EXPECT_THAT(unknown.error_message(), HasSubstr("'nope'"));
  grpc::Status no_root = save(session_, "a");
  EXPECT_EQ(no_root.error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  EXPECT_THAT(no_root.error_message(), HasSubstr("--checkpoint_root"));
  // The server keeps serving.
  v1::LoadRequest load;
  load.set_session_id(session_);
  load.set_name("a");
  grpc::ClientContext context;
  auto reader = stub->Load(&context, load);
  v1::CheckpointProgress progress;
  while (reader->Read(&progress)) {
  }
  EXPECT_EQ(reader->Finish().error_code(), grpc::StatusCode::FAILED_PRECONDITION);
}

}  // namespace
}  // namespace optstep
