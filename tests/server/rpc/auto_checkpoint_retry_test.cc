// The wait between attempts at an automatic checkpoint that keeps failing (a full or broken
// disk): a second after the first failure, doubling with each further one, at most a minute. And
// what a restore leaves of a session's automatic checkpoints.

#include <stdlib.h>

#include <filesystem>
#include <fstream>
#include <string>

#include "absl/time/time.h"
#include "gtest/gtest.h"
#include "server/rpc/auto_checkpoint.h"

namespace optstep {
namespace {

TEST(RetryDelayTest, DoublesWithEachFailureInARowUpToTheMost) {
  const absl::Duration first = absl::Seconds(1);
  const absl::Duration most = absl::Minutes(1);
  EXPECT_EQ(RetryDelay(first, most, 1), absl::Seconds(1));
  EXPECT_EQ(RetryDelay(first, most, 2), absl::Seconds(2));
  EXPECT_EQ(RetryDelay(first, most, 3), absl::Seconds(4));
  EXPECT_EQ(RetryDelay(first, most, 6), absl::Seconds(32));
  EXPECT_EQ(RetryDelay(first, most, 7), most);
  EXPECT_EQ(RetryDelay(first, most, 1000000), most);  // no overflow after days of failures
  EXPECT_EQ(RetryDelay(absl::Seconds(90), most, 1), most);
}

// A restore that fell back past newer automatic checkpoints (they failed to load for a passing
// reason) removes them: they belong to the timeline the group left. Before, they stayed, and one
// passed for the new timeline's save of its step, restored over everything stepped since.
TEST(AutoCheckpointRestoredTest, TheCheckpointsARestorePassedOverAreRemoved) {
  namespace fs = std::filesystem;
  char dir[] = "/tmp/optstep-restored-XXXXXX";
  ASSERT_NE(mkdtemp(dir), nullptr);
  const fs::path root(dir);
  const fs::path session = root / "auto" / "s1";
  for (const char* name : {"step-3", "step-5", "step-7", ".step-9.unusable"}) {
    fs::create_directories(session / name);
    std::ofstream(session / name / "manifest.json") << "{}";
  }
  AutoCheckpointOptions options;
  options.checkpoint_root = root.string();
  AutoCheckpointer checkpointer(options, nullptr, nullptr);
  checkpointer.Restored("s1", 5);
  EXPECT_TRUE(fs::exists(session / "step-3"));
  EXPECT_TRUE(fs::exists(session / "step-5"));
  EXPECT_FALSE(fs::exists(session / "step-7"));
  EXPECT_TRUE(fs::exists(session / ".step-9.unusable")) << "set aside for an operator";
  fs::remove_all(root);
}

}  // namespace
}  // namespace optstep
