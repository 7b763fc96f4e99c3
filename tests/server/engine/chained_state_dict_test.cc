// Spec §7.2: split and merge of model-chunk-keyed chained optimizer state dicts, with the
// spec's examples and the regressions of the running-offset implementation.

#include "server/engine/chained_state_dict.h"

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/status_matchers.h"

namespace optstep {
namespace {

using ::optstep::testutil::IsOk;
using ::optstep::testutil::StatusIs;
using ::testing::ElementsAre;

StateTensor Value(float v) {
  StateTensor t;
  t.shape = {1};
  t.bytes.assign(reinterpret_cast<const char*>(&v), 4);
  return t;
}

// model<k> (or model_<k>) holds one tensor "param/p<k>" of value k, so a chunk's identity can
// be read back from its contents.
ChunkedStateDict Chunks(int n, const std::string& prefix = "model") {
  ChunkedStateDict dict;
  for (int k = 0; k < n; ++k) dict[absl::StrCat(prefix, k)]["param/p" + std::to_string(k)] = Value(k);
  return dict;
}

std::vector<std::string> Keys(const ChunkedStateDict& dict) {
  std::vector<std::string> keys;
  for (const auto& entry : dict) keys.push_back(entry.first);
  return keys;
}

TEST(ChainedStateDictTest, OneChunkThenSevenAreReindexedLocally) {
  const SubOptimizerChunks subs = {{0}, {1, 2, 3, 4, 5, 6, 7}};
  const ChunkedStateDict dict = Chunks(8);
  auto split = SplitChunkedStateDict(dict, subs);
  ASSERT_THAT(split.status(), IsOk());
  EXPECT_THAT(Keys((*split)[0]), ElementsAre("model0"));
  EXPECT_EQ((*split)[0].at("model0").count("param/p0"), 1u);
  ASSERT_EQ((*split)[1].size(), 7u);
  for (int i = 0; i < 7; ++i) {  // B's model<i> is the checkpoint's model<i+1>
    EXPECT_EQ((*split)[1].at(absl::StrCat("model", i)).count(absl::StrCat("param/p", i + 1)), 1u);
  }
  auto merged = MergeChunkedStateDicts(*split, subs);
  ASSERT_THAT(merged.status(), IsOk());
  EXPECT_EQ(Keys(*merged), Keys(dict));
  EXPECT_EQ((*merged).at("model7").count("param/p7"), 1u);
}

TEST(ChainedStateDictTest, MoeSubOptimizersThatBothSpanEveryChunkGetEveryChunk) {
  const SubOptimizerChunks subs = {{0, 1}, {0, 1}};  // dense and experts
  auto split = SplitChunkedStateDict(Chunks(2), subs);
  ASSERT_THAT(split.status(), IsOk());
  EXPECT_THAT(Keys((*split)[0]), ElementsAre("model0", "model1"));
  EXPECT_THAT(Keys((*split)[1]), ElementsAre("model0", "model1"));
  auto merged = MergeChunkedStateDicts(*split, subs);
  ASSERT_THAT(merged.status(), IsOk());
  EXPECT_EQ(Keys(*merged), Keys(Chunks(2)));
  // Shared chunks must agree.
  std::vector<ChunkedStateDict> differing = *split;
  differing[1]["model1"]["param/p1"] = Value(42);
  EXPECT_THAT(MergeChunkedStateDicts(differing, subs).status(),
              StatusIs(absl::StatusCode::kInvalidArgument, "'param/p1' differs"));
}

// The old running-offset walk asked the expert sub-optimizer for model1..model3 here (model3
// does not exist); by identity it gets model0..model2.
TEST(ChainedStateDictTest, ASubOptimizerSpanningEveryChunkAfterOneThatDoesNot) {
  const SubOptimizerChunks subs = {{0}, {0, 1, 2}};
  auto split = SplitChunkedStateDict(Chunks(3), subs);
  ASSERT_THAT(split.status(), IsOk());
  EXPECT_THAT(Keys((*split)[0]), ElementsAre("model0"));
  ASSERT_THAT(Keys((*split)[1]), ElementsAre("model0", "model1", "model2"));
  for (int i = 0; i < 3; ++i) {
    EXPECT_EQ((*split)[1].at(absl::StrCat("model", i)).count(absl::StrCat("param/p", i)), 1u);
  }
  auto merged = MergeChunkedStateDicts(*split, subs);
  ASSERT_THAT(merged.status(), IsOk());
  EXPECT_EQ(Keys(*merged), Keys(Chunks(3)));
}

// The old code gave a single-chunk dict only to the first sub-optimizer.
TEST(ChainedStateDictTest, ASingleChunkDictGoesWholeToEverySubOptimizer) {
  ChunkedStateDict dict;
  dict["model"]["param/w"] = Value(1);
  for (const SubOptimizerChunks& subs : {SubOptimizerChunks{{3}, {3}}, SubOptimizerChunks{{3}, {}}}) {
    auto split = SplitChunkedStateDict(dict, subs);
    ASSERT_THAT(split.status(), IsOk());
    ASSERT_EQ(split->size(), 2u);
    EXPECT_THAT(Keys((*split)[0]), ElementsAre("model"));
    EXPECT_THAT(Keys((*split)[1]), ElementsAre("model"));
    auto merged = MergeChunkedStateDicts(*split, subs);
    ASSERT_THAT(merged.status(), IsOk());
    EXPECT_THAT(Keys(*merged), ElementsAre("model"));
  }
}

TEST(ChainedStateDictTest, AMissingChunkKeyIsNamed) {
  EXPECT_THAT(SplitChunkedStateDict(Chunks(3), {{0}, {1, 2, 3}}).status(),
              StatusIs(absl::StatusCode::kInvalidArgument, "no key 'model3' for chunk 3"));
}

TEST(ChainedStateDictTest, UnderscorePrefixAndChunkIdsWithGaps) {
  // Chunk ids 4 and 9: global indices 0 and 1 (identity, not value).
  const SubOptimizerChunks subs = {{9}, {4, 9}};
  EXPECT_THAT(ChainChunkList(subs), ElementsAre(9, 4));
  auto split = SplitChunkedStateDict(Chunks(2, "model_"), subs);
  ASSERT_THAT(split.status(), IsOk());
  EXPECT_EQ((*split)[0].at("model_0").count("param/p0"), 1u);  // chunk 9 is global 0
  EXPECT_EQ((*split)[1].at("model_0").count("param/p1"), 1u);  // chunk 4 is global 1
  EXPECT_EQ((*split)[1].at("model_1").count("param/p0"), 1u);
  auto merged = MergeChunkedStateDicts(*split, subs);
  ASSERT_THAT(merged.status(), IsOk());
  EXPECT_EQ(Keys(*merged), Keys(Chunks(2, "model_")));
  std::vector<ChunkedStateDict> bad = *split;
  bad[0]["model_1"];
  EXPECT_THAT(MergeChunkedStateDicts(bad, subs).status(),
              StatusIs(absl::StatusCode::kInvalidArgument, "key 'model_1'"));
}

TEST(ChainedStateDictTest, AFlatDictByChunkAndBackByExactNames) {
  std::vector<ParamInfo> params = {ParamInfo{"layer.1", {1}}, ParamInfo{"layer.10", {1}}};
  params[0].model_chunk = 0;
  params[1].model_chunk = 1;
  StateDict flat;
  flat["param/layer.1"] = Value(1);
  flat["param/layer.10"] = Value(10);
  flat["state/adam/layer.10/exp_avg"] = Value(11);
  flat["state/adam/group0/step"] = Value(5);
  flat["meta/step"] = Value(5);
  const ChunkedStateDict chunked = SplitByModelChunk(flat, params, {0, 1});
  ASSERT_THAT(Keys(chunked), ElementsAre("model0", "model1"));
  EXPECT_EQ(chunked.at("model0").size(), 3u);  // layer.1 and both counters, never layer.10
  EXPECT_EQ(chunked.at("model1").size(), 4u);
  EXPECT_EQ(chunked.at("model1").count("state/adam/layer.10/exp_avg"), 1u);
  auto back = FlattenChunks(chunked);
  ASSERT_THAT(back.status(), IsOk());
  EXPECT_EQ(back->size(), flat.size());
  EXPECT_THAT(Keys(SplitByModelChunk(flat, params, {0})), ElementsAre("model"));
  ChunkedStateDict clash = chunked;
  clash["model1"]["meta/step"] = Value(6);
  EXPECT_THAT(FlattenChunks(clash).status(),
              StatusIs(absl::StatusCode::kInvalidArgument, "'meta/step' differs"));
}

}  // namespace
}  // namespace optstep
