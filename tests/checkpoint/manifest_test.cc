#include "checkpoint/manifest.h"

#include <string>

#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tests/checkpoint/checkpoint_test_util.h"
#include "tests/testing/status_matchers.h"

namespace optstep {
namespace {

using testutil::StatusIs;

Manifest Sample() {
  Manifest m = testutil::SampleManifest(2, {0, 1, 1, 0});
  m.shards = {{"shard-0-of-2.safetensors", 100, 0xdeadbeef},
              {"shard-1-of-2.safetensors", 200, 0x00000001}};
  return m;
}

// Serialises the sample, lets `edit` change the JSON, and parses the result.
absl::StatusOr<Manifest> ParseEdited(void (*edit)(nlohmann::json&)) {
  absl::StatusOr<std::string> text = SerializeManifest(Sample());
  if (!text.ok()) return text.status();
  nlohmann::json j = nlohmann::json::parse(*text);
  edit(j);
  return ParseManifest(j.dump());
}

TEST(ManifestTest, RoundTrips) {
  OPTSTEP_ASSERT_OK_AND_ASSIGN(std::string text, SerializeManifest(Sample()));
  OPTSTEP_ASSERT_OK_AND_ASSIGN(Manifest m, ParseManifest(text));
  const Manifest want = Sample();
  EXPECT_EQ(m.format_version, 1);
  EXPECT_EQ(m.world_size, 2);
  EXPECT_EQ(m.step, 7u);
  EXPECT_EQ(m.skipped_steps, 1u);
  ASSERT_EQ(m.params.size(), 4u);
  for (size_t p = 0; p < 4; ++p) {
    EXPECT_EQ(m.params[p].name, want.params[p].name);
    EXPECT_EQ(m.params[p].shape, want.params[p].shape);
    EXPECT_EQ(m.params[p].model_chunk, want.params[p].model_chunk);
    EXPECT_EQ(m.params[p].owner, want.params[p].owner);
    EXPECT_EQ(m.params[p].cost, want.params[p].cost);
  }
  ASSERT_EQ(m.shards.size(), 2u);
  EXPECT_EQ(m.shards[0].crc32c, 0xdeadbeefu);
  EXPECT_EQ(m.shards[1].bytes, 200u);
  EXPECT_EQ(nlohmann::json::parse(m.definition), nlohmann::json::parse(want.definition));
  EXPECT_EQ(nlohmann::json::parse(m.optimizer), nlohmann::json::parse(want.optimizer));
  OPTSTEP_ASSERT_OK_AND_ASSIGN(std::string digest, DefinitionDigest(want.definition));
  EXPECT_EQ(m.definition_digest, digest);
}

TEST(ManifestTest, DigestIgnoresFormattingButNotContent) {
  OPTSTEP_ASSERT_OK_AND_ASSIGN(std::string a, DefinitionDigest(R"({"b": 1, "a": [1, 2]})"));
  OPTSTEP_ASSERT_OK_AND_ASSIGN(std::string b, DefinitionDigest("{\"a\":[1,2],\n \"b\":1}"));
  OPTSTEP_ASSERT_OK_AND_ASSIGN(std::string c, DefinitionDigest(R"({"b": 1, "a": [2, 1]})"));
  EXPECT_EQ(a, b);
  EXPECT_NE(a, c);
  EXPECT_EQ(a.size(), 7u + 64u);
  // sha256 of the canonical text {"a":[1,2],"b":1}.
  EXPECT_EQ(a, "sha256:94a786c3662bc7beeb598efa7d8cb58d7bea25d6c275ea9785a0230ff1f8c2ba");
  EXPECT_THAT(DefinitionDigest("{nope"),
              StatusIs(absl::StatusCode::kInvalidArgument, "'definition' is not valid JSON"));
}

TEST(ManifestTest, UnsupportedVersionIsFailedPrecondition) {
  EXPECT_THAT(ParseEdited([](nlohmann::json& j) { j["format_version"] = 2; }),
              StatusIs(absl::StatusCode::kFailedPrecondition, "format_version 2 is not supported"));
}

TEST(ManifestTest, MalformedFieldsAreDataLossNamingTheField) {
  EXPECT_THAT(ParseManifest("{\"format_version\": 1,"),
              StatusIs(absl::StatusCode::kDataLoss, "'(whole file)' is not valid JSON"));
  EXPECT_THAT(ParseEdited([](nlohmann::json& j) { j.erase("world_size"); }),
              StatusIs(absl::StatusCode::kDataLoss, "'world_size' is missing"));
  EXPECT_THAT(ParseEdited([](nlohmann::json& j) { j["step"] = -3; }),
              StatusIs(absl::StatusCode::kDataLoss, "'step' is missing or not a non-negative"));
  EXPECT_THAT(ParseEdited([](nlohmann::json& j) { j["params"][1]["shape"] = "3"; }),
              StatusIs(absl::StatusCode::kDataLoss, "'params[1].shape'"));
  EXPECT_THAT(ParseEdited([](nlohmann::json& j) { j["params"][2]["owner"] = 5; }),
              StatusIs(absl::StatusCode::kDataLoss, "params[2] 'w1': owner 5"));
  EXPECT_THAT(ParseEdited([](nlohmann::json& j) { j["params"][3]["name"] = "w0"; }),
              StatusIs(absl::StatusCode::kDataLoss, "params[3].name 'w0' is empty or repeated"));
  EXPECT_THAT(ParseEdited([](nlohmann::json& j) { j["shards"][1]["crc32c"] = "xyz"; }),
              StatusIs(absl::StatusCode::kDataLoss, "'shards[1].crc32c'"));
  EXPECT_THAT(ParseEdited([](nlohmann::json& j) { j["shards"].erase(1); }),
              StatusIs(absl::StatusCode::kDataLoss, "1 shards for world_size 2"));
  EXPECT_THAT(ParseEdited([](nlohmann::json& j) { j["shards"][0]["file"] = "../x"; }),
              StatusIs(absl::StatusCode::kDataLoss, "shards[0].file '../x'"));
  EXPECT_THAT(ParseEdited([](nlohmann::json& j) { j["definition"]["name"] = "other"; }),
              StatusIs(absl::StatusCode::kDataLoss, "'definition_digest'"));
}

// A manifest nesting its definition 200,000 arrays deep (planted on the shared disk) is refused
// before it is parsed: printing it (the digest) recursed once per level and overflowed the stack,
// in every tenant's pruning after a save and in the restore at start.
TEST(ManifestTest, ADefinitionNestedTooDeepIsDataLoss) {
  const std::string deep = std::string(200000, '[') + std::string(200000, ']');
  const std::string text =
      R"({"format_version": 1, "definition_digest": "x", "definition": )" + deep + "}";
  EXPECT_THAT(ParseManifest(text),
              StatusIs(absl::StatusCode::kDataLoss, "nests 200001 levels deep, over 64"));
}

TEST(ManifestTest, SerializeRefusesInconsistentManifests) {
  Manifest m = Sample();
  m.params[0].owner = 2;
  EXPECT_THAT(SerializeManifest(m),
              StatusIs(absl::StatusCode::kInvalidArgument, "params[0] 'w0': owner 2"));
  m = Sample();
  m.definition = "not json";
  EXPECT_THAT(SerializeManifest(m), StatusIs(absl::StatusCode::kInvalidArgument, "definition"));
  m = Sample();
  m.params[1].cost = -1;
  EXPECT_THAT(SerializeManifest(m), StatusIs(absl::StatusCode::kInvalidArgument, "cost -1"));
}

}  // namespace
}  // namespace optstep
