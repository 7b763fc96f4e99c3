// Client streams are transactions, through the real server: an ImportStateDict or InitParameters
// stream that is cancelled mid-way, ends without its final message (StreamEnd), carries a final
// message that disagrees, or holds a malformed message changes nothing (the exported state and
// the pulled parameters are bit-identical before and after), and answers the precise code; a
// complete stream applies.

#include <grpcpp/grpcpp.h>

#include <cstring>
#include <functional>
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
#include "wire/grpc_status.h"
#include "wire/stream_end.h"

namespace optstep {
namespace {

using ::optstep::testutil::IsOk;
using ::optstep::testutil::ServerProcess;
using ::optstep::testutil::SmallSpec;
using ::optstep::testutil::StatusIs;
using ::optstep::testutil::StepSmall;
using ::optstep::testutil::UnreadExport;
using ::testing::HasSubstr;

using Entries = std::vector<Client::StateDictEntry>;

// The streams of a session over its bound: `held` are open with a first piece written, and
// `another` is tried (a whole stream) until it is refused. A Write is out once it is sent, not
// once the rank has taken it: `another` may reach the rank before one of `held` and take its
// slot, and that one is refused instead. Ends `held` (without their final message) and answers
// how many of all were refused with `refusal`; the others must end INVALID_ARGUMENT.
template <typename Request>
int Refusals(std::vector<std::unique_ptr<grpc::ClientWriter<Request>>>& held,
             const std::function<absl::Status()>& another,
             const ::testing::Matcher<absl::Status>& refusal) {
  absl::Status extra = absl::OkStatus();
  for (int tries = 0; tries < 50 && extra.ok(); ++tries) {
    extra = another();
    absl::SleepFor(absl::Milliseconds(20));
  }
  int refused = 0;
  if (!extra.ok()) {
    EXPECT_THAT(extra, refusal);
    ++refused;
  }
  for (auto& writer : held) {
    writer->WritesDone();
    const absl::Status ended = FromGrpcStatus(writer->Finish());
    if (ended.code() == absl::StatusCode::kResourceExhausted) {
      EXPECT_THAT(ended, refusal);
      ++refused;
    } else {
      EXPECT_THAT(ended, StatusIs(absl::StatusCode::kInvalidArgument, "without its final"));
    }
  }
  return refused;
}

// A session of one parameter of 1 Mi elements: 12 MiB of masters and Adam state.
v1::SessionSpec WideSpec(const std::string& name) {
  v1::SessionSpec spec = SmallSpec(name);
  spec.clear_parameters();
  auto* wide = spec.add_parameters();
  wide->set_name("wide");
  wide->add_shape(1 << 20);
  return spec;
}

// A rank of a 40 MiB budget and two sessions of one owner on it, "a" and "b" (WideSpec, 16 MiB
// of footprint each): room for little more than their footprints.
void StartWithTwoWideSessions(testutil::ConnectedServer& c, std::vector<std::string>& sessions) {
  OPTSTEP_ASSERT_OK_AND_ASSIGN(c, testutil::StartConnected({"--memory_budget=40M"}));
  for (const char* name : {"a", "b"}) {
    OPTSTEP_ASSERT_OK_AND_ASSIGN(v1::SessionInfo info, c.client->CreateSession(WideSpec(name)));
    sessions.push_back(info.session_id());
  }
}

class StreamTransactionTest : public ::testing::Test {
 protected:
  void SetUp() override {
    OPTSTEP_ASSERT_OK_AND_ASSIGN(testutil::ConnectedServer c, testutil::StartConnected());
    server_ = std::move(c.server);
    client_ = std::move(c.client);
    OPTSTEP_ASSERT_OK_AND_ASSIGN(v1::SessionInfo info, client_->CreateSession(SmallSpec("t")));
    session_ = info.session_id();
    channel_ = grpc::CreateChannel(server_->address(), grpc::InsecureChannelCredentials());
  }

  absl::StatusOr<Entries> Exported() {
    v1::ExportStateDictRequest request;
    request.set_session_id(session_);
    return client_->ExportStateDict(request);
  }

  absl::StatusOr<std::vector<std::vector<float>>> Pulled() {
    auto pulled = client_->PullParameters(session_, DType::kF32);
    if (!pulled.ok()) return pulled.status();
    std::vector<std::vector<float>> values;
    for (const auto& [id, p] : pulled->params) values.push_back(p.f32);
    return values;
  }

