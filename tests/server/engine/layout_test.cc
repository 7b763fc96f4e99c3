#include "server/engine/layout.h"

#include <vector>

#include "gtest/gtest.h"

namespace optstep {
namespace {

TEST(PartitionByCostTest, SingleRankOwnsEverything) {
  Layout layout = PartitionByCost({5, 1, 3}, 1);
  EXPECT_EQ(layout.world_size, 1);
  EXPECT_EQ(layout.owner, (std::vector<int>{0, 0, 0}));
}

TEST(PartitionByCostTest, LongestFirstToTheLeastLoadedRankDeterministically) {
  // Sorted: 8(p1) -> r0, 5(p0) -> r1, 4(p3) -> r1 (5 < 8), 3(p2) -> r0 (8 < 9).
  Layout layout = PartitionByCost({5, 8, 3, 4}, 2);
  EXPECT_EQ(layout.owner, (std::vector<int>{1, 0, 0, 1}));
  EXPECT_EQ(PartitionByCost({5, 8, 3, 4}, 2).owner, layout.owner);
}

TEST(PartitionByCostTest, EqualCostsGoRoundRobinByIndex) {
  Layout layout = PartitionByCost({1, 1, 1, 1}, 4);
  EXPECT_EQ(layout.owner, (std::vector<int>{0, 1, 2, 3}));
}

}  // namespace
}  // namespace optstep
