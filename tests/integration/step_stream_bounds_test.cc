// What Step streams can make a rank hold. A trainer that committed its part of a step, which
// waits for the step's other trainer, and goes on sending: the rank ends the stream at its first
// message after the commit. Each write completes only once the rank's HTTP/2 window for the stream
// takes it, so the bytes of the writes that complete bound what the rank buffered for the stream.
// Before, the rank read nothing after the commit, and the stream held its window (16 MiB; 256 MiB
// before that, when 64 writes of 4 MiB completed) for as long as the step waited.

#include <grpcpp/grpcpp.h>

#include <algorithm>
#include <atomic>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "client/cpp/client.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "optstep/v1/optimizer_service.grpc.pb.h"
#include "tests/integration/test_session.h"
#include "tests/testing/status_matchers.h"

namespace optstep {
namespace {

using ::testing::AnyOf;
using ::testing::HasSubstr;

constexpr int kElements = 1 << 20;  // 4 MiB of fp32 values per chunk

// A session of one 4 MiB parameter with `trainers` trainers on a rank of its own, and a stub.
class StepStreamBoundsTest : public testing::Test {
 protected:
  void StartSession(int trainers, std::vector<std::string> flags = {},
                    v1::GradientMode mode = v1::GRADIENT_MODE_SHARDED) {
    OPTSTEP_ASSERT_OK_AND_ASSIGN(c_, testutil::StartConnected(std::move(flags)));
    v1::SessionSpec spec;
    spec.set_name("waits");
    auto* p = spec.add_parameters();
    p->set_name("wide.weight");
    p->add_shape(kElements);
    spec.set_num_trainers(trainers);
    spec.set_gradient_mode(mode);
    spec.mutable_optimizer()->set_preset("adam");
    OPTSTEP_ASSERT_OK_AND_ASSIGN(v1::SessionInfo info, c_.client->CreateSession(spec));
    session_ = info.session_id();
    stub_ = v1::OptimizerService::NewStub(
        grpc::CreateChannel(c_.server->address(), grpc::InsecureChannelCredentials()));
  }

  // Trainer 0's header of step 1.
  v1::StepRequest Header() const {
    v1::StepRequest request;
    request.mutable_header()->set_session_id(session_);
    request.mutable_header()->set_step(1);
    request.mutable_header()->set_trainer_id(0);
    return request;
  }

  testutil::ConnectedServer c_;
  std::string session_;
  std::unique_ptr<v1::OptimizerService::Stub> stub_;
};

TEST_F(StepStreamBoundsTest, AMessageAfterTheCommitEndsTheStream) {
  ASSERT_NO_FATAL_FAILURE(StartSession(2));
  grpc::ClientContext context;
  context.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(10)));
  auto stream = stub_->Step(&context);
  ASSERT_TRUE(stream->Write(Header()));
  v1::StepRequest request;
  request.mutable_commit()->set_num_elements(0);
  ASSERT_TRUE(stream->Write(request));
  // The step waits for trainer 1, and the trainer sends on.
  request.Clear();
  v1::TensorChunk* gradient = request.mutable_gradient();
  gradient->set_param_id(0);
  gradient->set_dtype(v1::DTYPE_FP32);
  gradient->mutable_data()->assign(size_t{kElements} * 4, '\0');
  std::atomic<int> written{0};
  std::thread writer([&] {
    while (stream->Write(request)) ++written;
  });
  // The rank ends the stream at once: the writer's writes fail from then on. (Before, a write
  // beyond the window never completed, and the stream ended at its deadline.)
  writer.join();
  const int taken = written.load();
  v1::StepResponse response;
  while (stream->Read(&response)) {
  }
  const grpc::Status ended = stream->Finish();
  EXPECT_EQ(ended.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << ended.error_message();
  EXPECT_THAT(ended.error_message(),
              HasSubstr("a message after the StepCommit of step 1 (one step per stream); the "
                        "commit stands"));
  // The message the rank read, and what the transport took meanwhile.
  EXPECT_LE(taken, 5) << "the rank took " << taken * 4 << " MiB of a stream after its commit";
}

// Step streams that trainers open and leave open, each of which the rank may hold up to its
// window for. Before, there was no limit; now each trainer of a session has four open on a rank
// at most, and the others are refused RESOURCE_EXHAUSTED naming the limit. Which ones is up to
// the order the rank reads the headers in, so the tests count: every stream has a deadline, an
// open one ends at it, a refused one at once.
class StepStreamCapTest : public StepStreamBoundsTest {
 protected:
  struct Ends {
    int open = 0;
    int refused = 0;
  };

