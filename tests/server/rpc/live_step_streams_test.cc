#include "server/rpc/live_step_streams.h"

#include <memory>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace optstep {
namespace {

using ::testing::ElementsAre;
using ::testing::IsEmpty;

// Records why it was ended; removes itself from the registry on its end, as a Step stream does
// in OnDone.
class RecordingStream final : public LiveStepStreams::Stream {
 public:
  explicit RecordingStream(LiveStepStreams* streams) : streams_(streams) {}
  void EndUnavailable(absl::string_view why) override {
    ended.emplace_back(why);
    streams_->Remove(this);
  }
  std::vector<std::string> ended;

 private:
  LiveStepStreams* const streams_;
};

TEST(LiveStepStreamsTest, EndsEveryOpenStreamOnce) {
  LiveStepStreams streams;
  auto first = std::make_shared<RecordingStream>(&streams);
  auto second = std::make_shared<RecordingStream>(&streams);
  streams.Add(first);
  streams.Add(second);
  EXPECT_EQ(streams.EndAll("rank 2 shut down"), 2);
  EXPECT_THAT(first->ended, ElementsAre("rank 2 shut down"));
  EXPECT_THAT(second->ended, ElementsAre("rank 2 shut down"));
  // Each removed itself: a second shutdown finds none.
  EXPECT_EQ(streams.EndAll("again"), 0);
  EXPECT_THAT(first->ended, ElementsAre("rank 2 shut down"));
}

TEST(LiveStepStreamsTest, SkipsRemovedAndDestroyedStreams) {
  LiveStepStreams streams;
  auto removed = std::make_shared<RecordingStream>(&streams);
  auto open = std::make_shared<RecordingStream>(&streams);
  streams.Add(removed);
  streams.Add(open);
  streams.Add(std::make_shared<RecordingStream>(&streams));  // gone before its Remove
  streams.Remove(removed.get());
  EXPECT_EQ(streams.EndAll("shutting down"), 1);
  EXPECT_THAT(removed->ended, IsEmpty());
  EXPECT_THAT(open->ended, ElementsAre("shutting down"));
}

}  // namespace
}  // namespace optstep
