// Writer and reader together: round trips, crash safety, pruning, and every corruption refused
// with its precise code.

#include <fcntl.h>
#include <unistd.h>

#include <cstring>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "checkpoint/checkpoint_reader.h"
#include "checkpoint/checkpoint_writer.h"
#include "checkpoint/crc32c.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tests/checkpoint/checkpoint_test_util.h"
#include "tests/testing/directory_listing.h"
#include "tests/testing/status_matchers.h"

namespace optstep {
namespace {

// The identifier of the saves these tests make (NewCheckpointSave in the servers).
constexpr uint64_t kSave = 0x5a7e;

using ::testing::ElementsAre;
using ::testing::IsEmpty;
using testutil::DirectoryEntries;
using testutil::FreshDir;
using testutil::IsOk;
using testutil::OwnedTensor;
using testutil::PathExists;
using testutil::ReadBytes;
using testutil::SampleManifest;
using testutil::SampleShards;
using testutil::StatusIs;
using testutil::WriteCheckpoint;

const std::vector<int> kOwners = {0, 1, 1, 0};

std::string Slurp(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

void Spit(const std::string& path, const std::string& contents) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out << contents;
}

class CheckpointTest : public ::testing::Test {
 protected:
  void SetUp() override {
    root_ = FreshDir("ckpt");
    shards_ = SampleShards(2, kOwners);
  }
  // Writes the two-rank sample as `name` with a small staging buffer (several flushes).
  void WriteSample(const std::string& name, int keep_last = 0) {
    CheckpointIoOptions options;
    options.staging_bytes = 64;
    ASSERT_THAT(
        WriteCheckpoint(root_, name, SampleManifest(2, kOwners), shards_, keep_last, options),
        IsOk());
  }
  std::string Shard(const std::string& name, int rank) const {
    return absl::StrCat(root_, "/", name, "/", ShardFileName(rank, 2));
  }

