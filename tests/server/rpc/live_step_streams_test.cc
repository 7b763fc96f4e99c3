#include "server/rpc/live_step_streams.h"

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace optstep {
namespace {

using ::testing::ElementsAre;
using ::testing::IsEmpty;
using ::testing::Optional;

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

// A new stream of `streams`, added to it.
std::shared_ptr<RecordingStream> AddedTo(LiveStepStreams& streams) {
  auto stream = std::make_shared<RecordingStream>(&streams);
  streams.Add(stream);
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
  EXPECT_EQ(streams.Add(early), std::nullopt);
  streams.EndAll("shutting down");
  auto late = std::make_shared<RecordingStream>(&streams);
  EXPECT_THAT(streams.Add(late), Optional(std::string("shutting down")));
  EXPECT_EQ(streams.EndAll("again"), 0);
  EXPECT_THAT(late->ended, IsEmpty());
}

TEST(LiveStepStreamsTest, SkipsRemovedAndDestroyedStreams) {
  LiveStepStreams streams;
  auto removed = AddedTo(streams);
  auto open = AddedTo(streams);
  streams.Add(std::make_shared<RecordingStream>(&streams));  // gone before its Remove
  streams.Remove(removed.get());
  EXPECT_EQ(streams.EndAll("shutting down"), 1);
  EXPECT_THAT(removed->ended, IsEmpty());
  EXPECT_THAT(open->ended, ElementsAre("shutting down"));
}

}  // namespace
}  // namespace optstep
