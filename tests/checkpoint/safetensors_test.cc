#include "checkpoint/safetensors.h"

#include <string>

#include "gtest/gtest.h"
#include "tests/testing/status_matchers.h"

namespace optstep {
namespace {

using testutil::StatusIs;

// The JSON part of an encoded header (after the 8-byte length).
std::string Json(const std::string& encoded) { return encoded.substr(8); }

TEST(SafetensorsTest, EncodeThenParseRoundTrips) {
  std::vector<SafetensorsEntry> entries = {
      {"param/a", StateTensor::Type::kF32, {2, 3}},
      {"meta/step", StateTensor::Type::kI64, {}},
      {"state/x/a/empty", StateTensor::Type::kF32, {0, 7}},
  };
  OPTSTEP_ASSERT_OK_AND_ASSIGN(std::string header,
                               EncodeSafetensorsHeader(entries, {{"format", "pt"}}));
  EXPECT_EQ(header.size() % 8, 0u);
  EXPECT_EQ(entries[0].end, 24u);
  EXPECT_EQ(entries[1].begin, 24u);
  EXPECT_EQ(entries[1].end, 32u);
  EXPECT_EQ(entries[2].begin, 32u);
  EXPECT_EQ(entries[2].end, 32u);
  const uint64_t file_size = header.size() + 32;
  OPTSTEP_ASSERT_OK_AND_ASSIGN(uint64_t n, ParseSafetensorsHeaderLength(header, file_size, "f"));
  EXPECT_EQ(n, header.size() - 8);
  OPTSTEP_ASSERT_OK_AND_ASSIGN(SafetensorsHeader parsed,
                               ParseSafetensorsHeader(Json(header), file_size, "f"));
  EXPECT_EQ(parsed.data_start, header.size());
  EXPECT_EQ(parsed.metadata.at("format"), "pt");
  ASSERT_EQ(parsed.entries.size(), 3u);
  EXPECT_EQ(parsed.entries[0].key, "param/a");
  EXPECT_EQ(parsed.entries[0].shape, (Shape{2, 3}));
  EXPECT_EQ(parsed.entries[1].key, "meta/step");
  EXPECT_EQ(parsed.entries[1].type, StateTensor::Type::kI64);
  EXPECT_TRUE(parsed.entries[1].shape.empty());
}

TEST(SafetensorsTest, EncodeRefusesBadKeys) {
  std::vector<SafetensorsEntry> dup = {{"a", StateTensor::Type::kF32, {1}},
                                       {"a", StateTensor::Type::kF32, {1}}};
  EXPECT_THAT(EncodeSafetensorsHeader(dup, {}),
              StatusIs(absl::StatusCode::kInvalidArgument, "duplicate tensor key 'a'"));
  std::vector<SafetensorsEntry> reserved = {{"__metadata__", StateTensor::Type::kF32, {1}}};
  EXPECT_THAT(EncodeSafetensorsHeader(reserved, {}),
              StatusIs(absl::StatusCode::kInvalidArgument, "reserved"));
  std::vector<SafetensorsEntry> negative = {{"n", StateTensor::Type::kF32, {2, -1}}};
  EXPECT_THAT(EncodeSafetensorsHeader(negative, {}),
              StatusIs(absl::StatusCode::kInvalidArgument, "negative dimension"));
}

TEST(SafetensorsTest, HeaderLengthBounds) {
  const std::string tiny(4, '\0');
  EXPECT_THAT(ParseSafetensorsHeaderLength(tiny, 4, "f"),
              StatusIs(absl::StatusCode::kDataLoss, "shorter than the 8-byte"));
  std::string huge(8, '\xff');
  EXPECT_THAT(ParseSafetensorsHeaderLength(huge, 1000, "f"),
              StatusIs(absl::StatusCode::kDataLoss, "out of bounds"));
  std::string past("\x40\0\0\0\0\0\0\0", 8);  // 64 bytes of header in a 40-byte file
  EXPECT_THAT(ParseSafetensorsHeaderLength(past, 40, "f"),
              StatusIs(absl::StatusCode::kDataLoss, "header length 64"));
}

TEST(SafetensorsTest, AcceptsSpacePaddingAndAnyKeyOrder) {
  const std::string json = R"({"b": {"dtype": "F32", "shape": [1], "data_offsets": [4, 8]},)"
                           R"( "a": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]}}    )";
  OPTSTEP_ASSERT_OK_AND_ASSIGN(SafetensorsHeader h,
                               ParseSafetensorsHeader(json, 8 + json.size() + 8, "f"));
  ASSERT_EQ(h.entries.size(), 2u);
  EXPECT_EQ(h.entries[0].key, "a");  // data order
}

struct BadHeader {
  const char* label;
  std::string json;
  uint64_t data_bytes;
  absl::StatusCode code;
  const char* message;
};

class SafetensorsBadHeaderTest : public ::testing::TestWithParam<BadHeader> {};

TEST_P(SafetensorsBadHeaderTest, Refused) {
  const BadHeader& c = GetParam();
  EXPECT_THAT(ParseSafetensorsHeader(c.json, 8 + c.json.size() + c.data_bytes, "shard.st"),
              StatusIs(c.code, c.message));
}

INSTANTIATE_TEST_SUITE_P(
    Cases, SafetensorsBadHeaderTest,
    ::testing::Values(
        BadHeader{"not_json", R"({"a": {"dtype": )", 0, absl::StatusCode::kDataLoss,
                  "not a JSON object"},
        BadHeader{"array", R"([1, 2])", 0, absl::StatusCode::kDataLoss, "start with '{'"},
        BadHeader{"no_dtype", R"({"a": {"shape": [1], "data_offsets": [0, 4]}})", 4,
                  absl::StatusCode::kDataLoss, "tensor 'a': dtype missing"},
        BadHeader{"bf16", R"({"a": {"dtype": "BF16", "shape": [2], "data_offsets": [0, 4]}})", 4,
                  absl::StatusCode::kInvalidArgument, "dtype 'BF16'"},
        BadHeader{"negative_dim",
                  R"({"a": {"dtype": "F32", "shape": [-1], "data_offsets": [0, 4]}})", 4,
                  absl::StatusCode::kDataLoss, "not a non-negative integer"},
        BadHeader{"out_of_range",
                  R"({"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}})", 4,
                  absl::StatusCode::kDataLoss, "out of range of the 4-byte data section"},
        BadHeader{"reversed", R"({"a": {"dtype": "F32", "shape": [0], "data_offsets": [4, 0]}})", 4,
                  absl::StatusCode::kDataLoss, "data_offsets [4, 0] out of range"},
        BadHeader{"size_mismatch",
                  R"({"a": {"dtype": "I64", "shape": [1], "data_offsets": [0, 4]}})", 4,
                  absl::StatusCode::kDataLoss, "hold 4 bytes, not the I64 shape [1]"},
        BadHeader{"overlap",
                  R"({"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]},)"
                  R"( "b": {"dtype": "F32", "shape": [2], "data_offsets": [4, 12]}})",
                  12, absl::StatusCode::kDataLoss, "tensor 'b' at data_offsets [4, 12] overlaps"},
        BadHeader{"hole",
                  R"({"a": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]},)"
                  R"( "b": {"dtype": "F32", "shape": [1], "data_offsets": [8, 12]}})",
                  12, absl::StatusCode::kDataLoss, "leaves a hole"},
        BadHeader{"trailing_bytes",
                  R"({"a": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]}})", 8,
                  absl::StatusCode::kDataLoss, "cover 4 of the 8 bytes"},
        // Printed in the error message, a shape 200,000 arrays deep overflowed the stack.
        BadHeader{"nested_too_deep",
                  R"({"a": {"dtype": "F32", "shape": )" + std::string(200000, '[') +
                      std::string(200000, ']') + "}}",
                  0, absl::StatusCode::kDataLoss, "header nests 200002 levels deep, over 8"},
        BadHeader{"huge_shape",
                  R"({"a": {"dtype": "F32", "shape": [4294967296, 4294967296],)"
                  R"( "data_offsets": [0, 0]}})",
                  0, absl::StatusCode::kDataLoss, "hold 0 bytes"},
        BadHeader{"bad_metadata", R"({"__metadata__": {"k": 1}})", 0, absl::StatusCode::kDataLoss,
                  "__metadata__ value of 'k'"}),
    [](const ::testing::TestParamInfo<BadHeader>& info) { return info.param.label; });

}  // namespace
}  // namespace optstep
