#include "checkpoint/partition.h"

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

TEST(PartitionBaselineTest, ReproducesTheReferenceFourRankExample) {
  // p0..p9 already sorted by size: rank 0 {p0, p7, p8}, 1 {p1, p6, p9}, 2 {p2, p5}, 3 {p3, p4}.
  Layout layout = PartitionBaseline({1, 2, 3, 4, 5, 6, 7, 8, 9, 10}, 4);
  EXPECT_EQ(layout.owner, (std::vector<int>{0, 1, 2, 3, 3, 2, 1, 0, 0, 1}));
}

TEST(PartitionTest, CostBalanceBeatsTheBaselineOnTheSpecExample) {
  // Two 4096x4096 and two 1024x16384 Muon matrices: same numel, Muon cost 4:1 (spec §6).
  const std::vector<int64_t> numels(4, 16777216);
  const std::vector<double> costs = {6.87e10, 1.72e10, 1.72e10, 6.87e10};
  const Layout baseline = PartitionBaseline(numels, 2);
  const Layout lpt = PartitionByCost(costs, 2);
  EXPECT_NEAR(Imbalance(baseline, costs), 1.6, 0.01);
  EXPECT_NEAR(Imbalance(lpt, costs), 1.0, 1e-9);
  for (int owner : lpt.owner) EXPECT_TRUE(owner == 0 || owner == 1);
}

TEST(PartitionTest, EveryParameterHasExactlyOneValidOwner) {
  std::vector<double> costs;
  for (int i = 0; i < 97; ++i) costs.push_back((i * 37) % 11 + 1);
  for (int world : {1, 2, 3, 8, 64}) {
    const Layout layout = PartitionByCost(costs, world);
    ASSERT_EQ(layout.owner.size(), costs.size());
    for (int owner : layout.owner) EXPECT_TRUE(owner >= 0 && owner < world);
    EXPECT_EQ(PartitionByCost(costs, world).owner, layout.owner);
  }
}

}  // namespace
}  // namespace optstep
