// The temporaries of saves: AbandonCheckpoint removes one; the start-up sweep removes those no
// save can still be writing (nothing in them changed for longer than the bound) and nothing else.

#include "checkpoint/temporaries.h"

#include <fcntl.h>
#include <sys/stat.h>

#include <fstream>
#include <string>
#include <vector>

#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "checkpoint/checkpoint_writer.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/checkpoint/checkpoint_test_util.h"
#include "tests/testing/directory_listing.h"
#include "tests/testing/status_matchers.h"

namespace optstep {
namespace {

// The identifier of the saves these tests make (NewCheckpointSave in the servers).
constexpr uint64_t kSave = 0x5a7e;

using ::testing::ElementsAre;
using ::testing::IsEmpty;
using testutil::FreshDir;
using testutil::IsOk;
using testutil::PathExists;
using testutil::StatusIs;

void Touch(const std::string& path) { std::ofstream(path) << "x"; }

// Sets the modification time of `path` to `when`.
void SetModified(const std::string& path, absl::Time when) {
  const timespec times[2] = {absl::ToTimespec(when), absl::ToTimespec(when)};
  ASSERT_EQ(::utimensat(AT_FDCWD, path.c_str(), times, AT_SYMLINK_NOFOLLOW), 0) << path;
}

// A directory `dir` holding one file, both last modified at `when`.
void MakeDir(const std::string& dir, absl::Time when) {
  ASSERT_EQ(::mkdir(dir.c_str(), 0755), 0) << dir;
  Touch(dir + "/shard-0-of-1.safetensors");
  SetModified(dir + "/shard-0-of-1.safetensors", when);
  SetModified(dir, when);
}

TEST(TemporariesTest, AbandonRemovesTheTemporaryAndEverythingInIt) {
  const std::string root = FreshDir("abandon");
  ASSERT_THAT(PrepareCheckpoint(root, "a", kSave), IsOk());
  Touch(CheckpointTempDir(root, "a", kSave) + "/shard-0-of-2.safetensors");
  EXPECT_THAT(AbandonCheckpoint(root, "a", kSave), IsOk());
  EXPECT_FALSE(PathExists(CheckpointTempDir(root, "a", kSave)));
  EXPECT_THAT(AbandonCheckpoint(root, "a", kSave), IsOk());  // none: nothing to do
  EXPECT_THAT(AbandonCheckpoint(root, "../a", kSave), StatusIs(absl::StatusCode::kInvalidArgument));
}

TEST(TemporariesTest, SweepRemovesOnlyTemporariesIdleBeyondTheBound) {
  const std::string root = FreshDir("sweep");
  const absl::Time now = absl::Now();
  const absl::Time old = now - absl::Hours(2);
  MakeDir(CheckpointTempDir(root, "crashed.v2", kSave), old);  // a save that died: removed
  MakeDir(root + "/.crashed.tmp", old);  // one of a release before the save identifiers: removed
  MakeDir(root + "/.pruned.tmp", old);   // a pruning victim half deleted: removed
  MakeDir(root + "/.running.tmp", now);  // a save writing now: kept
  MakeDir(root + "/.resumed.tmp", old);  // an old directory with a file written just now
  Touch(root + "/.resumed.tmp/shard-1-of-2.safetensors");
  SetModified(root + "/.resumed.tmp", old);
  MakeDir(root + "/.snapshot", old);  // hidden, but not a temporary of ours
  MakeDir(root + "/..tmp", old);      // no checkpoint name inside
  MakeDir(root + "/complete", old);   // a checkpoint
  Touch(root + "/.file.tmp");         // not a directory
  SetModified(root + "/.file.tmp", old);

  OPTSTEP_ASSERT_OK_AND_ASSIGN(std::vector<std::string> removed,
                               SweepStaleCheckpointTemporaries(root, absl::Hours(1), now));
  EXPECT_THAT(removed, ElementsAre("crashed", "crashed.v2", "pruned"));
  EXPECT_FALSE(PathExists(CheckpointTempDir(root, "crashed.v2", kSave)));
  EXPECT_FALSE(PathExists(root + "/.crashed.tmp"));
  EXPECT_FALSE(PathExists(root + "/.pruned.tmp"));
  for (const char* kept :
       {"/.running.tmp", "/.resumed.tmp", "/.snapshot", "/..tmp", "/complete", "/.file.tmp"}) {
    EXPECT_TRUE(PathExists(root + kept)) << kept;
  }
  // A second sweep finds nothing more; a longer bound keeps everything.
  OPTSTEP_ASSERT_OK_AND_ASSIGN(removed, SweepStaleCheckpointTemporaries(root, absl::Hours(1), now));
  EXPECT_THAT(removed, IsEmpty());
  MakeDir(root + "/.older.tmp", old);
  OPTSTEP_ASSERT_OK_AND_ASSIGN(removed, SweepStaleCheckpointTemporaries(root, absl::Hours(3), now));
  EXPECT_THAT(removed, IsEmpty());
}

TEST(TemporariesTest, SweepOfAMissingRootIsNotFound) {
  EXPECT_THAT(SweepStaleCheckpointTemporaries(FreshDir("x") + "/missing", absl::Hours(1)),
              StatusIs(absl::StatusCode::kNotFound, "not an existing directory"));
}

}  // namespace
}  // namespace optstep