  // Sends `messages` on an ImportStateDict stream; with `cancel`, cancels the call after them
  // instead of half-closing.
  absl::Status Import(const std::vector<v1::StateDictChunk>& messages, bool cancel = false) {
    grpc::ClientContext context;
    v1::ImportStateDictResponse response;
    auto writer = v1::CheckpointService::NewStub(channel_)->ImportStateDict(&context, &response);
    for (const auto& m : messages) {
      if (!writer->Write(m)) break;
    }
    if (cancel) {
      // Let the server read what was sent before the cancellation reaches it.
      absl::SleepFor(absl::Milliseconds(200));
      context.TryCancel();
    } else {
      writer->WritesDone();
    }
    return FromGrpcStatus(writer->Finish());
  }

  absl::Status Init(const std::vector<v1::InitParametersRequest>& messages) {
    grpc::ClientContext context;
    v1::InitParametersResponse response;
    auto writer = v1::OptimizerService::NewStub(channel_)->InitParameters(&context, &response);
    for (const auto& m : messages) {
      if (!writer->Write(m)) break;
    }
    writer->WritesDone();
    return FromGrpcStatus(writer->Finish());
  }

  // The exported state with every byte of every tensor changed, as import messages (one chunk
  // per tensor, the first naming the session), and its final message.
  std::vector<v1::StateDictChunk> ChangedState(const Entries& state, v1::StreamEnd* end) {
    std::vector<v1::StateDictChunk> messages;
    StreamTally tally;
    for (const auto& e : state) {
      v1::StateDictChunk& m = messages.emplace_back();
      if (messages.size() == 1) m.set_session_id(session_);
      m.set_key(e.key);
      m.set_dtype(e.dtype);
      for (uint64_t d : e.shape) m.add_shape(d);
      std::string bytes = e.bytes;
      for (char& b : bytes) b = static_cast<char>(b ^ 0x11);
      m.set_data(bytes);
      tally.Add(m.data());
    }
    *end = tally.End(state.size());
    return messages;
  }

  std::unique_ptr<ServerProcess> server_;
  std::unique_ptr<Client> client_;
  std::string session_;
  std::shared_ptr<grpc::Channel> channel_;
};

TEST_F(StreamTransactionTest, BrokenImportStreamsChangeNothingAndACompleteOneApplies) {
  ASSERT_THAT(StepSmall(*client_, session_, 1).status(), IsOk());
  OPTSTEP_ASSERT_OK_AND_ASSIGN(Entries before, Exported());
  ASSERT_GE(before.size(), 3u);
  v1::StreamEnd end;
  std::vector<v1::StateDictChunk> changed = ChangedState(before, &end);

  // Every tensor, but no final message.
  EXPECT_THAT(Import(changed), StatusIs(absl::StatusCode::kInvalidArgument,
                                        absl::StrCat("ended after ", before.size(), " tensors (",
                                                     before.size(), " chunks")));
  // Cancelled after the first two tensors.
  std::vector<v1::StateDictChunk> two(changed.begin(), changed.begin() + 2);
  EXPECT_THAT(Import(two, /*cancel=*/true), StatusIs(absl::StatusCode::kCancelled));
  // A final message whose checksum or counts disagree.
  v1::StateDictChunk last;
  *last.mutable_end() = end;
  last.mutable_end()->set_crc32(end.crc32() ^ 1);
  std::vector<v1::StateDictChunk> bad_crc = changed;
  bad_crc.push_back(last);
  EXPECT_THAT(Import(bad_crc), StatusIs(absl::StatusCode::kInvalidArgument, "CRC-32"));
  *last.mutable_end() = end;
  last.mutable_end()->set_tensors(end.tensors() + 1);
  std::vector<v1::StateDictChunk> bad_count = changed;
  bad_count.push_back(last);
  EXPECT_THAT(Import(bad_count),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       absl::StrCat("declares ", before.size() + 1, " tensors")));
  // A malformed message after two good ones.
  std::vector<v1::StateDictChunk> malformed = two;
  malformed.push_back(changed[2]);
  malformed.back().set_dtype(v1::DTYPE_BF16);
  EXPECT_THAT(Import(malformed), StatusIs(absl::StatusCode::kInvalidArgument, "is not fp32"));
  // A tensor declared far larger than any state of the session: refused before it is allocated.
  std::vector<v1::StateDictChunk> huge = {changed[0]};
  huge[0].clear_shape();
  huge[0].add_shape(uint64_t{1} << 36);
  EXPECT_THAT(Import(huge), StatusIs(absl::StatusCode::kResourceExhausted, "can hold"));

