#include "checkpoint/partition.h"

#include <algorithm>
#include <cstdint>
#include <random>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/status_matchers.h"

namespace optstep {
namespace {

using ::optstep::testutil::StatusIs;

// Independent reference: every assignment of `costs.size()` parameters to `world` ranks.
struct BruteForce {
  double best_cost = -1;    // least peak cost with every rank's bytes within the cap; -1: none
  int64_t least_bytes = 0;  // least peak bytes of any assignment
  double least_cost = 0;    // least peak cost of any assignment
};

BruteForce Enumerate(const std::vector<double>& costs, const std::vector<int64_t>& bytes, int world,
                     int64_t cap) {
  BruteForce out;
  out.least_bytes = INT64_MAX;
  out.least_cost = 1e300;
  std::vector<int> owner(costs.size(), 0);
  while (true) {
    std::vector<double> load(world, 0.0);
    std::vector<int64_t> mem(world, 0);
    for (size_t i = 0; i < costs.size(); ++i) load[owner[i]] += costs[i], mem[owner[i]] += bytes[i];
    const double peak = *std::max_element(load.begin(), load.end());
    const int64_t peak_bytes = *std::max_element(mem.begin(), mem.end());
    out.least_bytes = std::min(out.least_bytes, peak_bytes);
    out.least_cost = std::min(out.least_cost, peak);
    if (peak_bytes <= cap && (out.best_cost < 0 || peak < out.best_cost)) out.best_cost = peak;
    size_t i = 0;
    while (i < owner.size() && ++owner[i] == world) owner[i++] = 0;
    if (i == owner.size()) return out;
  }
}

double PeakCost(const Layout& layout, const std::vector<double>& costs) {
  const std::vector<double> load = RankLoads(layout, costs);
  return *std::max_element(load.begin(), load.end());
}

int64_t PeakBytes(const Layout& layout, const std::vector<int64_t>& bytes) {
  const std::vector<double> load =
      RankLoads(layout, std::vector<double>(bytes.begin(), bytes.end()));
  return static_cast<int64_t>(*std::max_element(load.begin(), load.end()));
}

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

// The cost partition as first written: LPT, then moves and swaps off the most loaded rank,
// scanning every parameter for each candidate rank. PartitionByCost must give the same layouts.
Layout ReferenceLpt(const std::vector<double>& costs, int world) {
  Layout layout;
  layout.world_size = world;
  layout.owner.assign(costs.size(), 0);
  std::vector<int> order(costs.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = static_cast<int>(i);
  std::stable_sort(order.begin(), order.end(), [&](int a, int b) { return costs[a] > costs[b]; });
  std::vector<double> load(world, 0.0);
  for (int param : order) {
    const int rank = static_cast<int>(std::min_element(load.begin(), load.end()) - load.begin());
    layout.owner[param] = rank;
    load[rank] += costs[param];
  }
  for (int round = 0; round < 64 * world; ++round) {
    const int hot = static_cast<int>(std::max_element(load.begin(), load.end()) - load.begin());
    double best = load[hot];
    int item = -1, other = -1, to = -1;
    for (size_t i = 0; i < costs.size(); ++i) {
      if (layout.owner[i] != hot) continue;
      for (int r = 0; r < world; ++r) {
        if (r == hot) continue;
        double peak = std::max(load[hot] - costs[i], load[r] + costs[i]);
        if (peak < best) best = peak, item = static_cast<int>(i), other = -1, to = r;
        for (size_t j = 0; j < costs.size(); ++j) {
          if (layout.owner[j] != r || costs[j] >= costs[i]) continue;
          peak = std::max(load[hot] - costs[i] + costs[j], load[r] + costs[i] - costs[j]);
          if (peak < best)
            best = peak, item = static_cast<int>(i), other = static_cast<int>(j), to = r;
        }
      }
    }
    if (item < 0 || best >= load[hot] * (1.0 - 1e-12)) break;
    load[hot] -= costs[item], load[to] += costs[item], layout.owner[item] = to;
    if (other >= 0) load[to] -= costs[other], load[hot] += costs[other], layout.owner[other] = hot;
  }
  return layout;
}

TEST(PartitionByCostTest, SameLayoutsAsTheReference) {
  std::mt19937 rng(3);
  for (int trial = 0; trial < 40; ++trial) {
    const int world = 2 + trial % 7;
    std::vector<double> costs;
    const int n = 10 + trial * 3;
    for (int i = 0; i < n; ++i) {
      costs.push_back(std::uniform_int_distribution<int>(1, trial % 2 ? 5 : 1000)(rng));
    }
    EXPECT_EQ(PartitionByCost(costs, world).owner, ReferenceLpt(costs, world).owner)
        << "trial " << trial;
  }
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

// `count` random cases of `n` parameters (costs and bytes 1..30) over `world` ranks, under caps
// of 1, 1.1 and 1.3 times the least peak bytes any assignment has, against Enumerate.
struct Tally {
  int cases[3] = {}, found[3] = {}, optimal[3] = {};
  double worst = 1.0;  // the largest peak cost over the optimum's
};

Tally AgainstBruteForce(int world, int n, int count, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_int_distribution<int> draw(1, 30);
  Tally tally;
  for (int trial = 0; trial < count; ++trial) {
    std::vector<double> costs;
    std::vector<int64_t> bytes;
    for (int i = 0; i < n; ++i) costs.push_back(draw(rng)), bytes.push_back(draw(rng));
    const BruteForce free = Enumerate(costs, bytes, world, INT64_MAX);
    EXPECT_LE(PeakLowerBound(costs, world), free.least_cost + 1e-9);
    EXPECT_LE(PeakLowerBound(std::vector<double>(bytes.begin(), bytes.end()), world),
              free.least_bytes + 1e-9);
    const double slacks[3] = {1.0, 1.1, 1.3};
    for (int k = 0; k < 3; ++k) {
      const int64_t cap = static_cast<int64_t>(free.least_bytes * slacks[k]);
      const BruteForce ref = Enumerate(costs, bytes, world, cap);
      ++tally.cases[k];
      const absl::StatusOr<Layout> layout = PartitionWithinMemory(costs, bytes, world, cap);
      if (!layout.ok()) {
        EXPECT_THAT(layout, StatusIs(absl::StatusCode::kResourceExhausted, "the cap is"));
        continue;
      }
      ++tally.found[k];
      EXPECT_LE(PeakBytes(*layout, bytes), cap);
      EXPECT_EQ(PartitionWithinMemory(costs, bytes, world, cap)->owner, layout->owner);
      const double ratio = PeakCost(*layout, costs) / ref.best_cost;
      EXPECT_GE(ratio, 1.0 - 1e-12);
      tally.worst = std::max(tally.worst, ratio);
      if (ratio <= 1.0 + 1e-12) ++tally.optimal[k];
    }
  }
  return tally;
}

TEST(PartitionWithinMemoryTest, TwoRanksOfFewParametersGetTheOptimum) {
  // Two ranks holding at most 14 parameters together are re-split over every subset.
  for (int n : {5, 8, 10}) {
    const Tally tally = AgainstBruteForce(2, n, 60, 11 + n);
    for (int k = 0; k < 3; ++k) {
      EXPECT_EQ(tally.found[k], tally.cases[k]) << "n " << n << " cap " << k;
      EXPECT_EQ(tally.optimal[k], tally.cases[k]) << "n " << n << " cap " << k;
    }
  }
}

TEST(PartitionWithinMemoryTest, ThreeAndFourRanksNearTheOptimum) {
  for (int world : {3, 4}) {
    const Tally tally = AgainstBruteForce(world, world == 3 ? 8 : 7, 150, 7 + world);
    // The tight cap (a bin-packing optimum) is met almost always, any looser one always.
    EXPECT_GE(tally.found[0], 0.95 * tally.cases[0]) << "world " << world;
    for (int k = 1; k < 3; ++k) EXPECT_EQ(tally.found[k], tally.cases[k]) << "world " << world;
    int optimal = 0, found = 0;
    for (int k = 0; k < 3; ++k) optimal += tally.optimal[k], found += tally.found[k];
    EXPECT_GE(optimal, 0.95 * found) << "world " << world;
    EXPECT_LE(tally.worst, 1.5) << "world " << world;
  }
}

TEST(PartitionWithinMemoryTest, RefusesWhenNoPlacementFitsTheCap) {
  // {10} and {7, 5} is the least peak (12); the bound: 7 + 5 of the 3 largest on 2 ranks.
  EXPECT_THAT(PartitionWithinMemory({1, 1, 1}, {10, 7, 5}, 2, 11),
              StatusIs(absl::StatusCode::kResourceExhausted,
                       "no placement of 3 parameters over 2 ranks fits the cap of 11 owned bytes "
                       "per rank: the least peak found: rank 1 owns 12 bytes of parameter state "
                       "(2 parameters); the cap is 11 bytes per rank; no placement's peak is "
                       "below 12"));
  OPTSTEP_ASSERT_OK_AND_ASSIGN(Layout fits, PartitionWithinMemory({1, 1, 1}, {10, 7, 5}, 2, 12));
  EXPECT_EQ(PeakBytes(fits, {10, 7, 5}), 12);
}

TEST(CheckOwnedBytesTest, NamesTheRankItsBytesAndTheCap) {
  Layout layout;
  layout.world_size = 3;
  layout.owner = {0, 1, 1, 2};
  EXPECT_THAT(CheckOwnedBytes(layout, {5, 6, 7, 1}, 13), testutil::IsOk());
  EXPECT_THAT(CheckOwnedBytes(layout, {5, 6, 7, 1}, 12),
              StatusIs(absl::StatusCode::kResourceExhausted,
                       "rank 1 owns 13 bytes of parameter state (2 parameters); the cap is 12 "
                       "bytes per rank"));
  EXPECT_THAT(CheckOwnedBytes(layout, {5, 6, 7, 1}, 4),
              StatusIs(absl::StatusCode::kResourceExhausted, "rank 0 owns 5 bytes"));
}

TEST(PeakLowerBoundTest, MeanLargestAndPigeonhole) {
  EXPECT_DOUBLE_EQ(PeakLowerBound({4, 4, 4, 4}, 2), 8.0);         // the mean
  EXPECT_DOUBLE_EQ(PeakLowerBound({9, 1, 1, 1}, 2), 9.0);         // the largest
  EXPECT_DOUBLE_EQ(PeakLowerBound({5, 5, 5, 1, 1, 1}, 2), 10.0);  // 2 of the 3 largest
}

// A GPT-like layout (hidden 768, 12 layers, vocabulary 50257): step costs of Muon for the hidden
// matrices (numel · the smaller side / 64) and AdamW elsewhere (numel); owned bytes 12 per element
// for Muon (master, gradient, momentum), 16 for AdamW (two moments).
void GptLike(std::vector<double>& costs, std::vector<int64_t>& bytes) {
  const int64_t h = 768, ffn = 3072, vocab = 50257;
  auto add = [&](int64_t rows, int64_t cols, bool muon) {
    const int64_t numel = rows * cols;
    costs.push_back(muon ? numel * static_cast<double>(std::min(rows, cols)) / 64 : numel);
    bytes.push_back(numel * (muon ? 12 : 16));
  };
  add(vocab, h, false);
  add(1024, h, true);
  for (int l = 0; l < 12; ++l) {
    add(1, h, false), add(1, h, false), add(3 * h, h, true), add(1, 3 * h, false);
    add(h, h, true), add(1, h, false), add(1, h, false), add(1, h, false);
    add(ffn, h, true), add(1, ffn, false), add(h, ffn, true), add(1, h, false);
  }
  add(1, h, false), add(1, h, false);
}

TEST(PartitionByCostAndMemoryTest, BalancesMemoryWithinTheCostSlack) {
  std::vector<double> costs;
  std::vector<int64_t> bytes;
  GptLike(costs, bytes);
  const std::vector<double> weights(bytes.begin(), bytes.end());
  for (int world : {2, 3, 4, 8, 16, 64}) {
    const Layout by_cost = PartitionByCost(costs, world);
    const Layout both = PartitionByCostAndMemory(costs, bytes, world);
    EXPECT_EQ(PartitionByCostAndMemory(costs, bytes, world).owner, both.owner);
    EXPECT_LE(PeakCost(both, costs), PeakCost(by_cost, costs) * (1 + kMemoryBalanceCostSlack));
    EXPECT_LE(PeakBytes(both, bytes), PeakBytes(by_cost, bytes)) << "world " << world;
    const double bound = PeakLowerBound(weights, world);
    EXPECT_GE(PeakBytes(both, bytes), bound * (1 - 1e-12));
    if (PeakBytes(by_cost, bytes) > bound * (1 + kMemoryBalanceCostSlack)) {
      EXPECT_LT(PeakBytes(both, bytes), PeakBytes(by_cost, bytes)) << "world " << world;
    } else {
      EXPECT_EQ(both.owner, by_cost.owner) << "world " << world;
    }
  }
}

TEST(PartitionByCostAndMemoryTest, KeepsTheCostPartitionWhenItsMemoryIsBalanced) {
  // Bytes in proportion to the costs: the cost partition is the memory partition.
  const std::vector<double> costs = {5, 8, 3, 4, 6, 2};
  const std::vector<int64_t> bytes = {50, 80, 30, 40, 60, 20};
  for (int world : {1, 2, 3}) {
    EXPECT_EQ(PartitionByCostAndMemory(costs, bytes, world).owner,
              PartitionByCost(costs, world).owner);
  }
}

}  // namespace
}  // namespace optstep
