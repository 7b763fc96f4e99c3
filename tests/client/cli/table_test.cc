#include "client/cli/table.h"

#include "gtest/gtest.h"

namespace optstep {
namespace cli {
namespace {

TEST(TextTableTest, PadsColumnsAndAlignsNumbersRight) {
  TextTable table({{"ID"}, {"NAME"}, {"STEP", true}});
  table.AddRow({"a1", "gpt", "7"});
  table.AddRow({"b", "llama-large", "1200"});
  EXPECT_EQ(table.num_rows(), 2u);
  EXPECT_EQ(table.Render(),
            "ID  NAME         STEP\n"
            "a1  gpt             7\n"
            "b   llama-large  1200\n");
}

TEST(TextTableTest, NoTrailingSpacesInALeftAlignedLastColumn) {
  TextTable table({{"K"}, {"VALUE"}});
  table.AddRow({"x", "1"});
  table.AddRow({"long key", "longer value"});
  EXPECT_EQ(table.Render(),
            "K         VALUE\n"
            "x         1\n"
            "long key  longer value\n");
}

TEST(TextTableTest, HeaderOnly) {
  TextTable table({{"A", true}, {"B"}});
  EXPECT_EQ(table.Render(), "A  B\n");
}

TEST(TextTableDeathTest, RowOfTheWrongWidthIsABug) {
  TextTable table({{"A"}, {"B"}});
  EXPECT_DEATH(table.AddRow({"only one"}), "row width");
}

}  // namespace
}  // namespace cli
}  // namespace optstep
