// The automatic restore from checkpoints saved through the real services
// (checkpoint_save_fixture.h): a load or a read that fails for a passing reason is tried again, one
// that still fails ends the restore for a restart with every checkpoint kept, one that finds damage
// falls back.

#include <filesystem>
#include <fstream>
#include <functional>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/server/rpc/checkpoint_save_fixture.h"

namespace optstep {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using testutil::DirectoryEntries;

// A load that fails for a passing reason (a busy disk or peer) is tried again: neither given up
// for the older checkpoint nor set aside.
TEST_F(CheckpointSaveTest, ARestoreTriesALoadThatFailedForAPassingReasonAgain) {
  std::filesystem::path dir;
  const std::vector<RestoredSession> restored =
      RestoreWithTheFirstLoadFailing(absl::UnavailableError("injected: the disk is busy"), dir);
  ASSERT_EQ(restored.size(), 1u);
  EXPECT_EQ(restored[0].from, absl::StrCat("auto/", session_, "/step-2"));
  EXPECT_THAT(DirectoryEntries(dir.string()), ElementsAre("session.json", "step-1", "step-2"));
}

TEST_F(CheckpointSaveTest, ARestoreFallsBackFromACheckpointThatIsDamaged) {
  std::filesystem::path dir;
  const std::vector<RestoredSession> restored =
      RestoreWithTheFirstLoadFailing(absl::DataLossError("injected: the shard is damaged"), dir);
  ASSERT_EQ(restored.size(), 1u);
  EXPECT_EQ(restored[0].from, absl::StrCat("auto/", session_, "/step-1"));
  EXPECT_THAT(DirectoryEntries(dir.string()),
              ElementsAre(".step-2.unusable", "session.json", "step-1"));
}

// A read that fails for a passing reason (EIO, an NFS pause) is tried again. Before, the session
// was left out at once when its record did not read, and restored from the older checkpoint when
// the newest manifest did not (its listing left the newest out, which was then removed).
TEST_F(CheckpointSaveTest, ARestoreTriesASessionRecordThatDidNotReadAgain) {
  const std::vector<RestoredSession> restored = RestoreWithReadsBroken("session.json", 2);
  ASSERT_EQ(restored.size(), 1u);
  EXPECT_EQ(restored[0].from, absl::StrCat("auto/", session_, "/step-2"));
}

TEST_F(CheckpointSaveTest, ARestoreTriesAManifestThatDidNotReadAgain) {
  const std::vector<RestoredSession> restored = RestoreWithReadsBroken("step-2/manifest.json", 2);
  ASSERT_EQ(restored.size(), 1u);
  EXPECT_EQ(restored[0].from, absl::StrCat("auto/", session_, "/step-2"));
}

// The manifests of older checkpoints are read only when the newer did not load: one that does not
// read is no reason to end the restore (before this release's listing, it was left out; with a
// listing that read every manifest, it ended every restore).
TEST_F(CheckpointSaveTest, ARestoreReadsNoManifestOlderThanTheCheckpointItLoads) {
  const std::filesystem::path dir = SaveTwiceAsAutomaticCheckpoints();
  ASSERT_FALSE(dir.empty());
  std::function<void()> put_back = BreakReads(dir / "step-1" / "manifest.json");
  int retries = 0;
  AutoRestoreOptions options = RestoreOptions();
  options.before_retry = [&](const absl::Status&) { ++retries; };
  absl::StatusOr<std::vector<RestoredSession>> restored =
      RestoreAutoCheckpoints(options, group_.get());
  put_back();
  ASSERT_TRUE(restored.ok()) << restored.status();
  ASSERT_EQ(restored->size(), 1u);
  EXPECT_EQ((*restored)[0].from, absl::StrCat("auto/", session_, "/step-2"));
  EXPECT_EQ(retries, 0);
}

// The session's creation on every rank is tried again too when it fails for a passing reason
// (here the device's first allocation); before, the session was left out.
TEST_F(CheckpointSaveTest, ARestoreTriesASessionsCreationThatFailedForAPassingReasonAgain) {
  const std::filesystem::path dir = SaveTwiceAsAutomaticCheckpoints();
  ASSERT_FALSE(dir.empty());
  device_->faults().FailCall("Allocate", device_->faults().calls("Allocate") + 1,
                             absl::UnavailableError("injected: the device is busy"));
  int retries = 0;
  AutoRestoreOptions options = RestoreOptions();
  options.before_retry = [&](const absl::Status& failed) {
    EXPECT_THAT(failed.message(), HasSubstr("injected: the device is busy"));
    ++retries;
  };
  absl::StatusOr<std::vector<RestoredSession>> restored =
      RestoreAutoCheckpoints(options, group_.get());
  ASSERT_TRUE(restored.ok()) << restored.status();
  ASSERT_EQ(restored->size(), 1u);
  EXPECT_EQ((*restored)[0].from, absl::StrCat("auto/", session_, "/step-2"));
  EXPECT_EQ(retries, 1);
}

// One that fails every time ends the restore (rank 0 exits for a restart) rather than leave the
// session out, or restore it from an older checkpoint and remove the newer: nothing is set aside.
// Before, a load that failed so fell back to the older checkpoint.
TEST_F(CheckpointSaveTest, ARestoreThatCannotReadTheSessionRecordEndsForARestart) {
  RestoreWithReadsBroken("session.json", 0);
}

TEST_F(CheckpointSaveTest, ARestoreThatCannotReadTheNewestManifestEndsForARestart) {
  RestoreWithReadsBroken("step-2/manifest.json", 0);
}

TEST_F(CheckpointSaveTest, ARestoreThatCannotLoadTheNewestCheckpointEndsForARestart) {
  RestoreWithReadsBroken("step-2/shard-0-of-1.safetensors", 0);
}

// A session's directory that cannot be looked at (stat fails) fails the listing, which is tried
// again. Before, it was passed over, the listing answered without it, and the group served
// without the session (no error, no restart).
TEST_F(CheckpointSaveTest, ARestoreTriesASessionsDirectoryThatCouldNotBeLookedAtAgain) {
  const std::vector<RestoredSession> restored = RestoreWithReadsBroken(".", 2);
  ASSERT_EQ(restored.size(), 1u);
  EXPECT_EQ(restored[0].from, absl::StrCat("auto/", session_, "/step-2"));
}

TEST_F(CheckpointSaveTest, ARestoreThatCannotLookAtASessionsDirectoryEndsForARestart) {
  RestoreWithReadsBroken(".", 0);
}

// Entries that are nothing of the sessions' (a file; a hidden name, but a closed session's) are
// passed over, whether they can be looked at or not: they are no reason to end every restore.
TEST_F(CheckpointSaveTest, ARestorePassesOverEntriesThatAreNoSessions) {
  const std::filesystem::path dir = SaveTwiceAsAutomaticCheckpoints();
  ASSERT_FALSE(dir.empty());
  std::ofstream(dir.parent_path() / "README") << "automatic checkpoints\n";
  std::filesystem::create_symlink(".junk", dir.parent_path() / ".junk");  // to itself
  absl::StatusOr<std::vector<RestoredSession>> restored =
      RestoreAutoCheckpoints(RestoreOptions(), group_.get());
  ASSERT_TRUE(restored.ok()) << restored.status();
  ASSERT_EQ(restored->size(), 1u);
  EXPECT_EQ((*restored)[0].from, absl::StrCat("auto/", session_, "/step-2"));
}

TEST_F(CheckpointSaveTest, ARestoreThatCannotListTheAutomaticCheckpointsEndsForARestart) {
  RestoreWithReadsBroken("..", 0);
}

}  // namespace
}  // namespace optstep
