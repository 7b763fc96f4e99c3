#include "server/rpc/live_step_streams.h"

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/status_matchers.h"

namespace optstep {
namespace {

using ::optstep::testutil::IsOk;
using ::optstep::testutil::StatusIs;
using ::testing::ElementsAre;
using ::testing::IsEmpty;

// Records why it was ended; removes itself from the registry on its end, as a Step stream does
// in OnDone.
class RecordingStream final : public LiveStepStreams::Stream {
 public:
  explicit RecordingStream(LiveStepStreams* streams) : streams_(streams) {}
  bool EndUnavailable(absl::string_view why) override {
    if (!ended.empty()) return false;  // ended already
    ended.emplace_back(why);
    streams_->Remove(this);
    return true;
  }
  std::vector<std::string> ended;

 private:
  LiveStepStreams* const streams_;
};

// A new stream of `caller`, added to `streams`.
std::shared_ptr<RecordingStream> AddedTo(LiveStepStreams& streams,
                                         const std::string& caller = "peer ipv4:10.0.0.7") {
  auto stream = std::make_shared<RecordingStream>(&streams);
  EXPECT_THAT(streams.Add(stream, caller), IsOk());
  return stream;
}

TEST(LiveStepStreamsTest, EndsEveryOpenStreamOnce) {
  LiveStepStreams streams;
  auto first = AddedTo(streams);
  auto second = AddedTo(streams);
  EXPECT_EQ(streams.EndAll("rank 2 shut down"), 2);
  EXPECT_THAT(first->ended, ElementsAre("rank 2 shut down"));
  EXPECT_THAT(second->ended, ElementsAre("rank 2 shut down"));
  // Each removed itself: a second shutdown finds none.
  EXPECT_EQ(streams.EndAll("again"), 0);
  EXPECT_THAT(first->ended, ElementsAre("rank 2 shut down"));
}

TEST(LiveStepStreamsTest, CountsOnlyTheStreamsItEnded) {
  LiveStepStreams streams;
  auto open = AddedTo(streams);
  auto ending = AddedTo(streams);
  ending->ended.emplace_back("its own end");  // ended, its OnDone not yet run
  EXPECT_EQ(streams.EndAll("shutting down"), 1);
  EXPECT_THAT(open->ended, ElementsAre("shutting down"));
  EXPECT_THAT(ending->ended, ElementsAre("its own end"));
}

TEST(LiveStepStreamsTest, RefusesStreamsOpenedAfterTheEnd) {
  LiveStepStreams streams;
  auto early = std::make_shared<RecordingStream>(&streams);
  EXPECT_THAT(streams.Add(early, "caller 'a'"), IsOk());
  streams.EndAll("shutting down");
  auto late = std::make_shared<RecordingStream>(&streams);
  EXPECT_THAT(streams.Add(late, "caller 'a'"),
              StatusIs(absl::StatusCode::kUnavailable, "shutting down"));
  EXPECT_EQ(streams.EndAll("again"), 0);
  EXPECT_THAT(late->ended, IsEmpty());
}

TEST(LiveStepStreamsTest, SkipsRemovedAndDestroyedStreams) {
  LiveStepStreams streams;
  auto removed = AddedTo(streams);
  auto open = AddedTo(streams);
  AddedTo(streams);  // gone before its Remove
  streams.Remove(removed.get());
  EXPECT_EQ(streams.EndAll("shutting down"), 1);
  EXPECT_THAT(removed->ended, IsEmpty());
  EXPECT_THAT(open->ended, ElementsAre("shutting down"));
}

// Streams that sent no header name no session: each caller has at most the bound of them open.
// Before, one caller could open any number, each holding its window and one message.
TEST(LiveStepStreamsTest, ACallerHasAtMostItsBoundOfStreamsWithoutAHeader) {
  LiveStepStreams streams(/*max_headerless_per_caller=*/2);
  auto first = AddedTo(streams, "peer ipv4:10.0.0.7");
  auto second = AddedTo(streams, "peer ipv4:10.0.0.7");
  auto refused = std::make_shared<RecordingStream>(&streams);
  EXPECT_THAT(streams.Add(refused, "peer ipv4:10.0.0.7"),
              StatusIs(absl::StatusCode::kResourceExhausted,
                       "step stream: peer ipv4:10.0.0.7 has 2 Step streams open on this rank "
                       "that sent no StepHeader yet, the most one caller may"));
  EXPECT_EQ(streams.headerless("peer ipv4:10.0.0.7"), 2);
  // Another caller has a bound of its own.
  auto other = AddedTo(streams, "caller 'bob'");
  // A stream that sent its header counts no more, and stays open (a shutdown ends it).
  streams.Named(first.get());
  streams.Named(first.get());  // once only
  EXPECT_EQ(streams.headerless("peer ipv4:10.0.0.7"), 1);
  auto third = AddedTo(streams, "peer ipv4:10.0.0.7");
  // A stream that ends before its header gives its place back.
  streams.Remove(second.get());
  streams.Remove(third.get());
  EXPECT_EQ(streams.headerless("peer ipv4:10.0.0.7"), 0);
  streams.Remove(first.get());  // named: nothing more to count
  EXPECT_EQ(streams.headerless("peer ipv4:10.0.0.7"), 0);
  EXPECT_EQ(streams.headerless("caller 'bob'"), 1);
  EXPECT_EQ(streams.EndAll("shutting down"), 1);
  EXPECT_THAT(other->ended, ElementsAre("shutting down"));
}

}  // namespace
}  // namespace optstep