  std::string root_;
  std::vector<std::vector<OwnedTensor>> shards_;
};

TEST_F(CheckpointTest, RoundTripsEveryTensorBitExactly) {
  WriteSample("c1");
  CheckpointIoOptions small;
  small.staging_bytes = 4096;
  OPTSTEP_ASSERT_OK_AND_ASSIGN(auto reader, CheckpointReader::Open(root_, "c1", small));
  EXPECT_THAT(reader->Verify(), IsOk());
  EXPECT_EQ(reader->manifest().world_size, 2);
  EXPECT_EQ(reader->manifest().step, 7u);
  for (int r = 0; r < 2; ++r) {
    for (const OwnedTensor& t : shards_[r]) {
      const CheckpointTensor* found = reader->Find(t.key);
      ASSERT_NE(found, nullptr) << t.key;
      EXPECT_EQ(found->type, t.type) << t.key;
      EXPECT_EQ(found->shape, t.shape) << t.key;
      OPTSTEP_ASSERT_OK_AND_ASSIGN(std::string bytes, ReadBytes(*reader, t.key));
      EXPECT_EQ(bytes, t.bytes) << t.key;
    }
  }
  // Both 0-d int64 kinds and the non-parameter-shaped factor.
  const CheckpointTensor* step = reader->Find("state/soap/w1/step");
  ASSERT_NE(step, nullptr);
  EXPECT_EQ(step->type, StateTensor::Type::kI64);
  EXPECT_TRUE(step->shape.empty());
  EXPECT_EQ(reader->Find("state/soap/w1/R")->shape, (Shape{5, 5}));
  EXPECT_EQ(reader->Find("state/soap/w1/L")->shard, 1);
  int64_t meta_step = 0;
  EXPECT_THAT(reader->ReadKey("meta/step", &meta_step, sizeof(meta_step)), IsOk());
  EXPECT_EQ(meta_step, 7);
}

TEST_F(CheckpointTest, StreamedReadsComeInBoundedPieces) {
  CheckpointIoOptions options;
  options.staging_bytes = 4096;
  OwnedTensor big = testutil::F32Tensor("param/big", {3000}, 0.0f);  // 12000 bytes
  ASSERT_THAT(PrepareCheckpoint(root_, "big", kSave), IsOk());
  TensorSource source{big.key, big.type, big.shape, big.bytes.data()};
  OPTSTEP_ASSERT_OK_AND_ASSIGN(ShardFile file,
                               WriteCheckpointShard(root_, "big", kSave, 0, 1, {source}));
  Manifest m = SampleManifest(1, {0, 0, 0, 0});
  m.shards = {{file.file, file.bytes, file.crc32c}};
  ASSERT_THAT(CommitCheckpoint(root_, "big", kSave, m, 0), IsOk());
  OPTSTEP_ASSERT_OK_AND_ASSIGN(auto big_reader, CheckpointReader::Open(root_, "big", options));
  std::string got;
  std::vector<size_t> pieces;
  ASSERT_THAT(big_reader->Read(*big_reader->Find("param/big"),
                               [&](uint64_t offset, size_t n, const void* src) {
                                 EXPECT_EQ(offset, got.size());
                                 got.append(static_cast<const char*>(src), n);
                                 pieces.push_back(n);
                                 return absl::OkStatus();
                               }),
              IsOk());
  EXPECT_EQ(got, big.bytes);
  EXPECT_EQ(pieces, (std::vector<size_t>{4096, 4096, 3808}));
}

TEST_F(CheckpointTest, ReadShardDeliversEveryTensorInOneVerifiedPass) {
  std::vector<std::vector<OwnedTensor>> shards(1);
  shards[0].push_back(testutil::F32Tensor("param/big", {3000}, 0.0f));  // spans 3 pieces
  shards[0].push_back(testutil::F32Tensor("param/empty", {0}, 0.0f));
  shards[0].push_back(testutil::I64Scalar("meta/step", 7));
  shards[0].push_back(testutil::F32Tensor("param/odd", {1027}, 5.0f));
  ASSERT_THAT(WriteCheckpoint(root_, "one", SampleManifest(1, {0, 0, 0, 0}), shards), IsOk());
  CheckpointIoOptions options;
  options.staging_bytes = 4096;
  OPTSTEP_ASSERT_OK_AND_ASSIGN(auto reader, CheckpointReader::Open(root_, "one", options));
  std::map<std::string, std::string> got;
  std::vector<CheckpointProgress> seen;
  auto sink = [&](const CheckpointTensor& t, uint64_t offset, size_t n, const void* src) {
    std::string& bytes = got[t.key];
    EXPECT_EQ(offset, bytes.size()) << t.key;
    bytes.append(static_cast<const char*>(src), n);
    return absl::OkStatus();
  };
  ASSERT_THAT(reader->ReadShard(0, sink, [&](const CheckpointProgress& p) { seen.push_back(p); }),
              IsOk());
  for (const OwnedTensor& t : shards[0]) {
    if (t.bytes.empty()) {
      EXPECT_EQ(got.count(t.key), 0u) << t.key;
    } else {
      EXPECT_EQ(got[t.key], t.bytes) << t.key;
    }
  }
  ASSERT_GE(seen.size(), 4u);
  EXPECT_EQ(seen.back().files_done, 1);
  EXPECT_EQ(seen.back().bytes_done, reader->manifest().shards[0].bytes);

  // A flipped byte: everything is delivered, then DATA_LOSS; a sink error stops the pass.
  const std::string path = root_ + "/one/shard-0-of-1.safetensors";
  std::string bytes = Slurp(path);
  bytes[bytes.size() / 2] ^= 0x01;
  Spit(path, bytes);
  got.clear();
  EXPECT_THAT(reader->ReadShard(0, sink),
              StatusIs(absl::StatusCode::kDataLoss, "CRC-32C mismatch"));
  EXPECT_EQ(got["param/odd"].size(), 1027u * 4);
  EXPECT_THAT(
      reader->ReadShard(0, [](const CheckpointTensor&, uint64_t, size_t,
                              const void*) { return absl::ResourceExhaustedError("device full"); }),
      StatusIs(absl::StatusCode::kResourceExhausted, "device full"));
}

TEST_F(CheckpointTest, ShardFileIsPlainSafetensorsWithTheReportedChecksum) {
  WriteSample("c1");
  const std::string bytes = Slurp(Shard("c1", 0));
  uint64_t n = 0;
  std::memcpy(&n, bytes.data(), 8);
  EXPECT_EQ((8 + n) % 8, 0u);
  nlohmann::json header = nlohmann::json::parse(bytes.substr(8, n));
  EXPECT_EQ(header["param/w0"]["dtype"], "F32");
  EXPECT_EQ(header["param/w0"]["shape"], nlohmann::json({4, 3}));
  EXPECT_EQ(header["meta/step"]["dtype"], "I64");
  EXPECT_EQ(header["meta/step"]["shape"], nlohmann::json::array());
  const auto offsets = header["param/w0"]["data_offsets"];
  const std::string data = bytes.substr(8 + n + offsets[0].get<size_t>(), 48);
  EXPECT_EQ(data, shards_[0][0].bytes);
  OPTSTEP_ASSERT_OK_AND_ASSIGN(auto reader, CheckpointReader::Open(root_, "c1"));
  EXPECT_EQ(reader->manifest().shards[0].crc32c, Crc32c(bytes.data(), bytes.size()));
  EXPECT_EQ(reader->manifest().shards[0].bytes, bytes.size());
}

TEST_F(CheckpointTest, ProgressCountsEveryByte) {
  ASSERT_THAT(PrepareCheckpoint(root_, "p", kSave), IsOk());
  std::vector<TensorSource> sources;
  for (const OwnedTensor& t : shards_[0])
    sources.push_back({t.key, t.type, t.shape, t.bytes.data()});
  const OwnedTensor big = testutil::F32Tensor("param/big", {3000}, 0.0f);  // > 2 buffers
  sources.push_back({big.key, big.type, big.shape, big.bytes.data()});
  std::vector<CheckpointProgress> seen;
  CheckpointIoOptions options;
  options.staging_bytes = 4096;
  OPTSTEP_ASSERT_OK_AND_ASSIGN(
      ShardFile file, WriteCheckpointShard(
                          root_, "p", kSave, 0, 2, sources,
                          [&](const CheckpointProgress& p) { seen.push_back(p); }, options));
  ASSERT_GE(seen.size(), 5u);
  EXPECT_EQ(seen.back().bytes_done, file.bytes);
  EXPECT_EQ(seen.back().bytes_total, file.bytes);
  EXPECT_EQ(seen.back().files_done, 1);
  for (size_t i = 1; i < seen.size(); ++i) EXPECT_GE(seen[i].bytes_done, seen[i - 1].bytes_done);
}

TEST_F(CheckpointTest, ReaderCallbackErrorsNameTheKey) {
  ASSERT_THAT(PrepareCheckpoint(root_, "e", kSave), IsOk());
  TensorSource source{"param/w0", StateTensor::Type::kF32, {4, 3}};
  source.read = [](uint64_t, size_t, void*) { return absl::UnavailableError("device lost"); };
  EXPECT_THAT(WriteCheckpointShard(root_, "e", kSave, 0, 1, {source}),
              StatusIs(absl::StatusCode::kUnavailable, "reading tensor 'param/w0'"));
  TensorSource both{"param/w0", StateTensor::Type::kF32, {1}, &root_};
  both.read = source.read;
  EXPECT_THAT(WriteCheckpointShard(root_, "e", kSave, 0, 1, {both}),
              StatusIs(absl::StatusCode::kInvalidArgument, "exactly one of"));
  EXPECT_THAT(WriteCheckpointShard(root_, "e", kSave, 2, 2, {}),
              StatusIs(absl::StatusCode::kInvalidArgument, "rank 2 is not a rank of world size 2"));
  EXPECT_THAT(WriteCheckpointShard(root_, "unprepared", kSave, 0, 1, {}),
              StatusIs(absl::StatusCode::kFailedPrecondition, "not prepared"));
}

TEST_F(CheckpointTest, NamesThatEscapeTheRootAreRefused) {
  for (const char* name : {"", ".", "..", "../x", "a/b", "/abs", ".hidden", ".c1.tmp"}) {
    EXPECT_THAT(PrepareCheckpoint(root_, name, kSave), StatusIs(absl::StatusCode::kInvalidArgument))
        << name;
    EXPECT_THAT(WriteCheckpointShard(root_, name, kSave, 0, 1, {}),
                StatusIs(absl::StatusCode::kInvalidArgument))
        << name;
    EXPECT_THAT(CommitCheckpoint(root_, name, kSave, SampleManifest(1, {0, 0, 0, 0}), 0),
                StatusIs(absl::StatusCode::kInvalidArgument))
        << name;
    EXPECT_THAT(CheckpointReader::Open(root_, name), StatusIs(absl::StatusCode::kInvalidArgument))
        << name;
  }
  EXPECT_THAT(ValidateCheckpointName("../x"),
              StatusIs(absl::StatusCode::kInvalidArgument, "checkpoint name '../x' starts with"));
  EXPECT_THAT(ValidateCheckpointName("a/b"),
              StatusIs(absl::StatusCode::kInvalidArgument, "contains '/'"));
  // The temporary's name, ".<name>.<16 hex digits>.tmp", must fit in 255 bytes.
  EXPECT_THAT(ValidateCheckpointName(std::string(234, 'x')),
              StatusIs(absl::StatusCode::kInvalidArgument, "234 bytes"));
  EXPECT_THAT(ValidateCheckpointName(std::string(233, 'x')), IsOk());
  EXPECT_THAT(ValidateCheckpointName("step-100_ok.v2"), IsOk());
}

TEST_F(CheckpointTest, ExistingNameIsAlreadyExists) {
  WriteSample("c1");
  EXPECT_THAT(PrepareCheckpoint(root_, "c1", kSave),
              StatusIs(absl::StatusCode::kAlreadyExists, "checkpoint 'c1' exists already"));
  EXPECT_THAT(PrepareCheckpoint(root_ + "/missing", "c2", kSave),
              StatusIs(absl::StatusCode::kNotFound, "not an existing directory"));
}

TEST_F(CheckpointTest, CrashBeforeCommitLeavesNoCheckpointAndAFailedCommitCleansUp) {
  // A save that died after writing its shards: never listed, never opened.
  ASSERT_THAT(PrepareCheckpoint(root_, "c1", kSave), IsOk());
  TensorSource source{"param/w0", StateTensor::Type::kF32, {4, 3}, shards_[0][0].bytes.data()};
  ASSERT_THAT(WriteCheckpointShard(root_, "c1", kSave, 0, 2, {source}), IsOk());
  const std::string tmp = CheckpointTempDir(root_, "c1", kSave);
  EXPECT_TRUE(PathExists(tmp + "/shard-0-of-2.safetensors"));
  OPTSTEP_ASSERT_OK_AND_ASSIGN(std::vector<std::string> listed, ListCheckpoints(root_));
  EXPECT_TRUE(listed.empty());
  EXPECT_THAT(CheckpointReader::Open(root_, "c1"), StatusIs(absl::StatusCode::kNotFound));
  // A commit with a shard missing is refused and publishes nothing.
  Manifest m = SampleManifest(2, kOwners);
  m.shards = {{"shard-0-of-2.safetensors", 0, 0}, {"shard-1-of-2.safetensors", 0, 0}};
  EXPECT_THAT(CommitCheckpoint(root_, "c1", kSave, m, 0),
              StatusIs(absl::StatusCode::kDataLoss, "shard 'shard-0-of-2.safetensors' has"));
  EXPECT_FALSE(PathExists(root_ + "/c1"));
  EXPECT_FALSE(PathExists(tmp));
  // The next save of that name starts from an empty temporary directory of its own.
  ASSERT_THAT(PrepareCheckpoint(root_, "c1", kSave + 1), IsOk());
  EXPECT_THAT(DirectoryEntries(CheckpointTempDir(root_, "c1", kSave + 1)), IsEmpty());
}

// Two saves of one name at once (two sessions, two groups sharing the root) write temporaries of
// their own: the first to commit takes the name with its own bytes, the other is refused and
// leaves nothing. With one temporary per name, the second Prepare removed the first save's files
// and the first commit published its manifest over the second save's shard.
TEST_F(CheckpointTest, TwoSavesOfOneNameAtOnceDoNotMix) {
  const uint64_t first = kSave, second = kSave + 1;
  ASSERT_THAT(PrepareCheckpoint(root_, "c1", first), IsOk());
  TensorSource mine{"param/w0", StateTensor::Type::kF32, {4, 3}, shards_[0][0].bytes.data()};
  OPTSTEP_ASSERT_OK_AND_ASSIGN(ShardFile file,
                               WriteCheckpointShard(root_, "c1", first, 0, 1, {mine}));
  ASSERT_THAT(PrepareCheckpoint(root_, "c1", second), IsOk());
  std::string other_bytes = shards_[0][0].bytes;
  other_bytes[0] ^= 0x01;  // the same size, other values
  TensorSource other{"param/w0", StateTensor::Type::kF32, {4, 3}, other_bytes.data()};
  OPTSTEP_ASSERT_OK_AND_ASSIGN(ShardFile other_file,
                               WriteCheckpointShard(root_, "c1", second, 0, 1, {other}));
  ASSERT_NE(other_file.crc32c, file.crc32c);

  Manifest m = SampleManifest(1, {0, 0, 0, 0});
  m.shards = {{file.file, file.bytes, file.crc32c}};
  ASSERT_THAT(CommitCheckpoint(root_, "c1", first, m, 0), IsOk());
  m.shards = {{other_file.file, other_file.bytes, other_file.crc32c}};
  EXPECT_THAT(CommitCheckpoint(root_, "c1", second, m, 0),
              StatusIs(absl::StatusCode::kAlreadyExists, "checkpoint 'c1' exists already"));
  EXPECT_THAT(DirectoryEntries(root_), ElementsAre("c1"));
  OPTSTEP_ASSERT_OK_AND_ASSIGN(auto reader, CheckpointReader::Open(root_, "c1"));
  EXPECT_THAT(reader->Verify(), IsOk());
}

TEST_F(CheckpointTest, KeepLastPrunesOldestCompleteCheckpoints) {
  for (const char* name : {"s1", "s2", "s3"}) WriteSample(name);
  ASSERT_THAT(PrepareCheckpoint(root_, "pending", kSave), IsOk());  // not complete: never pruned
  WriteSample("s4", /*keep_last=*/2);
  OPTSTEP_ASSERT_OK_AND_ASSIGN(std::vector<std::string> listed, ListCheckpoints(root_));
  EXPECT_EQ(listed, (std::vector<std::string>{"s3", "s4"}));
  EXPECT_FALSE(PathExists(root_ + "/s1"));
  EXPECT_THAT(DirectoryEntries(root_),
              ElementsAre(absl::StrCat(".pending.", absl::Hex(kSave, absl::kZeroPad16), ".tmp"),
                          "s3", "s4"));
  EXPECT_TRUE(PathExists(CheckpointTempDir(root_, "pending", kSave)));
  WriteSample("s5", /*keep_last=*/1);
  OPTSTEP_ASSERT_OK_AND_ASSIGN(listed, ListCheckpoints(root_));
  EXPECT_EQ(listed, (std::vector<std::string>{"s5"}));
  // Another session's checkpoints are neither pruned nor counted, in either direction.
  Manifest other = SampleManifest(2, kOwners);
  other.definition = R"({"name": "other", "trainers": 1, "params": ["w0", "b0", "w1", "emb"]})";
  ASSERT_THAT(WriteCheckpoint(root_, "o1", other, shards_), IsOk());
  WriteSample("s6", /*keep_last=*/1);
  ASSERT_THAT(WriteCheckpoint(root_, "o2", other, shards_, /*keep_last=*/1), IsOk());
  OPTSTEP_ASSERT_OK_AND_ASSIGN(listed, ListCheckpoints(root_));
  EXPECT_EQ(listed, (std::vector<std::string>{"s6", "o2"}));
  EXPECT_THAT(CommitCheckpoint(root_, "s7", kSave, SampleManifest(1, {0, 0, 0, 0}), -1),
              StatusIs(absl::StatusCode::kInvalidArgument, "keep_last -1"));
}

TEST_F(CheckpointTest, KeepLastPrunesOnlyTheSameSessionsCheckpoints) {
  // Sessions of the same definition (two tenants training the same model, or one tenant's
  // second run) keep their own checkpoints, and so does one that names no session.
  Manifest bobs = SampleManifest(2, kOwners);
  bobs.session_owner = "bob";  // the same id under another owner: another session
  Manifest second_run = SampleManifest(2, kOwners);
  second_run.session_id = "s4567";
  Manifest unnamed = SampleManifest(2, kOwners);
  unnamed.session_id.clear();
  unnamed.session_owner.clear();
  ASSERT_THAT(WriteCheckpoint(root_, "bob1", bobs, shards_), IsOk());
  ASSERT_THAT(WriteCheckpoint(root_, "run2", second_run, shards_), IsOk());
  ASSERT_THAT(WriteCheckpoint(root_, "old", unnamed, shards_), IsOk());
  WriteSample("a1");
  WriteSample("a2", /*keep_last=*/1);
  OPTSTEP_ASSERT_OK_AND_ASSIGN(std::vector<std::string> listed, ListCheckpoints(root_));
  EXPECT_EQ(listed, (std::vector<std::string>{"bob1", "run2", "old", "a2"}));
  // A save that names no session prunes nothing.
  ASSERT_THAT(WriteCheckpoint(root_, "old2", unnamed, shards_, /*keep_last=*/1), IsOk());
  OPTSTEP_ASSERT_OK_AND_ASSIGN(listed, ListCheckpoints(root_));
  EXPECT_EQ(listed, (std::vector<std::string>{"bob1", "run2", "old", "a2", "old2"}));
  // The fields round-trip through manifest.json.
  OPTSTEP_ASSERT_OK_AND_ASSIGN(Manifest read, ReadManifestFile(CheckpointDir(root_, "bob1")));
  EXPECT_EQ(read.session_id, "s0123");
  EXPECT_EQ(read.session_owner, "bob");
  OPTSTEP_ASSERT_OK_AND_ASSIGN(read, ReadManifestFile(CheckpointDir(root_, "old")));
  EXPECT_EQ(read.session_id, "");
}

TEST_F(CheckpointTest, TruncatedShardIsDataLoss) {
  WriteSample("c1");
  const std::string path = Shard("c1", 1);
  ASSERT_EQ(::truncate(path.c_str(), 100), 0);
  EXPECT_THAT(CheckpointReader::Open(root_, "c1"),
              StatusIs(absl::StatusCode::kDataLoss, "has 100 bytes; the manifest says"));
}

TEST_F(CheckpointTest, FlippedByteFailsVerifyNamingBothChecksums) {
  WriteSample("c1");
  const std::string path = Shard("c1", 0);
  std::string bytes = Slurp(path);
  bytes[bytes.size() - 5] ^= 0x10;  // inside the data: headers still parse
  Spit(path, bytes);
  OPTSTEP_ASSERT_OK_AND_ASSIGN(auto reader, CheckpointReader::Open(root_, "c1"));
  const std::string expected =
      absl::StrFormat("manifest says %08x, the file has %08x", reader->manifest().shards[0].crc32c,
                      Crc32c(bytes.data(), bytes.size()));
  EXPECT_THAT(reader->Verify(), StatusIs(absl::StatusCode::kDataLoss, expected));
  EXPECT_THAT(reader->Verify(), StatusIs(absl::StatusCode::kDataLoss, "shard-0-of-2.safetensors"));
}

TEST_F(CheckpointTest, MissingShardIsDataLoss) {
  WriteSample("c1");
  ASSERT_EQ(::unlink(Shard("c1", 1).c_str()), 0);
  EXPECT_THAT(CheckpointReader::Open(root_, "c1"),
              StatusIs(absl::StatusCode::kDataLoss, "shard 'shard-1-of-2.safetensors' is missing"));
}

// A shard that is there but cannot be opened is not the checkpoint's damage: the error says what
// the system said (an automatic restore tries such a checkpoint again rather than set it aside).
TEST_F(CheckpointTest, AShardThatCannotBeOpenedIsNotDataLoss) {
  WriteSample("c1");
  const std::string shard = Shard("c1", 1);
  ASSERT_EQ(::unlink(shard.c_str()), 0);
  ASSERT_EQ(::symlink(shard.c_str(), shard.c_str()), 0);  // a loop: open fails with ELOOP
  EXPECT_THAT(CheckpointReader::Open(root_, "c1"),
              StatusIs(absl::StatusCode::kInternal, "shard-1-of-2.safetensors"));
}

TEST_F(CheckpointTest, BadShardHeaderJsonIsDataLoss) {
  WriteSample("c1");
  const std::string path = Shard("c1", 0);
  std::string bytes = Slurp(path);
  bytes[8 + 3] = '#';  // inside the first key's quotes region: no longer JSON
  bytes[8 + 2] = '"';
  bytes[8 + 1] = '{';
  Spit(path, bytes);
  EXPECT_THAT(CheckpointReader::Open(root_, "c1"),
              StatusIs(absl::StatusCode::kDataLoss, "not a JSON object"));
}

// Writes a one-shard checkpoint whose shard is `json` (space-padded) plus `data_bytes` zeros.
void WriteRawShard(const std::string& root, const std::string& name, std::string json,
                   size_t data_bytes) {
  ASSERT_THAT(PrepareCheckpoint(root, name, kSave), IsOk());
  json.append((8 - json.size() % 8) % 8, ' ');
  std::string file(8, '\0');
  const uint64_t n = json.size();
  std::memcpy(file.data(), &n, 8);
  file += json + std::string(data_bytes, '\0');
  Spit(CheckpointTempDir(root, name, kSave) + "/shard-0-of-1.safetensors", file);
  Manifest m = SampleManifest(1, {0, 0, 0, 0});
  m.shards = {{"shard-0-of-1.safetensors", file.size(), Crc32c(file.data(), file.size())}};
  ASSERT_THAT(CommitCheckpoint(root, name, kSave, m, 0), IsOk());
}

TEST_F(CheckpointTest, OffsetsOutOfRangeOrOverlappingAreDataLoss) {
  WriteRawShard(root_, "range", R"({"a": {"dtype": "F32", "shape": [4], "data_offsets": [0, 16]}})",
                8);
  EXPECT_THAT(CheckpointReader::Open(root_, "range"),
              StatusIs(absl::StatusCode::kDataLoss, "data_offsets [0, 16] out of range"));
  WriteRawShard(root_, "overlap",
                R"({"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]},)"
                R"( "b": {"dtype": "F32", "shape": [2], "data_offsets": [4, 12]}})",
                12);
  EXPECT_THAT(CheckpointReader::Open(root_, "overlap"),
              StatusIs(absl::StatusCode::kDataLoss, "overlaps"));
  WriteRawShard(root_, "fine", R"({"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}})",
                8);
  EXPECT_THAT(CheckpointReader::Open(root_, "fine"), IsOk());
}

