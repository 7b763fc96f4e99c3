// The server's limits through the real process: each crossing answers RESOURCE_EXHAUSTED with a
// message that names the limit and the value, and the server goes on serving. A session whose
// footprint does not fit the rank's memory budget is refused before anything is allocated.

#include <grpcpp/create_channel.h>
#include <unistd.h>

#include <fstream>
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
#include "tests/integration/test_session.h"
#include "tests/testing/server_process.h"
#include "tests/testing/status_matchers.h"

namespace optstep {
namespace {

using ::optstep::testutil::IsOk;
using ::optstep::testutil::ServerProcess;
using ::optstep::testutil::SmallSpec;
using ::optstep::testutil::StatusIs;
using ::optstep::testutil::StepSmall;

using Connected = testutil::ConnectedServer;

absl::StatusOr<Connected> Start(std::vector<std::string> flags) {
  return testutil::StartConnected(std::move(flags));
}

// The server still creates, steps and closes a session after a refusal.
void ExpectStillServing(Client& client) {
  auto sessions = client.ListSessions();
  ASSERT_THAT(sessions.status(), IsOk());
  for (const v1::SessionSummary& s : *sessions)
    ASSERT_THAT(client.CloseSession(s.session_id()), IsOk());
  auto info = client.CreateSession(SmallSpec("after"));
  ASSERT_THAT(info.status(), IsOk());
  EXPECT_THAT(StepSmall(client, info->session_id(), 1).status(), IsOk());
  EXPECT_THAT(client.CloseSession(info->session_id()), IsOk());
}

TEST(LimitsTest, MaxSessions) {
  OPTSTEP_ASSERT_OK_AND_ASSIGN(Connected c, Start({"--max_sessions=1"}));
  OPTSTEP_ASSERT_OK_AND_ASSIGN(v1::SessionInfo first, c.client->CreateSession(SmallSpec("a")));
  EXPECT_THAT(c.client->CreateSession(SmallSpec("b")).status(),
              StatusIs(absl::StatusCode::kResourceExhausted,
                       "the server holds 1 sessions; the limit is 1"));
  EXPECT_THAT(StepSmall(*c.client, first.session_id(), 1).status(), IsOk());
  ExpectStillServing(*c.client);
}

TEST(LimitsTest, MaxParamsPerSession) {
  OPTSTEP_ASSERT_OK_AND_ASSIGN(Connected c, Start({"--max_params_per_session=2"}));
  v1::SessionSpec three = SmallSpec("three");
  auto* extra = three.add_parameters();
  extra->set_name("fc2.bias");
  extra->add_shape(4);
  EXPECT_THAT(c.client->CreateSession(three).status(),
              StatusIs(absl::StatusCode::kResourceExhausted,
                       "session declares 3 parameters; the limit is 2"));
  ExpectStillServing(*c.client);
}

TEST(LimitsTest, MaxSessionBytes) {
  // SmallSpec: 40 fp32 masters and 40 gradients = 320 bytes before optimizer state.
  OPTSTEP_ASSERT_OK_AND_ASSIGN(Connected c, Start({"--max_session_bytes=200"}));
  EXPECT_THAT(c.client->CreateSession(SmallSpec("big")).status(),
              StatusIs(absl::StatusCode::kResourceExhausted, "the limit is 200 bytes per session"));
  auto sessions = c.client->ListSessions();
  ASSERT_THAT(sessions.status(), IsOk());
  EXPECT_TRUE(sessions->empty());
}

// Resident bytes of process `pid` (/proc/<pid>/statm).
int64_t ResidentBytes(pid_t pid) {
  std::ifstream statm(absl::StrCat("/proc/", pid, "/statm"));
  int64_t size = 0;
  int64_t resident = 0;
  statm >> size >> resident;
  return resident * sysconf(_SC_PAGE_SIZE);
}

// One fp32 parameter of `shape` under the "sgd" preset.
v1::SessionSpec OneParamSpec(const std::string& name, std::vector<int64_t> shape) {
  v1::SessionSpec spec;
  spec.set_name(name);
  auto* p = spec.add_parameters();
  p->set_name("embedding.weight");
  for (int64_t d : shape) p->add_shape(d);
  spec.set_num_trainers(1);
  spec.set_gradient_mode(v1::GRADIENT_MODE_SHARDED);
  spec.mutable_optimizer()->set_preset("sgd");
  return spec;
}

// A session of shape [1e9] would allocate and zero-fill 12 GB on this rank (master, momentum,
// gradient): under a budget of 1 GiB it is refused before anything is allocated, and every other
// tenant goes on.
TEST(LimitsTest, SessionOverTheMemoryBudgetIsRefusedBeforeAnythingIsAllocated) {
  OPTSTEP_ASSERT_OK_AND_ASSIGN(Connected c, Start({"--memory_budget=1G"}));
  OPTSTEP_ASSERT_OK_AND_ASSIGN(v1::SessionInfo tenant,
                               c.client->CreateSession(SmallSpec("tenant")));
  const int64_t before = ResidentBytes(c.server->pid());
  const absl::Status refused = c.client->CreateSession(OneParamSpec("huge", {1000000000})).status();
  EXPECT_THAT(refused,
              StatusIs(absl::StatusCode::kResourceExhausted, "session 'huge' needs 12000"));
  EXPECT_THAT(refused.message(),
              testing::HasSubstr(" bytes on rank 0 (masters 4000000000, optimizer state "
                                 "4000000000, gradients 4000000000, overhead "));
  EXPECT_THAT(refused.message(),
              testing::HasSubstr("more than the rank's budget of 1073741824 bytes has free"));
  EXPECT_LT(ResidentBytes(c.server->pid()) - before, 32 << 20);
  EXPECT_THAT(StepSmall(*c.client, tenant.session_id(), 1).status(), IsOk());
  ExpectStillServing(*c.client);
}

// A session of many trainers may keep four InitParameters streams open a trainer, each staging
// up to the session's parameters until its final message: the staged values are taken from the
// rank's budget, so that streams held open stop at it (RESOURCE_EXHAUSTED, nothing written)
// rather than take the rank past its memory. Before, 64 streams staged 256 MiB on a rank of a
// 96 MiB budget.
TEST(LimitsTest, StagedInitialValuesAreTakenFromTheBudget) {
  OPTSTEP_ASSERT_OK_AND_ASSIGN(Connected c, Start({"--memory_budget=96M"}));
  v1::SessionSpec spec = OneParamSpec("staged", {1 << 20});  // 4 MiB of values
  spec.set_num_trainers(16);
  OPTSTEP_ASSERT_OK_AND_ASSIGN(v1::SessionInfo info, c.client->CreateSession(spec));
  auto stub = v1::OptimizerService::NewStub(
      grpc::CreateChannel(c.server->address(), grpc::InsecureChannelCredentials()));
  constexpr int kStreams = 64;  // four a trainer
  int refused = 0;
  for (const grpc::Status& ended : testutil::StageAndEndInitStreams(
           *stub, std::vector<std::string>(kStreams, info.session_id()))) {
    if (ended.error_code() == grpc::StatusCode::RESOURCE_EXHAUSTED) {
      EXPECT_THAT(ended.error_message(), testing::HasSubstr("values staged until the stream's"));
      ++refused;
    } else {
      EXPECT_EQ(ended.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << ended.error_message();
    }
  }
  EXPECT_GT(refused, 0) << "every stream staged its values, past the rank's budget";
  EXPECT_LT(refused, kStreams);
  ExpectStillServing(*c.client);
}

// A session of many trainers may keep an ImportStateDict stream open a trainer, each staging the
// tensors it declares until its final message: what they declare is taken from the rank's budget
// (beyond its owner's places in the headroom), so that streams held open stop at it
// (RESOURCE_EXHAUSTED, nothing applied) rather than take the rank past its memory. Before, each
// stream's first chunk made the whole tensor it declared, in no ledger: 16 streams of one 4-byte
// chunk each made 128 MiB on a rank of a 96 MiB budget.
TEST(LimitsTest, ImportedTensorsAreTakenFromTheBudget) {
  OPTSTEP_ASSERT_OK_AND_ASSIGN(Connected c, Start({"--memory_budget=96M"}));
  v1::SessionSpec spec = OneParamSpec("imported", {1 << 20});
  spec.set_num_trainers(16);  // 16 uploads open at most
  OPTSTEP_ASSERT_OK_AND_ASSIGN(v1::SessionInfo info, c.client->CreateSession(spec));
  auto stub = v1::CheckpointService::NewStub(
      grpc::CreateChannel(c.server->address(), grpc::InsecureChannelCredentials()));
  v1::StateDictChunk chunk;  // one element of an 8 MiB tensor
  chunk.set_session_id(info.session_id());
  chunk.set_key("param/w");
  chunk.set_dtype(v1::DTYPE_FP32);
  chunk.add_shape(2 << 20);
  chunk.set_data(std::string(4, '\0'));
  constexpr int kStreams = 16;
  std::vector<std::unique_ptr<grpc::ClientContext>> contexts;
  std::vector<v1::ImportStateDictResponse> responses(kStreams);
  std::vector<std::unique_ptr<grpc::ClientWriter<v1::StateDictChunk>>> streams;
  for (int s = 0; s < kStreams; ++s) {
    contexts.push_back(std::make_unique<grpc::ClientContext>());
    streams.push_back(stub->ImportStateDict(contexts.back().get(), &responses[s]));
    streams.back()->Write(chunk);
  }
  absl::SleepFor(absl::Milliseconds(500));  // the rank has read what it takes
  int refused = 0;
  for (auto& stream : streams) {
    stream->WritesDone();
    const grpc::Status ended = stream->Finish();
    if (ended.error_code() == grpc::StatusCode::RESOURCE_EXHAUSTED) {
      EXPECT_THAT(ended.error_message(), testing::HasSubstr("state dict tensors staged"));
      ++refused;
    } else {
      EXPECT_EQ(ended.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << ended.error_message();
    }
  }
  EXPECT_GT(refused, 0) << "every stream staged its tensor, past the rank's budget";
  EXPECT_LT(refused, kStreams);
  ExpectStillServing(*c.client);
}

// Opens `tries` ExportStateDict streams of `session_id` and leaves each open unread (a slow
// reader), then cancels them all; answers how many were held open. Each one refused must be
// RESOURCE_EXHAUSTED for its copy of the state; `*refused` counts them.
int HoldUnreadExports(Connected& c, const std::string& session_id, int tries, int* refused) {
  auto stub = v1::CheckpointService::NewStub(testutil::SlowReaderChannel(c.server->address()));
  v1::ExportStateDictRequest request;
  request.set_session_id(session_id);
  std::vector<std::unique_ptr<grpc::ClientContext>> contexts;
  std::vector<std::unique_ptr<grpc::ClientReader<v1::StateDictChunk>>> streams;
  for (int s = 0; s < tries; ++s) {
    contexts.push_back(std::make_unique<grpc::ClientContext>());
    streams.push_back(stub->ExportStateDict(contexts.back().get(), request));
    v1::StateDictChunk chunk;
    if (streams.back()->Read(&chunk)) continue;  // held open, unread
    const grpc::Status ended = streams.back()->Finish();
    EXPECT_EQ(ended.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED) << ended.error_message();
    EXPECT_THAT(ended.error_message(), testing::HasSubstr("a copy of its state"));
    ++*refused;
    streams.pop_back();
  }
  const int held = static_cast<int>(streams.size());
  for (auto& context : contexts) context->TryCancel();
  for (auto& stream : streams) (void)stream->Finish();
  return held;
}

// A session of many trainers may keep an ExportStateDict stream open a trainer, each holding a
// copy of its state until it is read: the copies are taken from the rank's budget, so that
// streams left unread stop at it (RESOURCE_EXHAUSTED) rather than take the rank past its memory.
TEST(LimitsTest, HeldExportCopiesAreTakenFromTheBudget) {
  OPTSTEP_ASSERT_OK_AND_ASSIGN(Connected c, Start({"--memory_budget=96M"}));
  v1::SessionSpec spec = OneParamSpec("exported", {1 << 20});  // 4 MiB of masters, 4 of momentum
  spec.mutable_optimizer()->set_preset("adam");                // 12 MiB of state in all
  spec.set_num_trainers(16);
  OPTSTEP_ASSERT_OK_AND_ASSIGN(v1::SessionInfo info, c.client->CreateSession(spec));
  int refused = 0;
  HoldUnreadExports(c, info.session_id(), 16, &refused);
  EXPECT_GT(refused, 0) << "every export held its copy, past the rank's budget";
  EXPECT_LT(refused, 16);
  ExpectStillServing(*c.client);
}

// An owner's places in the headroom hold its exports' copies only while they fit in the rank's
// headroom (--memory_headroom, shared by every kind of stream); the others are taken from the
// budget. Before, the places were counted, never sized: an owner's two exports and four
// InitParameters streams held copies of its largest session outside the budget whatever their
// size, and so did every other owner's. With a headroom too small for one copy, the rank holds
// two exports fewer (each copy 12 MiB, from the budget) than with one that holds both.
TEST(LimitsTest, TheHeadroomHoldsCopiesOnlyWhileTheyFit) {
  int opened[2] = {0, 0};
  const char* headroom[2] = {"--memory_headroom=1M", "--memory_headroom=64M"};
  for (int run = 0; run < 2; ++run) {
    OPTSTEP_ASSERT_OK_AND_ASSIGN(Connected c, Start({"--memory_budget=96M", headroom[run]}));
    v1::SessionSpec spec = OneParamSpec("exported", {1 << 20});
    spec.mutable_optimizer()->set_preset("adam");  // 12 MiB of masters and state
    spec.set_num_trainers(16);                     // 16 exports open at most
    OPTSTEP_ASSERT_OK_AND_ASSIGN(v1::SessionInfo info, c.client->CreateSession(spec));
    int refused = 0;
    opened[run] = HoldUnreadExports(c, info.session_id(), 16, &refused);
    ExpectStillServing(*c.client);
  }
  EXPECT_LT(opened[1], 16) << "the budget was to refuse an export";
  EXPECT_EQ(opened[1] - opened[0], 2) << opened[0] << " and " << opened[1] << " exports opened";
}

// 300,000 parameters of one element: 2.4 MB of tensors, but about 1.2 KB per parameter of the
// server's records, which the footprint counts.
TEST(LimitsTest, ManyTinyParametersAreCountedByTheirOverhead) {
  OPTSTEP_ASSERT_OK_AND_ASSIGN(Connected c,
                               Start({"--memory_budget=256M", "--max_message_bytes=33554432"}));
  v1::SessionSpec spec = OneParamSpec("tiny", {1});
  spec.clear_parameters();
  for (int i = 0; i < 300000; ++i) {
    auto* p = spec.add_parameters();
    p->set_name(absl::StrCat("p", i));
    p->add_shape(1);
  }
  const absl::Status refused = c.client->CreateSession(spec).status();
  EXPECT_THAT(refused, StatusIs(absl::StatusCode::kResourceExhausted, "session 'tiny' needs "));
  EXPECT_THAT(refused.message(), testing::HasSubstr("masters 1200000, "));
  EXPECT_THAT(refused.message(),
              testing::HasSubstr("more than the rank's budget of 268435456 bytes has free"));
  ExpectStillServing(*c.client);
}

// Rank 0 admits the session but rank 1, with a smaller budget, does not: the refusal names rank 1
// and comes at once, before any rank builds a replica (rank 0 used to wait in the communicator's
// rendezvous for rank 1's replica until the timeout).
TEST(LimitsTest, ARefusalOnAnotherRankIsAnsweredBeforeAnyReplicaIsBuilt) {
  OPTSTEP_ASSERT_OK_AND_ASSIGN(
      auto rank0, ServerProcess::Start({"--rank=0", "--world_size=2", "--comm_timeout_ms=60000"}));
  OPTSTEP_ASSERT_OK_AND_ASSIGN(
      auto rank1, ServerProcess::Start({"--rank=1", "--world_size=2", "--memory_budget=16M",
                                        absl::StrCat("--rendezvous=", rank0->address())}));
  ClientOptions options;
  options.rank_targets = {rank0->address(), rank1->address()};
  OPTSTEP_ASSERT_OK_AND_ASSIGN(auto client, Client::Connect(options));
  ASSERT_THAT(testutil::WaitServing(*client), IsOk());
  // 32 MB of masters on every rank: beyond rank 1's budget only.
  const absl::Time start = absl::Now();
  const absl::Status refused =
      client->CreateSession(OneParamSpec("wide", {int64_t{8} << 20})).status();
  EXPECT_THAT(refused, StatusIs(absl::StatusCode::kResourceExhausted, "rank 1: session 'wide'"));
  EXPECT_THAT(refused.message(),
              testing::HasSubstr("the rank's budget of 16777216 bytes has free"));
  EXPECT_LT(absl::Now() - start, absl::Seconds(10));
  OPTSTEP_ASSERT_OK_AND_ASSIGN(auto sessions, client->ListSessions());
  EXPECT_TRUE(sessions.empty());
  ExpectStillServing(*client);
}

// Without --memory_budget the rank admits into a share of its cgroup's or the host's memory: a
// parameter of 2^40 elements (16 TiB with its gradient) is refused, not attempted.
TEST(LimitsTest, TheDefaultBudgetRefusesASessionLargerThanTheMachine) {
  OPTSTEP_ASSERT_OK_AND_ASSIGN(Connected c, Start({}));
  const absl::Status refused =
      c.client->CreateSession(OneParamSpec("vast", {int64_t{1} << 40})).status();
  EXPECT_THAT(refused, StatusIs(absl::StatusCode::kResourceExhausted, "session 'vast' needs "));
  EXPECT_THAT(refused.message(), testing::HasSubstr("more than the rank's budget of "));
  ExpectStillServing(*c.client);
}

TEST(LimitsTest, MaxMessageBytes) {
  // 32768 fp32 elements: one 128 KiB chunk with the client's default chunk size.
  OPTSTEP_ASSERT_OK_AND_ASSIGN(Connected c, Start({"--max_message_bytes=65536"}));
  v1::SessionSpec spec;
  spec.set_name("wide");
  auto* w = spec.add_parameters();
  w->set_name("embedding.weight");
  w->add_shape(32768);
  spec.set_num_trainers(1);
  spec.set_gradient_mode(v1::GRADIENT_MODE_SHARDED);
  spec.mutable_optimizer()->set_preset("sgd");
  OPTSTEP_ASSERT_OK_AND_ASSIGN(v1::SessionInfo info, c.client->CreateSession(spec));
  const std::vector<float> values(32768, 0.5f);
  EXPECT_THAT(c.client->InitParameters(info.session_id(), 0, values),
              StatusIs(absl::StatusCode::kResourceExhausted, "vs. 65536"));
  StepOptions step;
  step.session_id = info.session_id();
  step.step = 1;
  const FullGradient grads[] = {{0, values}};
  EXPECT_THAT(c.client->Step(step, grads).status(),
              StatusIs(absl::StatusCode::kResourceExhausted, "vs. 65536"));

  // The same step in chunks that fit goes through: nothing was left half-done.
  ClientOptions small;
  small.target = c.server->address();
  small.max_chunk_bytes = 16 << 10;
  OPTSTEP_ASSERT_OK_AND_ASSIGN(auto fitting, Client::Connect(small));
  EXPECT_THAT(fitting->InitParameters(info.session_id(), 0, values), IsOk());
  step.skip_return = true;  // the answer would again be one large chunk per parameter
  OPTSTEP_ASSERT_OK_AND_ASSIGN(StepReply reply, fitting->Step(step, grads));
  EXPECT_EQ(reply.step, 1u);
}

void AppendVarint(uint64_t value, std::string& out) {
  for (; value >= 0x80; value >>= 7) out.push_back(static_cast<char>(value | 0x80));
  out.push_back(static_cast<char>(value));
}

// `request` with field 999 (unknown to every reader) of `bytes` bytes appended.
v1::StepRequest WithUnknownField(const v1::StepRequest& request, size_t bytes) {
  std::string wire = request.SerializeAsString();
  AppendVarint((999 << 3) | 2, wire);  // length-delimited
  AppendVarint(bytes, wire);
  wire.append(bytes, 'p');
  v1::StepRequest padded;
  padded.ParseFromString(wire);  // keeps the field as unknown, and sends it again
  return padded;
}

// A Step stream of step 1, one element per chunk, each message
// padded with `padding` bytes of an unknown field (skipped by the server, as protobuf does); it
// commits after every chunk went through. Answers the stream's status.
grpc::Status PaddedStep(const std::string& address, const std::string& session_id, size_t padding) {
  auto stub = v1::OptimizerService::NewStub(
      grpc::CreateChannel(address, grpc::InsecureChannelCredentials()));
  grpc::ClientContext context;
  context.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(30)));
  auto stream = stub->Step(&context);
  v1::StepRequest header;
  header.mutable_header()->set_session_id(session_id);
  header.mutable_header()->set_step(1);
  bool ok = stream->Write(header);
  // SmallSpec's parameters: fc.weight (32 elements) and fc.bias (8).
  for (int i = 0; i < testutil::kSmallElements && ok; ++i) {
    const float g = 0.01f;
    v1::StepRequest chunk;
    chunk.mutable_gradient()->set_param_id(i < 32 ? 0 : 1);
    chunk.mutable_gradient()->set_offset(i < 32 ? i : i - 32);
    chunk.mutable_gradient()->set_dtype(v1::DTYPE_FP32);
    chunk.mutable_gradient()->set_data(std::string(reinterpret_cast<const char*>(&g), sizeof(g)));
    chunk = WithUnknownField(chunk, padding);
    ok = stream->Write(chunk);
  }
  if (ok) {
    v1::StepRequest commit;
    commit.mutable_commit()->set_num_elements(testutil::kSmallElements);
    stream->Write(commit);
  }
  stream->WritesDone();
  v1::StepResponse response;
  while (stream->Read(&response)) {
  }
  return stream->Finish();
}

// The session still at step 0, and it steps on a new stream: the bounded stream applied nothing.
void ExpectNothingApplied(Connected& c, const std::string& session_id) {
  OPTSTEP_ASSERT_OK_AND_ASSIGN(v1::SessionInfo info, c.client->GetSession(session_id));
  EXPECT_EQ(info.step(), 0u);
  EXPECT_THAT(StepSmall(*c.client, session_id, 1).status(), IsOk());
  ExpectStillServing(*c.client);
}

TEST(LimitsTest, StreamBytesDerivedFromTheSession) {
  // SmallSpec: 40 fp32 gradients on this rank; the bound is about 1 MiB, and 40 chunks of
  // 64 KiB of padding cross it.
  OPTSTEP_ASSERT_OK_AND_ASSIGN(Connected c, Start({}));
  OPTSTEP_ASSERT_OK_AND_ASSIGN(v1::SessionInfo info, c.client->CreateSession(SmallSpec("pad")));
  const grpc::Status status = PaddedStep(c.server->address(), info.session_id(), 64 << 10);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED) << status.error_message();
  EXPECT_THAT(status.error_message(),
              testing::HasSubstr("bytes per stream (twice the session's gradient bytes"));
  ExpectNothingApplied(c, info.session_id());
}

TEST(LimitsTest, MaxStreamBytes) {
  OPTSTEP_ASSERT_OK_AND_ASSIGN(Connected c, Start({"--max_stream_bytes=20000"}));
  OPTSTEP_ASSERT_OK_AND_ASSIGN(v1::SessionInfo info, c.client->CreateSession(SmallSpec("pad")));
  // 40 x 256 bytes of padding fits the bound; 40 x 1 KiB does not.
  const grpc::Status fits = PaddedStep(c.server->address(), info.session_id(), 256);
  EXPECT_EQ(fits.error_code(), grpc::StatusCode::OK) << fits.error_message();
  OPTSTEP_ASSERT_OK_AND_ASSIGN(v1::SessionInfo other, c.client->CreateSession(SmallSpec("over")));
  const grpc::Status over = PaddedStep(c.server->address(), other.session_id(), 1 << 10);
  EXPECT_EQ(over.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED) << over.error_message();
  EXPECT_THAT(over.error_message(),
              testing::HasSubstr("over the bound of 20000 bytes per stream (the server's max"));
  ExpectNothingApplied(c, other.session_id());
}

TEST(LimitsTest, StreamIdleTimeout) {
  OPTSTEP_ASSERT_OK_AND_ASSIGN(Connected c, Start({"--stream_idle_timeout_ms=500"}));
  OPTSTEP_ASSERT_OK_AND_ASSIGN(v1::SessionInfo info, c.client->CreateSession(SmallSpec("idle")));
  auto stub = v1::OptimizerService::NewStub(
      grpc::CreateChannel(c.server->address(), grpc::InsecureChannelCredentials()));
  grpc::ClientContext context;
  context.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(60)));
  const absl::Time start = absl::Now();
  auto stream = stub->Step(&context);
  v1::StepRequest header;
  header.mutable_header()->set_session_id(info.session_id());
  header.mutable_header()->set_step(1);
  ASSERT_TRUE(stream->Write(header));
  // The trainer sends its header and then nothing: no gradient, no commit, no half-close.
  v1::StepResponse response;
  EXPECT_FALSE(stream->Read(&response));  // until the server ends the stream
  const grpc::Status status = stream->Finish();
  EXPECT_EQ(status.error_code(), grpc::StatusCode::DEADLINE_EXCEEDED) << status.error_message();
  EXPECT_THAT(status.error_message(), testing::HasSubstr("over the stream idle timeout of 500ms"));
  EXPECT_LT(absl::Now() - start, absl::Seconds(10));  // the client's own deadline is 60 s
  ExpectNothingApplied(c, info.session_id());
}

}  // namespace
}  // namespace optstep