  // Opens a stream for each of `trainers` (trainer ids) with a header of step 1, leaves them
  // open for five seconds, and counts how each trainer's ended.
  std::vector<Ends> OpenAndCount(const std::vector<int>& trainers) {
    struct Call {
      grpc::ClientContext context;
      std::unique_ptr<grpc::ClientReaderWriter<v1::StepRequest, v1::StepResponse>> stream;
    };
    const int streams = static_cast<int>(trainers.size());
    std::vector<Call> calls(streams);
    const absl::Time deadline = absl::Now() + absl::Seconds(5);
    for (int i = 0; i < streams; ++i) {
      calls[i].context.set_deadline(absl::ToChronoTime(deadline));
      calls[i].stream = stub_->Step(&calls[i].context);
      v1::StepRequest header = Header();
      header.mutable_header()->set_trainer_id(trainers[i]);
      EXPECT_TRUE(calls[i].stream->Write(header));
    }
    // Each stream's end read on a thread of its own: a status that came before the deadline is
    // taken before it.
    std::vector<grpc::Status> ended(streams);
    std::vector<std::thread> readers;
    for (int i = 0; i < streams; ++i) {
      readers.emplace_back([&call = calls[i], &status = ended[i]] {
        v1::StepResponse response;
        while (call.stream->Read(&response)) {
        }
        status = call.stream->Finish();
      });
    }
    for (std::thread& reader : readers) reader.join();
    std::vector<Ends> ends(*std::max_element(trainers.begin(), trainers.end()) + 1);
    for (int i = 0; i < streams; ++i) {
      const grpc::Status& status = ended[i];
      if (status.error_code() == grpc::StatusCode::RESOURCE_EXHAUSTED) {
        ++ends[trainers[i]].refused;
        EXPECT_THAT(status.error_message(),
                    HasSubstr(absl::StrCat("4 Step streams of trainer ", trainers[i],
                                           " of session '", session_, "' are open")));
      } else {
        EXPECT_EQ(status.error_code(), grpc::StatusCode::DEADLINE_EXCEEDED)
            << status.error_message();
        ++ends[trainers[i]].open;
      }
    }
    return ends;
  }
};

TEST_F(StepStreamCapTest, ATrainerHasFourStepStreamsOpenAtMost) {
  ASSERT_NO_FATAL_FAILURE(StartSession(1));
  const std::vector<Ends> ends = OpenAndCount(std::vector<int>(8, 0));
  EXPECT_EQ(ends[0].open, 4);
  EXPECT_EQ(ends[0].refused, 4);
}

// The cap counts per trainer: one whose streams linger takes no slot of its session's other
// trainers. Before, the session had four per trainer in all, and trainer 0's eight streams left
// none for trainer 1.
TEST_F(StepStreamCapTest, ATrainerWhoseStreamsLingerLeavesTheOthersTheirs) {
  ASSERT_NO_FATAL_FAILURE(StartSession(2));
  std::vector<int> trainers(8, 0);
  trainers.push_back(1);
  const std::vector<Ends> ends = OpenAndCount(trainers);
  EXPECT_EQ(ends[0].open, 4);
  EXPECT_EQ(ends[0].refused, 4);
  EXPECT_EQ(ends[1].open, 1);
  EXPECT_EQ(ends[1].refused, 0);
}

// A trainer whose streams break after its commit redoes the step on a new stream each time, and
// may leave the old ones half-open on the rank. Each retry's commit ends the streams it replaces
// (ABORTED), so that they hold no slot: before, they waited for the step, and the fifth retry was
// refused RESOURCE_EXHAUSTED.
TEST_F(StepStreamCapTest, ARetryEndsTheStreamsItReplaces) {
  ASSERT_NO_FATAL_FAILURE(StartSession(2));  // the step waits for trainer 1 throughout
  struct Call {
    grpc::ClientContext context;
    std::unique_ptr<grpc::ClientReaderWriter<v1::StepRequest, v1::StepResponse>> stream;
  };
  constexpr int kAttempts = 6;
  std::vector<Call> calls(kAttempts);
  v1::StepRequest commit;
  commit.mutable_commit()->set_num_elements(0);
  for (int i = 0; i < kAttempts; ++i) {
    calls[i].context.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(5)));
    calls[i].stream = stub_->Step(&calls[i].context);
    ASSERT_TRUE(calls[i].stream->Write(Header()));
    ASSERT_TRUE(calls[i].stream->Write(commit));
    // The commit reaches the rank before the next attempt's header, as a trainer's redo follows
    // a broken stream (were the header first, the older attempt would be superseded uncommitted,
    // which ends it too).
    absl::SleepFor(absl::Milliseconds(200));
    if (i == 0) continue;
    v1::StepResponse response;
    while (calls[i - 1].stream->Read(&response)) {
    }
    const grpc::Status replaced = calls[i - 1].stream->Finish();
    EXPECT_EQ(replaced.error_code(), grpc::StatusCode::ABORTED)
        << "attempt " << i - 1 << ": " << replaced.error_message();
    EXPECT_THAT(replaced.error_message(),
                AnyOf(HasSubstr("a newer stream of the trainer waits"), HasSubstr("superseded")));
  }
  calls.back().context.TryCancel();
  v1::StepResponse response;
  while (calls.back().stream->Read(&response)) {
  }
  EXPECT_EQ(calls.back().stream->Finish().error_code(), grpc::StatusCode::CANCELLED);
}