  OPTSTEP_ASSERT_OK_AND_ASSIGN(Entries after, Exported());
  ASSERT_EQ(after.size(), before.size());
  for (size_t i = 0; i < before.size(); ++i) {
    EXPECT_EQ(after[i].key, before[i].key);
    EXPECT_TRUE(after[i].bytes == before[i].bytes) << before[i].key;
  }

  // The same tensors with their final message: applied.
  std::vector<v1::StateDictChunk> complete = changed;
  complete.emplace_back();
  *complete.back().mutable_end() = end;
  ASSERT_THAT(Import(complete), IsOk());
  OPTSTEP_ASSERT_OK_AND_ASSIGN(Entries applied, Exported());
  ASSERT_EQ(applied.size(), before.size());
  for (size_t i = 0; i < before.size(); ++i) {
    EXPECT_TRUE(applied[i].bytes == changed[i].data()) << before[i].key;
  }
}

TEST_F(StreamTransactionTest, BrokenInitStreamsChangeNothingAndACompleteOneWrites) {
  OPTSTEP_ASSERT_OK_AND_ASSIGN(auto before, Pulled());
  // fc.weight [8, 4] in two good chunks, then fc.bias.
  std::vector<v1::InitParametersRequest> messages;
  StreamTally tally;
  auto add = [&](uint32_t param_id, uint64_t offset, size_t count, float value) {
    v1::InitParametersRequest& m = messages.emplace_back();
    m.set_session_id(session_);
    m.mutable_values()->set_param_id(param_id);
    m.mutable_values()->set_offset(offset);
    m.mutable_values()->set_dtype(v1::DTYPE_FP32);
    std::vector<float> values(count, value);
    m.mutable_values()->set_data(values.data(), count * sizeof(float));
    tally.Add(m.values().data());
  };
  add(0, 0, 16, 1.5f);
  add(0, 16, 16, 2.5f);
  add(1, 0, 8, 3.5f);

  // A malformed message (fp16 data of an odd length) after two good ones.
  std::vector<v1::InitParametersRequest> malformed(messages.begin(), messages.begin() + 2);
  malformed.push_back(messages[2]);
  malformed.back().mutable_values()->set_dtype(v1::DTYPE_FP16);
  malformed.back().mutable_values()->mutable_data()->resize(31);
  EXPECT_THAT(Init(malformed), StatusIs(absl::StatusCode::kInvalidArgument, "31"));
  // Every value, but no final message.
  EXPECT_THAT(Init(messages), StatusIs(absl::StatusCode::kInvalidArgument,
                                       "ended after 2 tensors (3 chunks, 160 bytes) without"));
  // A final message that disagrees.
  std::vector<v1::InitParametersRequest> bad = messages;
  *bad.emplace_back().mutable_end() = tally.End(2);
  bad.back().mutable_end()->set_chunks(4);
  EXPECT_THAT(Init(bad), StatusIs(absl::StatusCode::kInvalidArgument, "declares 2 tensors (4"));
  // More bytes than the session's parameters hold.
  std::vector<v1::InitParametersRequest> too_many = messages;
  too_many.insert(too_many.end(), messages.begin(), messages.end());
  EXPECT_THAT(Init(too_many), StatusIs(absl::StatusCode::kResourceExhausted, "160 bytes of the"));
  OPTSTEP_ASSERT_OK_AND_ASSIGN(auto unchanged, Pulled());
  EXPECT_EQ(unchanged, before);

  std::vector<v1::InitParametersRequest> complete = messages;
  *complete.emplace_back().mutable_end() = tally.End(2);
  ASSERT_THAT(Init(complete), IsOk());
  OPTSTEP_ASSERT_OK_AND_ASSIGN(auto written, Pulled());
  ASSERT_EQ(written.size(), 2u);
  EXPECT_EQ(written[0][0], 1.5f);
  EXPECT_EQ(written[0][31], 2.5f);
  EXPECT_EQ(written[1][7], 3.5f);
}

// What an InitParameters stream stages is bounded whatever its messages: a chunk without data is
// refused, and so is a stream of scattered small pieces past one per parameter, one per 64 KiB of
// values and 1024 more (a stream of contiguous small chunks stages them as one piece); and each
// of a session's trainers may have four streams open at once.
// Initial values for a session past its first step are never taken: the stream is ended at its
// first piece. Before, it staged up to the session's parameters (and four such streams per
// trainer, outside the budget) until its caller ended it, and was refused only then.
TEST_F(StreamTransactionTest, InitialValuesAfterTheFirstStepEndTheStreamAtItsFirstPiece) {
  ASSERT_THAT(StepSmall(*client_, session_, 1).status(), IsOk());
  auto stub = v1::OptimizerService::NewStub(channel_);
  grpc::ClientContext context;
  context.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(10)));
  v1::InitParametersResponse response;
  auto writer = stub->InitParameters(&context, &response);
  v1::InitParametersRequest piece;
  piece.set_session_id(session_);
  piece.mutable_values()->set_param_id(1);
  piece.mutable_values()->set_dtype(v1::DTYPE_FP32);
  const std::vector<float> values(8, 0.5f);
  piece.mutable_values()->set_data(values.data(), values.size() * sizeof(float));
  writer->Write(piece);
  // Not half-closed: the server ends the stream, or the deadline does.
  EXPECT_THAT(FromGrpcStatus(writer->Finish()),
              StatusIs(absl::StatusCode::kFailedPrecondition,
                       "initial values can only be set before the first step (at step 1)"));
}

