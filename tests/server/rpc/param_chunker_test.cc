#include "server/rpc/param_chunker.h"

#include <memory>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "optstep/v1/optimizer_service.pb.h"
#include "tests/testing/status_matchers.h"

namespace optstep {
namespace {

using ::optstep::testutil::IsOk;
using ::optstep::testutil::StatusIs;
using Progress = ParamChunker::Progress;

// Three fp32 parameters of 3, 1 and 2 elements, filled with their id.
std::shared_ptr<ParamSnapshot> Snapshot(bool streaming) {
  auto snapshot = std::make_shared<ParamSnapshot>();
  snapshot->step = 4;
  for (int id : {0, 1, 2}) {
    snapshot->values.push_back(std::string(4 * (id == 0 ? 3 : id == 1 ? 1 : 2), 'a' + id));
  }
  if (streaming) snapshot->readiness = std::make_shared<ParamReadiness>();
  return snapshot;
}

// Parses a chunk message; answers "param_id@offset:bytes".
std::string Describe(grpc::ByteBuffer& message) {
  std::vector<grpc::Slice> slices;
  EXPECT_TRUE(message.Dump(&slices).ok());
  std::string wire;
  for (const grpc::Slice& s : slices)
    wire.append(reinterpret_cast<const char*>(s.begin()), s.size());
  v1::StepResponse response;
  EXPECT_TRUE(response.ParseFromString(wire));
  const v1::TensorChunk& chunk = response.parameter();
  return std::to_string(chunk.param_id()) + "@" + std::to_string(chunk.offset()) + ":" +
         chunk.data();
}

TEST(ParamChunkerTest, CompleteSnapshotGoesInTheOrderAskedForOnce) {
  // 8-byte chunks: two elements each.
  ParamChunker chunker(Snapshot(false), {2, 0, 2}, 8);
  EXPECT_EQ(chunker.num_chunks(), 3u);
  std::vector<std::string> sent;
  grpc::ByteBuffer message;
  size_t bytes = 0;
  absl::StatusOr<Progress> next;
  while ((next = chunker.NextStepResponse(&message, &bytes, nullptr)).ok() &&
         *next == Progress::kChunk) {
    sent.push_back(Describe(message));
  }
  ASSERT_TRUE(next.ok());
  EXPECT_EQ(*next, Progress::kDone);
  EXPECT_THAT(sent, ::testing::ElementsAre("2@0:cccccccc", "0@0:aaaaaaaa", "0@2:aaaa"));
}

TEST(ParamChunkerTest, StreamingSnapshotFollowsReadinessAndWakesTheStream) {
  std::shared_ptr<ParamSnapshot> snapshot = Snapshot(true);
  ParamChunker chunker(snapshot, {}, 8);
  EXPECT_EQ(chunker.num_chunks(), 4u);
  grpc::ByteBuffer message;
  size_t bytes = 0;
  int wakes = 0;
  auto wake = [&wakes] { ++wakes; };
  auto next = chunker.NextStepResponse(&message, &bytes, wake);
  ASSERT_TRUE(next.ok());
  EXPECT_EQ(*next, Progress::kWaiting);
  EXPECT_EQ(wakes, 0);

  snapshot->readiness->MarkReady({1});
  EXPECT_EQ(wakes, 1);
  next = chunker.NextStepResponse(&message, &bytes, wake);
  ASSERT_TRUE(next.ok());
  ASSERT_EQ(*next, Progress::kChunk);
  EXPECT_EQ(Describe(message), "1@0:bbbb");
  EXPECT_EQ(bytes, 4u);
  EXPECT_EQ(*chunker.NextStepResponse(&message, &bytes, wake), Progress::kWaiting);

  snapshot->readiness->MarkReady({2, 0});
  std::vector<std::string> sent;
  while (*(next = chunker.NextStepResponse(&message, &bytes, wake)) == Progress::kChunk) {
    sent.push_back(Describe(message));
  }
  EXPECT_THAT(sent, ::testing::ElementsAre("2@0:cccccccc", "0@0:aaaaaaaa", "0@2:aaaa"));
  // Every parameter is out, but the stream ends only once the step ended on this rank: its
  // all-gather may still fail, and the trainer must then redo the step.
  EXPECT_EQ(*next, Progress::kWaiting);
  const int before_end = wakes;
  snapshot->readiness->End();
  EXPECT_GT(wakes, before_end);
  EXPECT_EQ(*chunker.NextStepResponse(&message, &bytes, wake), Progress::kDone);
}

TEST(ParamChunkerTest, AStepThatFailsAfterEveryParameterWentOutEndsWithItsError) {
  std::shared_ptr<ParamSnapshot> snapshot = Snapshot(true);
  ParamChunker chunker(snapshot, {1}, 64);
  snapshot->readiness->MarkReady({1});
  grpc::ByteBuffer message;
  size_t bytes = 0;
  ASSERT_EQ(*chunker.NextStepResponse(&message, &bytes, nullptr), Progress::kChunk);
  EXPECT_EQ(*chunker.NextStepResponse(&message, &bytes, nullptr), Progress::kWaiting);
  snapshot->readiness->Fail(absl::UnavailableError("rank 1 lost a peer during the all-gather"));
  EXPECT_THAT(chunker.NextStepResponse(&message, &bytes, nullptr).status(),
              StatusIs(absl::StatusCode::kUnavailable, "lost a peer"));
}

// A snapshot its session let go (held beyond its headroom after the session stepped on, with no
// room in the budget: SnapshotRetention) ends the streams that still send from it.
TEST(ParamChunkerTest, ASnapshotLetGoEndsItsStreams) {
  std::shared_ptr<ParamSnapshot> snapshot = Snapshot(false);
  ParamChunker chunker(snapshot, {}, 8);
  grpc::ByteBuffer message;
  size_t bytes = 0;
  ASSERT_EQ(*chunker.NextStepResponse(&message, &bytes, nullptr), Progress::kChunk);
  EXPECT_THAT(chunker.CheckHeld(), IsOk());
  snapshot->hold->Revoke(absl::ResourceExhaustedError("the parameters of step 1 were let go"));
  EXPECT_THAT(chunker.CheckHeld(), StatusIs(absl::StatusCode::kResourceExhausted, "let go"));
  EXPECT_THAT(chunker.NextStepResponse(&message, &bytes, nullptr).status(),
              StatusIs(absl::StatusCode::kResourceExhausted, "let go"));
}

TEST(ParamChunkerTest, StreamingOnlySendsTheParametersAskedFor) {
  std::shared_ptr<ParamSnapshot> snapshot = Snapshot(true);
  ParamChunker chunker(snapshot, {0}, 16);
  snapshot->readiness->MarkReady({1, 2, 0});
  snapshot->readiness->End();
  grpc::ByteBuffer message;
  size_t bytes = 0;
  ASSERT_EQ(*chunker.NextStepResponse(&message, &bytes, nullptr), Progress::kChunk);
  EXPECT_EQ(Describe(message), "0@0:aaaaaaaaaaaa");
  EXPECT_EQ(*chunker.NextStepResponse(&message, &bytes, nullptr), Progress::kDone);
}

TEST(ParamChunkerTest, AFailedStepEndsTheStreamWithItsError) {
  std::shared_ptr<ParamSnapshot> snapshot = Snapshot(true);
  ParamChunker chunker(snapshot, {}, 8);
  grpc::ByteBuffer message;
  size_t bytes = 0;
  bool woken = false;
  EXPECT_EQ(*chunker.NextStepResponse(&message, &bytes, [&] { woken = true; }), Progress::kWaiting);
  snapshot->readiness->Fail(absl::UnavailableError("rank 1 lost a peer during the all-gather"));
  EXPECT_TRUE(woken);
  EXPECT_THAT(chunker.NextStepResponse(&message, &bytes, nullptr).status(),
              StatusIs(absl::StatusCode::kUnavailable, "lost a peer"));
}

TEST(ParamChunkerTest, ACompletedStreamedSnapshotServesPullsInReadyOrder) {
  std::shared_ptr<ParamSnapshot> snapshot = Snapshot(true);
  snapshot->readiness->MarkReady({2, 1, 0});
  ParamChunker chunker(snapshot, {}, 64);
  v1::TensorChunk chunk;
  std::vector<uint32_t> ids;
  while (chunker.Next(&chunk)) ids.push_back(chunk.param_id());
  EXPECT_THAT(ids, ::testing::ElementsAre(2u, 1u, 0u));
}

}  // namespace
}  // namespace optstep