// A gradient of REPLICATED mode waits for the trainers before it (they are summed in trainer
// order), and its stream reads nothing meanwhile: each such stream may make the rank hold its
// window and a message for as long as those trainers take. An owner has eight of them in the
// rank's headroom; its others take those bytes from the budget, or end RESOURCE_EXHAUSTED.
// Before, a session of thousands of trainers made the rank hold a window for each, outside every
// budget. Trainer 0 sends nothing here, so that trainers 1-9 all wait.
TEST_F(StepStreamCapTest, StreamsWaitingForTheirTurnTakeWhatTheyHoldFromTheBudget) {
  // Room for the session (16 MiB), not for a window beside it.
  ASSERT_NO_FATAL_FAILURE(StartSession(10, {"--memory_budget=24M"}, v1::GRADIENT_MODE_REPLICATED));
  struct Call {
    grpc::ClientContext context;
    std::unique_ptr<grpc::ClientReaderWriter<v1::StepRequest, v1::StepResponse>> stream;
    grpc::Status ended;
  };
  constexpr int kWaiting = 9;
  std::vector<Call> calls(kWaiting);
  v1::StepRequest gradient;
  gradient.mutable_gradient()->set_param_id(0);
  gradient.mutable_gradient()->set_dtype(v1::DTYPE_FP32);
  gradient.mutable_gradient()->mutable_data()->assign(4096, '\0');
  const absl::Time deadline = absl::Now() + absl::Seconds(5);
  for (int i = 0; i < kWaiting; ++i) {
    calls[i].context.set_deadline(absl::ToChronoTime(deadline));
    calls[i].stream = stub_->Step(&calls[i].context);
    v1::StepRequest header = Header();
    header.mutable_header()->set_trainer_id(i + 1);
    EXPECT_TRUE(calls[i].stream->Write(header));
    EXPECT_TRUE(calls[i].stream->Write(gradient));
  }
  std::vector<std::thread> readers;
  for (Call& call : calls) {
    readers.emplace_back([&call] {
      v1::StepResponse response;
      while (call.stream->Read(&response)) {
      }
      call.ended = call.stream->Finish();
    });
  }
  for (std::thread& reader : readers) reader.join();
  int refused = 0;
  for (const Call& call : calls) {
    if (call.ended.error_code() == grpc::StatusCode::RESOURCE_EXHAUSTED) {
      EXPECT_THAT(call.ended.error_message(),
                  HasSubstr("its window and a message, held while its gradients wait for the "
                            "trainers before it"));
      ++refused;
    } else {
      EXPECT_EQ(call.ended.error_code(), grpc::StatusCode::DEADLINE_EXCEEDED)
          << call.ended.error_message();
    }
  }
  EXPECT_EQ(refused, 1) << "eight streams wait in the headroom, and the budget has no window";
}