TEST_F(StreamTransactionTest, AnInitStreamStagesABoundedAmountAndFourPerTrainerAreOpen) {
  std::vector<v1::InitParametersRequest> empty(1);
  empty[0].set_session_id(session_);
  empty[0].mutable_values()->set_param_id(1);
  empty[0].mutable_values()->set_offset(3);
  empty[0].mutable_values()->set_dtype(v1::DTYPE_FP32);
  EXPECT_THAT(Init(empty), StatusIs(absl::StatusCode::kInvalidArgument,
                                    "values of param_id 1 at offset 3 carry no data"));

  v1::SessionSpec spec = SmallSpec("wide");
  spec.clear_parameters();
  auto* wide = spec.add_parameters();
  wide->set_name("wide");
  wide->add_shape(4096);  // 16 KiB: at most 1 + 0 + 1024 pieces
  OPTSTEP_ASSERT_OK_AND_ASSIGN(v1::SessionInfo info, client_->CreateSession(spec));
  auto piece = [&](uint64_t offset) {
    v1::InitParametersRequest m;
    m.set_session_id(info.session_id());
    m.mutable_values()->set_param_id(0);
    m.mutable_values()->set_offset(offset);
    m.mutable_values()->set_dtype(v1::DTYPE_BF16);
    m.mutable_values()->set_data(std::string(2, '\0'));
    return m;
  };
  std::vector<v1::InitParametersRequest> scattered, contiguous;
  for (uint64_t i = 0; i < 1026; ++i) scattered.push_back(piece(2 * i));
  EXPECT_THAT(Init(scattered),
              StatusIs(absl::StatusCode::kResourceExhausted,
                       "more than 1025 pieces of values for 1 parameters of 16384 bytes"));
  StreamTally tally;
  for (uint64_t i = 0; i < 4096; ++i) {
    contiguous.push_back(piece(i));
    tally.Add(contiguous.back().values().data());
  }
  *contiguous.emplace_back().mutable_end() = tally.End(1);
  EXPECT_THAT(Init(contiguous), IsOk());

  // A fifth stream while four are open (four per trainer).
  auto stub = v1::OptimizerService::NewStub(channel_);
  grpc::ClientContext contexts[4];
  v1::InitParametersResponse responses[4];
  std::vector<std::unique_ptr<grpc::ClientWriter<v1::InitParametersRequest>>> open;
  for (int s = 0; s < 4; ++s) {
    open.push_back(stub->InitParameters(&contexts[s], &responses[s]));
    ASSERT_TRUE(open.back()->Write(piece(0)));
  }
  const int refused = Refusals(
      open, [&] { return Init(contiguous); },
      StatusIs(absl::StatusCode::kResourceExhausted,
               "4 InitParameters streams of the session (4 per trainer) are open on this "
               "rank already; nothing was written"));
  EXPECT_EQ(refused, 1) << "four InitParameters streams per trainer are open at most, and four may";
  // Given back before the first stream's caller heard its end.
  EXPECT_THAT(Init(contiguous), IsOk());
}

