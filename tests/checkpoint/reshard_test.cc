#include "checkpoint/reshard.h"

#include <map>
#include <string>
#include <vector>

#include "checkpoint/partition.h"
#include "gtest/gtest.h"
#include "tests/checkpoint/checkpoint_test_util.h"
#include "tests/testing/status_matchers.h"

namespace optstep {
namespace {

using testutil::FreshDir;
using testutil::IsOk;
using testutil::OwnedTensor;
using testutil::ReadBytes;
using testutil::StatusIs;

const std::vector<int> kOwners = {0, 1, 1, 0};
const std::vector<std::string> kParams = {"w0", "b0", "w1", "emb"};

// Every key of the sample, once, with its bytes.
std::map<std::string, const OwnedTensor*> Expected(
    const std::vector<std::vector<OwnedTensor>>& shards) {
  std::map<std::string, const OwnedTensor*> out;
  for (const auto& shard : shards) {
    for (const OwnedTensor& t : shard) out.emplace(t.key, &t);
  }
  return out;
}

void ExpectSameTensors(const CheckpointReader& reader,
                       const std::map<std::string, const OwnedTensor*>& expected) {
  EXPECT_THAT(reader.Verify(), IsOk());
  ASSERT_EQ(reader.Keys().size(), expected.size());
  for (const auto& [key, t] : expected) {
    const CheckpointTensor* found = reader.Find(key);
    ASSERT_NE(found, nullptr) << key;
    EXPECT_EQ(found->type, t->type) << key;
    EXPECT_EQ(found->shape, t->shape) << key;
    OPTSTEP_ASSERT_OK_AND_ASSIGN(std::string bytes, ReadBytes(reader, key));
    EXPECT_EQ(bytes, t->bytes) << key;
  }
}

// The rank holding each key of a parameter ("param/<name>" or "state/<sub>/<name>/...").
int ShardOf(const CheckpointReader& reader, const std::string& key) {
  return reader.Find(key)->shard;
}

TEST(ReshardTest, MergeThenSplitKeepsEveryTensorBitIdentical) {
  const std::string root = FreshDir("reshard");
  const auto shards = testutil::SampleShards(2, kOwners);
  ASSERT_THAT(testutil::WriteCheckpoint(root, "src", testutil::SampleManifest(2, kOwners), shards),
              IsOk());
  const auto expected = Expected(shards);
  OPTSTEP_ASSERT_OK_AND_ASSIGN(auto src, CheckpointReader::Open(root, "src"));

  ASSERT_THAT(MergeCheckpoint(*src, root, "merged"), IsOk());
  OPTSTEP_ASSERT_OK_AND_ASSIGN(auto merged, CheckpointReader::Open(root, "merged"));
  EXPECT_EQ(merged->manifest().world_size, 1);
  EXPECT_EQ(merged->manifest().definition_digest, src->manifest().definition_digest);
  EXPECT_EQ(merged->manifest().step, 7u);
  for (const ManifestParam& p : merged->manifest().params) EXPECT_EQ(p.owner, 0) << p.name;
  ExpectSameTensors(*merged, expected);

  std::vector<CheckpointProgress> seen;
  ASSERT_THAT(SplitCheckpoint(*merged, root, "split3", 3,
                              [&](const CheckpointProgress& p) { seen.push_back(p); }),
              IsOk());
  ASSERT_FALSE(seen.empty());
  EXPECT_EQ(seen.back().files_done, 3);
  EXPECT_EQ(seen.back().bytes_done, seen.back().bytes_total);
  OPTSTEP_ASSERT_OK_AND_ASSIGN(auto split, CheckpointReader::Open(root, "split3"));
  EXPECT_EQ(split->manifest().world_size, 3);
  ExpectSameTensors(*split, expected);

  // And back to one shard: the same bytes again.
  ASSERT_THAT(MergeCheckpoint(*split, root, "merged2"), IsOk());
  OPTSTEP_ASSERT_OK_AND_ASSIGN(auto merged2, CheckpointReader::Open(root, "merged2"));
  ExpectSameTensors(*merged2, expected);
}

TEST(ReshardTest, SplitFollowsPartitionByCostAndReplicatesCounters) {
  const std::string root = FreshDir("reshard");
  const auto shards = testutil::SampleShards(1, {0, 0, 0, 0});
  const Manifest manifest = testutil::SampleManifest(1, {0, 0, 0, 0});
  ASSERT_THAT(testutil::WriteCheckpoint(root, "one", manifest, shards), IsOk());
  OPTSTEP_ASSERT_OK_AND_ASSIGN(auto src, CheckpointReader::Open(root, "one"));
  std::vector<double> costs;
  for (const ManifestParam& p : manifest.params) costs.push_back(p.cost);
  const Layout layout = PartitionByCost(costs, 2);

  ASSERT_THAT(SplitCheckpoint(*src, root, "two", 2), IsOk());
  OPTSTEP_ASSERT_OK_AND_ASSIGN(auto two, CheckpointReader::Open(root, "two"));
  const Manifest& m = two->manifest();
  ASSERT_EQ(m.params.size(), 4u);
  for (size_t p = 0; p < 4; ++p) {
    EXPECT_EQ(m.params[p].owner, layout.owner[p]) << kParams[p];
    EXPECT_EQ(ShardOf(*two, "param/" + kParams[p]), layout.owner[p]) << kParams[p];
  }
  // Costs 12, 3, 10, 24: emb alone on one rank, w0 + w1 + b0 on the other.
  EXPECT_NE(layout.owner[3], layout.owner[0]);
  EXPECT_EQ(ShardOf(*two, "state/soap/w1/R"), layout.owner[2]);
  EXPECT_EQ(ShardOf(*two, "state/soap/w1/step"), layout.owner[2]);
  EXPECT_EQ(ShardOf(*two, "state/adamw/emb/empty"), layout.owner[3]);
  for (int r = 0; r < 2; ++r) {
    int counters = 0;
    for (const CheckpointTensor& t : two->ShardTensors(r)) {
      if (t.key == "meta/step" || t.key == "meta/skipped_steps" ||
          t.key == "state/adamw/group0/step" || t.key == "state/soap/group1/step") {
        ++counters;
      }
      if (t.key.rfind("param/", 0) == 0) {
        const std::string name = t.key.substr(6);
        for (size_t p = 0; p < 4; ++p) {
          if (kParams[p] == name) {
            EXPECT_EQ(layout.owner[p], r) << name;
          }
        }
      }
    }
    EXPECT_EQ(counters, 4) << "rank " << r;
  }
  EXPECT_THAT(SplitCheckpoint(*src, root, "zero", 0),
              StatusIs(absl::StatusCode::kInvalidArgument, "split into 0 ranks"));
  EXPECT_THAT(SplitCheckpoint(*src, root, "two", 2),
              StatusIs(absl::StatusCode::kAlreadyExists, "'two'"));
}

TEST(ReshardTest, ConflictingCopiesOfAReplicatedKeyAreRefused) {
  const std::string root = FreshDir("reshard");
  auto shards = testutil::SampleShards(2, kOwners);
  for (OwnedTensor& t : shards[1]) {
    if (t.key == "meta/step") t = testutil::I64Scalar("meta/step", 8);
  }
  ASSERT_THAT(testutil::WriteCheckpoint(root, "bad", testutil::SampleManifest(2, kOwners), shards),
              IsOk());
  OPTSTEP_ASSERT_OK_AND_ASSIGN(auto src, CheckpointReader::Open(root, "bad"));
  EXPECT_THAT(MergeCheckpoint(*src, root, "merged"),
              StatusIs(absl::StatusCode::kFailedPrecondition,
                       "tensor 'meta/step' differs in contents between shards 0 and 1"));
}

}  // namespace
}  // namespace optstep