// A trainer id the session does not declare is refused as such, before it is counted: with the
// session's four slots taken, it is still INVALID_ARGUMENT, not RESOURCE_EXHAUSTED.
TEST_F(StepStreamCapTest, ATrainerIdOutOfRangeIsRefused) {
  ASSERT_NO_FATAL_FAILURE(StartSession(1));
  struct Call {
    grpc::ClientContext context;
    std::unique_ptr<grpc::ClientReaderWriter<v1::StepRequest, v1::StepResponse>> stream;
  };
  std::vector<Call> open(4);
  for (Call& call : open) {
    call.context.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(10)));
    call.stream = stub_->Step(&call.context);
    ASSERT_TRUE(call.stream->Write(Header()));
  }
  absl::SleepFor(absl::Milliseconds(300));  // the rank has read their headers
  grpc::ClientContext context;
  auto stream = stub_->Step(&context);
  v1::StepRequest header = Header();
  header.mutable_header()->set_trainer_id(3);
  ASSERT_TRUE(stream->Write(header));
  v1::StepResponse response;
  while (stream->Read(&response)) {
  }
  const grpc::Status status = stream->Finish();
  EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << status.error_message();
  EXPECT_THAT(status.error_message(),
              HasSubstr("trainer_id 3 out of range: session '" + session_ + "' declares 1"));
  for (Call& call : open) call.context.TryCancel();
}

// Streams that have sent no header name no session, so no session's cap counts them: each caller
// (without authentication, each host) has at most --max_headerless_step_streams of them open.
// Before, one caller could open any number, each holding its window and one message.
TEST_F(StepStreamCapTest, ACallerHasItsBoundOfStreamsBeforeTheirHeader) {
  ASSERT_NO_FATAL_FAILURE(StartSession(1, {"--max_headerless_step_streams=3"}));
  struct Call {
    grpc::ClientContext context;
    std::unique_ptr<grpc::ClientReaderWriter<v1::StepRequest, v1::StepResponse>> stream;
    grpc::Status End() {
      v1::StepResponse response;
      while (stream->Read(&response)) {
      }
      return stream->Finish();
    }
  };
  const auto open = [this](Call& call) {
    call.context.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(10)));
    call.stream = stub_->Step(&call.context);
    absl::SleepFor(absl::Milliseconds(100));  // the rank has started its reactor
  };
  std::vector<Call> silent(3);
  for (Call& call : silent) open(call);
  Call refused;
  open(refused);
  const grpc::Status status = refused.End();
  EXPECT_EQ(status.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED) << status.error_message();
  EXPECT_THAT(status.error_message(),
              HasSubstr("peer ipv4:127.0.0.1 has 3 Step streams open on this rank that sent no "
                        "StepHeader yet"));
  // One sends its header: its place goes to the next stream, which steps.
  ASSERT_TRUE(silent[0].stream->Write(Header()));
  absl::SleepFor(absl::Milliseconds(300));
  Call next;
  open(next);
  ASSERT_TRUE(next.stream->Write(Header()));
  absl::SleepFor(absl::Milliseconds(300));
  next.context.TryCancel();
  EXPECT_EQ(next.End().error_code(), grpc::StatusCode::CANCELLED) << "it was not refused";
  for (Call& call : silent) call.context.TryCancel();
}

}  // namespace
}  // namespace optstep