// An ExportStateDict stream holds a copy of the session's state until the caller has read it: a
// session has two open at most, a third is RESOURCE_EXHAUSTED until one ends.
TEST_F(StreamTransactionTest, ASessionHasTwoExportsOpenAtMost) {
  OPTSTEP_ASSERT_OK_AND_ASSIGN(v1::SessionInfo info, client_->CreateSession(WideSpec("exported")));
  // A reader that reads nothing holds its stream open.
  auto stub = v1::CheckpointService::NewStub(testutil::SlowReaderChannel(server_->address()));
  v1::ExportStateDictRequest request;
  request.set_session_id(info.session_id());
  v1::StateDictChunk chunk;
  UnreadExport first(*stub, request), second(*stub, request);
  ASSERT_TRUE(first.started());
  ASSERT_TRUE(second.started());
  grpc::ClientContext third_context;
  auto third = stub->ExportStateDict(&third_context, request);
  while (third->Read(&chunk)) {
  }
  EXPECT_THAT(FromGrpcStatus(third->Finish()),
              StatusIs(absl::StatusCode::kResourceExhausted,
                       absl::StrCat("ExportStateDict: 2 exports of session '", info.session_id(),
                                    "' are open already")));
  EXPECT_THAT(first.Cancel(), StatusIs(absl::StatusCode::kCancelled));
  // Its slot comes back once the server has seen the cancellation.
  absl::Status read = absl::UnknownError("not read");
  for (int tries = 0; tries < 100 && !read.ok(); ++tries) {
    read = client_->ExportStateDict(request).status();
    if (!read.ok()) absl::SleepFor(absl::Milliseconds(20));
  }
  EXPECT_THAT(read, IsOk());
  (void)second.Cancel();
}

// An owner's exports hold their copies in the rank's headroom two at a time, whatever its number
// of sessions; its others take them from the budget (within its share). Before, each of its
// sessions had two there, and an owner of many sessions, each with exports left unread, could
// make the rank hold a copy of all their states outside the budget.
TEST(ExportHeadroomTest, AnOwnerHasTwoExportsInTheHeadroomWhateverItsSessions) {
  // Room for the two sessions' footprints (16 MiB each), not for a third copy of one's state.
  testutil::ConnectedServer c;
  std::vector<std::string> sessions;
  ASSERT_NO_FATAL_FAILURE(StartWithTwoWideSessions(c, sessions));
  auto stub = v1::CheckpointService::NewStub(testutil::SlowReaderChannel(c.server->address()));
  v1::ExportStateDictRequest of_a;
  of_a.set_session_id(sessions[0]);
  UnreadExport first(*stub, of_a), second(*stub, of_a);
  ASSERT_TRUE(first.started());
  ASSERT_TRUE(second.started());
  v1::ExportStateDictRequest of_b;
  of_b.set_session_id(sessions[1]);
  const absl::Status refused = c.client->ExportStateDict(of_b).status();
  EXPECT_THAT(refused, StatusIs(absl::StatusCode::kResourceExhausted, "ExportStateDict needs "));
  EXPECT_THAT(refused.message(), HasSubstr(absl::StrCat("session '", sessions[1],
                                                        "': a copy of its state, held until the "
                                                        "stream is read), more than the rank's "
                                                        "budget")));
  (void)first.Cancel();
  // Its place in the headroom comes back once the server has seen the cancellation.
  absl::Status read = absl::UnknownError("not read");
  for (int tries = 0; tries < 100 && !read.ok(); ++tries) {
    read = c.client->ExportStateDict(of_b).status();
    if (!read.ok()) absl::SleepFor(absl::Milliseconds(20));
  }
  EXPECT_THAT(read, IsOk());
  (void)second.Cancel();
}

