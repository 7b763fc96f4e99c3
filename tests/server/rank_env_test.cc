#include "server/rank_env.h"

#include "gtest/gtest.h"
#include "tests/testing/status_matchers.h"

namespace optstep {
namespace {

using ::optstep::testutil::StatusIs;

TEST(RankEnvTest, TheFlagWinsThenThePodOrdinal) {
  EXPECT_EQ(*ResolveRank(2, "optstep-5"), 2);
  EXPECT_EQ(*ResolveRank(-1, "optstep-5"), 5);
  EXPECT_EQ(*ResolveRank(-1, "my-optimizer-ranks-12"), 12);
  EXPECT_EQ(*ResolveRank(-1, std::nullopt), 0);
}

TEST(RankEnvTest, APodNameWithoutAnOrdinalIsRefused) {
  for (const char* pod : {"optstep", "optstep-", "optstep-x1", "optstep-1a"}) {
    EXPECT_THAT(ResolveRank(-1, pod),
                StatusIs(absl::StatusCode::kInvalidArgument, "does not end in a StatefulSet"))
        << pod;
  }
}

TEST(RankEnvTest, WorldSizeFromTheFlagOrWorldSize) {
  EXPECT_EQ(*ResolveWorldSize(3, "8"), 3);
  EXPECT_EQ(*ResolveWorldSize(0, "8"), 8);
  EXPECT_EQ(*ResolveWorldSize(0, std::nullopt), 1);
  EXPECT_THAT(ResolveWorldSize(0, "0"), StatusIs(absl::StatusCode::kInvalidArgument,
                                                 "OPTSTEP_WORLD_SIZE '0' is not a positive"));
  EXPECT_THAT(ResolveWorldSize(0, "four"), StatusIs(absl::StatusCode::kInvalidArgument));
}

}  // namespace
}  // namespace optstep