TEST_F(CheckpointTest, UnsupportedFormatVersionIsFailedPrecondition) {
  WriteSample("c1");
  const std::string path = root_ + "/c1/manifest.json";
  nlohmann::json j = nlohmann::json::parse(Slurp(path));
  j["format_version"] = 9;
  Spit(path, j.dump());
  EXPECT_THAT(CheckpointReader::Open(root_, "c1"),
              StatusIs(absl::StatusCode::kFailedPrecondition, "format_version 9"));
  Spit(path, "{\"format_version\": 1, \"definition\": ");
  EXPECT_THAT(CheckpointReader::Open(root_, "c1"),
              StatusIs(absl::StatusCode::kDataLoss, "manifest.json"));
}

TEST_F(CheckpointTest, LookupIsByExactKeyOnly) {
  // "w1" must not match "w10" or "xw1", and a suffix never matches.
  std::vector<std::vector<OwnedTensor>> shards(1);
  shards[0].push_back(testutil::F32Tensor("param/w10", {2}, 1.0f));
  shards[0].push_back(testutil::F32Tensor("param/xw1", {2}, 2.0f));
  ASSERT_THAT(WriteCheckpoint(root_, "exact", SampleManifest(1, {0, 0, 0, 0}), shards), IsOk());
  OPTSTEP_ASSERT_OK_AND_ASSIGN(auto reader, CheckpointReader::Open(root_, "exact"));
  EXPECT_EQ(reader->Find("param/w1"), nullptr);
  EXPECT_EQ(reader->Find("w10"), nullptr);
  EXPECT_NE(reader->Find("param/w10"), nullptr);
  float two[2];
  EXPECT_THAT(reader->ReadKey("param/w1", two, sizeof(two)),
              StatusIs(absl::StatusCode::kNotFound, "no tensor 'param/w1'"));
  EXPECT_THAT(reader->ReadKey("param/w10", two, 4),
              StatusIs(absl::StatusCode::kInvalidArgument, "has 8 bytes; the destination holds 4"));
}

}  // namespace
}  // namespace optstep