// An owner's pulls hold their messages in the rank's headroom while they fit there (here
// --memory_headroom holds four pulls' 8 MiB); its others take them from the budget (within its
// share). Before, a session's bound alone held (four pulls per trainer): a session declaring
// 4,096 trainers could keep 16,384 pulls unread, each holding 8 MiB outside the budget, and here
// all sixteen opened.
TEST(PullHeadroomTest, AnOwnersPullsHoldTheirMessagesInTheHeadroomWhileTheyFit) {
  // A session of four trainers (sixteen pulls) and 16 MiB of parameters, four messages a pull:
  // 64 MiB of footprint and more, and room for at most three pulls' 8 MiB besides.
  OPTSTEP_ASSERT_OK_AND_ASSIGN(
      testutil::ConnectedServer c,
      testutil::StartConnected({"--memory_budget=88M", "--memory_headroom=32M"}));
  v1::SessionSpec spec = SmallSpec("pulled");
  spec.clear_parameters();
  auto* wide = spec.add_parameters();
  wide->set_name("wide");
  wide->add_shape(4 << 20);
  spec.set_num_trainers(4);
  OPTSTEP_ASSERT_OK_AND_ASSIGN(v1::SessionInfo info, c.client->CreateSession(spec));
  auto stub = v1::OptimizerService::NewStub(testutil::SlowReaderChannel(c.server->address()));
  std::vector<std::unique_ptr<grpc::ClientContext>> contexts;
  std::vector<std::unique_ptr<grpc::ClientReader<v1::PullParametersResponse>>> pulls;
  // Opens a pull of `session` and reads its first message; answers how it ended when it did.
  const auto pull = [&](const std::string& session) -> absl::Status {
    v1::PullParametersRequest request;
    request.set_session_id(session);
    contexts.push_back(std::make_unique<grpc::ClientContext>());
    pulls.push_back(stub->PullParameters(contexts.back().get(), request));
    v1::PullParametersResponse response;
    if (pulls.back()->Read(&response)) return absl::OkStatus();
    const absl::Status ended = FromGrpcStatus(pulls.back()->Finish());
    pulls.pop_back();
    contexts.pop_back();
    return ended;
  };
  absl::Status refused = absl::OkStatus();
  for (int i = 0; i < 16 && refused.ok(); ++i) refused = pull(info.session_id());
  EXPECT_THAT(refused, StatusIs(absl::StatusCode::kResourceExhausted, "PullParameters needs "));
  EXPECT_GE(pulls.size(), 4u) << "the pulls held in the headroom";
  EXPECT_THAT(refused.message(),
              HasSubstr(absl::StrCat("session '", info.session_id(),
                                     "': a message of its parameters in hand and in the "
                                     "transport, held until the stream is read; 64 pulls")));
  // Their places and bytes come back once the server has seen the cancellations.
  for (auto& context : contexts) context->TryCancel();
  for (auto& open : pulls) (void)open->Finish();
  absl::Status read = absl::UnknownError("not read");
  for (int tries = 0; tries < 100 && !read.ok(); ++tries) {
    read = c.client->PullParameters(info.session_id(), DType::kF32).status();
    if (!read.ok()) absl::SleepFor(absl::Milliseconds(20));
  }
  EXPECT_THAT(read, IsOk());
}

// An owner's InitParameters streams stage their values in the rank's headroom four at a time,
// whatever its number of sessions; its others take them from the budget (within its share).
// Before, each of its sessions had four there: an owner of many sessions, each with streams held
// open before their final message, made the rank stage four copies of every session's parameters
// outside the budget.
TEST(InitHeadroomTest, AnOwnerHasFourInitStreamsInTheHeadroomWhateverItsSessions) {
  // Room for the two sessions' footprints (16 MiB each), not for two more copies of one's values.
  testutil::ConnectedServer c;
  std::vector<std::string> sessions;
  ASSERT_NO_FATAL_FAILURE(StartWithTwoWideSessions(c, sessions));
  auto stub = v1::OptimizerService::NewStub(
      grpc::CreateChannel(c.server->address(), grpc::InsecureChannelCredentials()));
  // Four streams to each session: a session's (one trainer), and the owner's places.
  int refused = 0;
  for (const grpc::Status& ended : testutil::StageAndEndInitStreams(
           *stub, {sessions[0], sessions[0], sessions[0], sessions[0], sessions[1], sessions[1],
                   sessions[1], sessions[1]})) {
    if (ended.error_code() != grpc::StatusCode::RESOURCE_EXHAUSTED) continue;
    EXPECT_THAT(ended.error_message(), HasSubstr("values staged until the stream's"));
    ++refused;
  }
  EXPECT_GT(refused, 0) << "the owner staged eight copies of its values, six outside the budget";
  EXPECT_THAT(c.client->CreateSession(SmallSpec("after")).status(), IsOk());
}

