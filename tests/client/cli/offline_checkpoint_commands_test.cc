#include "client/cli/offline_checkpoint_commands.h"

#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "checkpoint/checkpoint_reader.h"
#include "client/cli/commands.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/checkpoint/checkpoint_test_util.h"
#include "tests/testing/status_matchers.h"

namespace optstep {
namespace cli {
namespace {

using ::testing::HasSubstr;
using testutil::IsOk;

class OfflineCheckpointCommandsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    root_ = testutil::FreshDir("cli");
    const std::vector<int> owners = {0, 1, 1, 0};
    ASSERT_THAT(testutil::WriteCheckpoint(root_, "src", testutil::SampleManifest(2, owners),
                                          testutil::SampleShards(2, owners)),
                IsOk());
  }
  int Run(std::vector<std::string> args, int ranks = 0) {
    out_.str("");
    err_.str("");
    OfflineCheckpointOptions options;
    options.ranks = ranks;
    return RunOfflineCheckpointCommand(args, options, out_, err_);
  }

  std::string root_;
  std::ostringstream out_, err_;
};

TEST_F(OfflineCheckpointCommandsTest, InspectSummarisesTheManifestAndShards) {
  ASSERT_EQ(Run({"ckpt", "inspect", root_ + "/src"}), kExitOk) << err_.str();
  OPTSTEP_ASSERT_OK_AND_ASSIGN(auto reader, CheckpointReader::Open(root_, "src"));
  const std::string text = out_.str();
  EXPECT_THAT(text, HasSubstr("definition:  " + reader->manifest().definition_digest + "\n"));
  EXPECT_THAT(text, HasSubstr("world size:  2\n"));
  EXPECT_THAT(text, HasSubstr("step:        7 (1 skipped)\n"));
  EXPECT_THAT(text, HasSubstr("parameters:  4\n"));
  EXPECT_THAT(text, HasSubstr("tensors:     18 keys"));
  EXPECT_THAT(text, HasSubstr("RANK  FILE"));
  // Rank 0 owns w0 and emb (2 params): 3 + 3 own tensors + 4 replicated counters.
  EXPECT_THAT(text, testing::ContainsRegex("\n   0  shard-0-of-2.safetensors       2       10 "));
  EXPECT_EQ(text, FormatCheckpointSummary(*reader));
}

TEST_F(OfflineCheckpointCommandsTest, VerifyExitsNonzeroWithTheError) {
  EXPECT_EQ(Run({"ckpt", "verify", root_ + "/src"}), kExitOk);
  EXPECT_THAT(out_.str(), HasSubstr("ok: " + root_ + "/src: 2 shards"));
  const std::string shard = root_ + "/src/shard-1-of-2.safetensors";
  std::string bytes;
  {
    std::ifstream in(shard, std::ios::binary);
    std::stringstream s;
    s << in.rdbuf();
    bytes = s.str();
  }
  bytes.back() ^= 1;
  std::ofstream(shard, std::ios::binary | std::ios::trunc) << bytes;
  EXPECT_EQ(Run({"ckpt", "verify", root_ + "/src"}), kExitCallFailed);
  EXPECT_THAT(err_.str(), HasSubstr("DATA_LOSS"));
  EXPECT_THAT(err_.str(), HasSubstr("shard-1-of-2.safetensors': CRC-32C mismatch"));
  // Corruption is never carried into a new checkpoint.
  EXPECT_EQ(Run({"ckpt", "merge", root_ + "/src", root_ + "/merged"}), kExitCallFailed);
  EXPECT_EQ(Run({"ckpt", "verify", root_ + "/missing"}), kExitCallFailed);
  EXPECT_THAT(err_.str(), HasSubstr("NOT_FOUND"));
}

TEST_F(OfflineCheckpointCommandsTest, MergeAndSplitWriteValidCheckpoints) {
  ASSERT_EQ(Run({"ckpt", "merge", root_ + "/src", root_ + "/merged"}), kExitOk) << err_.str();
  ASSERT_EQ(Run({"ckpt", "split", root_ + "/merged", root_ + "/split/"}, 3), kExitOk) << err_.str();
  EXPECT_THAT(out_.str(), HasSubstr("3 shards"));
  OPTSTEP_ASSERT_OK_AND_ASSIGN(auto split, CheckpointReader::Open(root_, "split"));
  EXPECT_EQ(split->manifest().world_size, 3);
  EXPECT_THAT(split->Verify(), IsOk());
  EXPECT_EQ(Run({"ckpt", "merge", root_ + "/src", root_ + "/merged"}), kExitCallFailed);
  EXPECT_THAT(err_.str(), HasSubstr("ALREADY_EXISTS"));
  EXPECT_EQ(Run({"ckpt", "merge", root_ + "/src", root_ + "/.hidden"}), kExitCallFailed);
  EXPECT_THAT(err_.str(), HasSubstr("INVALID_ARGUMENT"));
}

TEST_F(OfflineCheckpointCommandsTest, BadCommandLinesAreUsageErrors) {
  EXPECT_EQ(Run({"ckpt"}), kExitUsage);
  EXPECT_EQ(Run({"ckpt", "frobnicate", "x"}), kExitUsage);
  EXPECT_THAT(err_.str(), HasSubstr("unknown ckpt subcommand 'frobnicate'"));
  EXPECT_EQ(Run({"ckpt", "inspect"}), kExitUsage);
  EXPECT_EQ(Run({"ckpt", "split", root_ + "/src", root_ + "/s"}), kExitUsage);
  EXPECT_THAT(err_.str(), HasSubstr("--ranks=N with N >= 1, not 0"));
}

}  // namespace
}  // namespace cli
}  // namespace optstep
