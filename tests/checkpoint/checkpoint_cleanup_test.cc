// What the checkpoint library refuses and what it cleans up: a failed shard write, a failed
// commit and a failed merge leave no files behind; unsafe names are refused before any file is
// touched, naming the name escaped; a manifest whose step counters were edited does not verify.

#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "checkpoint/checkpoint_reader.h"
#include "checkpoint/checkpoint_writer.h"
#include "checkpoint/reshard.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tests/checkpoint/checkpoint_test_util.h"
#include "tests/testing/directory_listing.h"
#include "tests/testing/status_matchers.h"

namespace optstep {
namespace {

// The identifier of the saves these tests make (NewCheckpointSave in the servers).
constexpr uint64_t kSave = 0x5a7e;

using testutil::DirectoryEntries;
using testutil::FreshDir;
using testutil::IsOk;
using testutil::OwnedTensor;
using testutil::PathExists;
using testutil::SampleManifest;
using testutil::SampleShards;
using testutil::StatusIs;
using testutil::WriteCheckpoint;

const std::vector<int> kOwners = {0, 1, 1, 0};

TEST(CheckpointCleanupTest, AFailedShardWriteRemovesItsPartialFile) {
  const std::string root = FreshDir("cleanup");
  ASSERT_THAT(PrepareCheckpoint(root, "p", kSave), IsOk());
  const std::vector<float> big(1000, 1.5f);  // written in several flushes before the failure
  TensorSource written{"param/w0", StateTensor::Type::kF32, {1000}, big.data()};
  TensorSource failing{"param/b0", StateTensor::Type::kF32, {3}};
  failing.read = [](uint64_t, size_t, void*) { return absl::UnavailableError("device lost"); };
  CheckpointIoOptions options;
  options.staging_bytes = 64;
  EXPECT_THAT(WriteCheckpointShard(root, "p", kSave, 1, 2, {written, failing}, nullptr, options),
              StatusIs(absl::StatusCode::kUnavailable, "reading tensor 'param/b0'"));
  const std::string tmp = CheckpointTempDir(root, "p", kSave);
  EXPECT_FALSE(PathExists(tmp + "/" + ShardFileName(1, 2)));
  EXPECT_TRUE(PathExists(tmp));  // rank 0's to remove: another rank may still be writing into it
}

TEST(CheckpointCleanupTest, AFailedCommitRemovesTheTemporaryDirectory) {
  const std::string root = FreshDir("cleanup");
  const std::vector<std::vector<OwnedTensor>> shards = SampleShards(2, kOwners);
  // A shard missing: DATA_LOSS, and the temporary with the shard that was written is gone.
  ASSERT_THAT(PrepareCheckpoint(root, "c", kSave), IsOk());
  const OwnedTensor& t = shards[0][0];
  TensorSource source{t.key, t.type, t.shape, t.bytes.data()};
  OPTSTEP_ASSERT_OK_AND_ASSIGN(ShardFile file,
                               WriteCheckpointShard(root, "c", kSave, 0, 2, {source}));
  Manifest manifest = SampleManifest(2, kOwners);
  manifest.shards = {{file.file, file.bytes, file.crc32c}, {ShardFileName(1, 2), 8, 0}};
  EXPECT_THAT(CommitCheckpoint(root, "c", kSave, manifest, 0),
              StatusIs(absl::StatusCode::kDataLoss, "was not written"));
  EXPECT_THAT(DirectoryEntries(root), ::testing::IsEmpty());
  // The name taken meanwhile: ALREADY_EXISTS, and the temporary is gone too.
  ASSERT_THAT(PrepareCheckpoint(root, "d", kSave), IsOk());
  OPTSTEP_ASSERT_OK_AND_ASSIGN(file, WriteCheckpointShard(root, "d", kSave, 0, 1, {source}));
  ASSERT_EQ(::mkdir((root + "/d").c_str(), 0755), 0);
  manifest = SampleManifest(1, {0, 0, 0, 0});
  manifest.shards = {{file.file, file.bytes, file.crc32c}};
  EXPECT_THAT(CommitCheckpoint(root, "d", kSave, manifest, 0),
              StatusIs(absl::StatusCode::kAlreadyExists, "exists already"));
  EXPECT_THAT(DirectoryEntries(root), ::testing::ElementsAre("d"));
}

TEST(CheckpointCleanupTest, AFailedMergeLeavesNoTemporary) {
  const std::string root = FreshDir("cleanup");
  const std::vector<int> owners = {0, 0, 0, 0};
  ASSERT_THAT(WriteCheckpoint(root, "src", SampleManifest(1, owners), SampleShards(1, owners)),
              IsOk());
  OPTSTEP_ASSERT_OK_AND_ASSIGN(std::unique_ptr<CheckpointReader> src,
                               CheckpointReader::Open(root, "src"));
  // The source loses its tail after it was opened: reading it fails halfway through the merge.
  const std::string shard = absl::StrCat(root, "/src/", ShardFileName(0, 1));
  ASSERT_EQ(::truncate(shard.c_str(), src->manifest().shards[0].bytes / 2), 0);
  EXPECT_THAT(MergeCheckpoint(*src, root, "merged"), StatusIs(absl::StatusCode::kDataLoss));
  EXPECT_THAT(DirectoryEntries(root), ::testing::ElementsAre("src"));
}

TEST(CheckpointCleanupTest, UnsafeNamesAreRefusedEscapedBeforeAnyFileIsTouched) {
  const std::string root = FreshDir("names");
  const std::vector<std::string> names = {"a\nb",       "\x01",
                                          "tab\tname",  std::string("nul\0x", 5),
                                          "del\x7f",    "bell\a",
                                          "esc\x1b[2J", "",
                                          ".",          "..",
                                          "../up",      "a/b",
                                          ".hidden",    std::string(256, 'n')};
  for (const std::string& name : names) {
    EXPECT_THAT(PrepareCheckpoint(root, name, kSave), StatusIs(absl::StatusCode::kInvalidArgument))
        << absl::CHexEscape(name);
    EXPECT_THAT(CheckpointReader::Open(root, name), StatusIs(absl::StatusCode::kInvalidArgument))
        << absl::CHexEscape(name);
  }
  EXPECT_THAT(DirectoryEntries(root), ::testing::IsEmpty());
  EXPECT_THAT(ValidateCheckpointName("a\nb"),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       "checkpoint name 'a\\nb' contains the control character '\\n' at byte 1"));
  EXPECT_THAT(ValidateCheckpointName("\x01"),
              StatusIs(absl::StatusCode::kInvalidArgument, "checkpoint name '\\x01' contains"));
  EXPECT_THAT(ValidateCheckpointName("esc\x1b[2J"),
              StatusIs(absl::StatusCode::kInvalidArgument, "'esc\\x1b[2J'"));
  EXPECT_THAT(ValidateCheckpointName("step-100_ok.v2 final+\xc3\xa9"), IsOk());  // UTF-8 is fine
}

// Rewrites one field of <root>/<name>/manifest.json.
void EditManifest(const std::string& dir, const std::string& field, int64_t value) {
  const std::string path = dir + "/manifest.json";
  std::ifstream in(path);
  nlohmann::json manifest = nlohmann::json::parse(in);
  manifest[field] = value;
  std::ofstream(path, std::ios::trunc) << manifest.dump(1);
}

TEST(CheckpointCleanupTest, AManifestWhoseStepWasEditedDoesNotVerify) {
  const std::string root = FreshDir("edited");
  for (const char* name : {"step", "skipped"}) {
    ASSERT_THAT(WriteCheckpoint(root, name, SampleManifest(2, kOwners), SampleShards(2, kOwners)),
                IsOk());
  }
  EditManifest(root + "/step", "step", 8);  // the shards say 7
  OPTSTEP_ASSERT_OK_AND_ASSIGN(std::unique_ptr<CheckpointReader> reader,
                               CheckpointReader::Open(root, "step"));
  // Every checksum holds (the shards are untouched); the counters do not.
  const char* kStepMismatch = "manifest field 'step' = 8 does not match tensor 'meta/step' = 7";
  EXPECT_THAT(reader->Verify(), StatusIs(absl::StatusCode::kDataLoss, kStepMismatch));
  EXPECT_THAT(reader->ReadShard(1, nullptr), StatusIs(absl::StatusCode::kDataLoss, kStepMismatch));
  EditManifest(root + "/skipped", "skipped_steps", 0);  // the shards say 1
  OPTSTEP_ASSERT_OK_AND_ASSIGN(reader, CheckpointReader::Open(root, "skipped"));
  EXPECT_THAT(reader->Verify(),
              StatusIs(absl::StatusCode::kDataLoss, "manifest field 'skipped_steps' = 0"));
}

TEST(CheckpointCleanupTest, ShardsWithoutStepCountersStillOpen) {
  // Checkpoints whose shards hold no "meta/" counters (written by other tools through the
  // library) open as before: there is nothing to compare the manifest's step with.
  const std::string root = FreshDir("nometa");
  std::vector<std::vector<OwnedTensor>> shards = SampleShards(2, kOwners);
  for (auto& shard : shards) {
    shard.erase(std::remove_if(shard.begin(), shard.end(),
                               [](const OwnedTensor& t) { return t.key.rfind("meta/", 0) == 0; }),
                shard.end());
  }
  Manifest manifest = SampleManifest(2, kOwners);
  manifest.step = 1234;
  ASSERT_THAT(WriteCheckpoint(root, "c", manifest, shards), IsOk());
  OPTSTEP_ASSERT_OK_AND_ASSIGN(std::unique_ptr<CheckpointReader> reader,
                               CheckpointReader::Open(root, "c"));
  EXPECT_EQ(reader->manifest().step, 1234u);
  EXPECT_THAT(reader->Verify(), IsOk());
}

}  // namespace
}  // namespace optstep