// Each ImportStateDict stream stages up to a copy of its session's state until it is applied: a
// session of one trainer has two open on a rank at most (before, any number, each staging).
TEST_F(StreamTransactionTest, ASessionHasTwoImportsOpenAtMost) {
  OPTSTEP_ASSERT_OK_AND_ASSIGN(Entries before, Exported());
  v1::StreamEnd end;
  std::vector<v1::StateDictChunk> changed = ChangedState(before, &end);
  std::vector<v1::StateDictChunk> complete = changed;
  *complete.emplace_back().mutable_end() = end;
  auto stub = v1::CheckpointService::NewStub(channel_);
  grpc::ClientContext contexts[2];
  v1::ImportStateDictResponse responses[2];
  std::vector<std::unique_ptr<grpc::ClientWriter<v1::StateDictChunk>>> open;
  for (int s = 0; s < 2; ++s) {
    open.push_back(stub->ImportStateDict(&contexts[s], &responses[s]));
    ASSERT_TRUE(open.back()->Write(changed[0]));
  }
  const int refused = Refusals(
      open, [&] { return Import(complete); },
      StatusIs(absl::StatusCode::kResourceExhausted,
               "2 state dict uploads of the session are open on this rank already; "
               "nothing was applied"));
  EXPECT_EQ(refused, 1) << "two imports of a session are open at most, and two may";
  EXPECT_THAT(Import(complete), IsOk());  // the slots came back
}

// Each unread pull holds the snapshot of the step it answers while the session steps on: a
// session of one trainer has four open on a rank at most.
TEST_F(StreamTransactionTest, ASessionHasFourPullsPerTrainerOpenAtMost) {
  v1::SessionSpec spec = SmallSpec("pulled");
  spec.clear_parameters();
  auto* wide = spec.add_parameters();
  wide->set_name("wide");
  wide->add_shape(4 << 20);  // 16 MiB of fp32 values: several messages, each beyond a window
  OPTSTEP_ASSERT_OK_AND_ASSIGN(v1::SessionInfo info, client_->CreateSession(spec));
  auto stub = v1::OptimizerService::NewStub(testutil::SlowReaderChannel(server_->address()));
  v1::PullParametersRequest request;
  request.set_session_id(info.session_id());
  v1::PullParametersResponse response;
  std::vector<std::unique_ptr<grpc::ClientContext>> contexts;
  std::vector<std::unique_ptr<grpc::ClientReader<v1::PullParametersResponse>>> open;
  for (int i = 0; i < 4; ++i) {
    contexts.push_back(std::make_unique<grpc::ClientContext>());
    open.push_back(stub->PullParameters(contexts.back().get(), request));
    ASSERT_TRUE(open.back()->Read(&response));
  }
  grpc::ClientContext fifth_context;
  auto fifth = stub->PullParameters(&fifth_context, request);
  while (fifth->Read(&response)) {
  }
  EXPECT_THAT(FromGrpcStatus(fifth->Finish()),
              StatusIs(absl::StatusCode::kResourceExhausted,
                       absl::StrCat("PullParameters: 4 pulls of session '", info.session_id(),
                                    "' (4 per trainer) are open on this rank already")));
  // A bad request is named as such, also then (before, it was refused for the bound).
  v1::PullParametersRequest bad = request;
  bad.set_dtype(static_cast<v1::DType>(77));
  grpc::ClientContext bad_context;
  auto refused = stub->PullParameters(&bad_context, bad);
  while (refused->Read(&response)) {
  }
  EXPECT_THAT(FromGrpcStatus(refused->Finish()),
              StatusIs(absl::StatusCode::kInvalidArgument, "PullParameters: dtype 77 must be"));
  // A pull read to its end gives its place back at once.
  while (open[0]->Read(&response)) {
  }
  EXPECT_TRUE(open[0]->Finish().ok());
  EXPECT_THAT(client_->PullParameters(info.session_id(), DType::kF32).status(), IsOk());
  for (auto& context : contexts) context->TryCancel();
  for (size_t i = 1; i < open.size(); ++i) (void)open[i]->Finish();
}

}  // namespace
}  // namespace optstep
