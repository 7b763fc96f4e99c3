// JsonNestingDepth: arrays and objects count, brackets inside strings (also after an escaped
// quote) do not.

#include "base/json_depth.h"

#include <string>

#include "gtest/gtest.h"

namespace optstep {
namespace {

TEST(JsonDepthTest, CountsArraysAndObjectsOutsideStrings) {
  EXPECT_EQ(JsonNestingDepth(""), 0u);
  EXPECT_EQ(JsonNestingDepth("1"), 0u);
  EXPECT_EQ(JsonNestingDepth("{}"), 1u);
  EXPECT_EQ(JsonNestingDepth(R"({"a": [1, {"b": [2]}], "c": []})"), 4u);
  EXPECT_EQ(JsonNestingDepth(R"({"a": "[[[[", "b": "\"[[[[\\"})"), 1u);
  EXPECT_EQ(JsonNestingDepth(std::string(100000, '[') + std::string(100000, ']')), 100000u);
  EXPECT_EQ(JsonNestingDepth("]]]{"), 1u);  // not JSON: still an answer
}

}  // namespace
}  // namespace optstep
