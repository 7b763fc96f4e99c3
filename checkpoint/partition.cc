#include "checkpoint/partition.h"

#include <algorithm>
#include <numeric>

namespace optstep {

namespace {

// Moves or swaps parameters between the most loaded rank and the others while that lowers the
// larger of the two loads (a bounded, deterministic refinement of the LPT assignment).
void Refine(const std::vector<double>& costs, Layout& layout, std::vector<double>& load) {
  const int world = layout.world_size;
  for (int round = 0; round < 64 * world; ++round) {
    const int hot = static_cast<int>(std::max_element(load.begin(), load.end()) - load.begin());
    double best_peak = load[hot];
    int best_item = -1, best_other = -1, best_rank = -1;
    for (size_t i = 0; i < costs.size(); ++i) {
      if (layout.owner[i] != hot) continue;
      for (int r = 0; r < world; ++r) {
        if (r == hot) continue;
        // Move i to r.
        double peak = std::max(load[hot] - costs[i], load[r] + costs[i]);
        if (peak < best_peak) {
          best_peak = peak, best_item = static_cast<int>(i), best_other = -1, best_rank = r;
        }
        // Swap i with j on r.
        for (size_t j = 0; j < costs.size(); ++j) {
          if (layout.owner[j] != r || costs[j] >= costs[i]) continue;
          peak = std::max(load[hot] - costs[i] + costs[j], load[r] + costs[i] - costs[j]);
          if (peak < best_peak) {
            best_peak = peak, best_item = static_cast<int>(i), best_other = static_cast<int>(j),
            best_rank = r;
          }
        }
      }
    }
    if (best_item < 0 || best_peak >= load[hot] * (1.0 - 1e-12)) return;
    load[hot] -= costs[best_item];
    load[best_rank] += costs[best_item];
    layout.owner[best_item] = best_rank;
    if (best_other >= 0) {
      load[best_rank] -= costs[best_other];
      load[hot] += costs[best_other];
      layout.owner[best_other] = hot;
    }
  }
}

}  // namespace

Layout PartitionByCost(const std::vector<double>& costs, int world_size) {
  Layout layout;
  layout.world_size = world_size;
  layout.owner.assign(costs.size(), 0);
  std::vector<int> order(costs.size());
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(),
                   [&costs](int a, int b) { return costs[a] > costs[b]; });
  std::vector<double> load(world_size, 0.0);
  for (int param : order) {
    const int rank = static_cast<int>(std::min_element(load.begin(), load.end()) - load.begin());
    layout.owner[param] = rank;
    load[rank] += costs[param];
  }
  Refine(costs, layout, load);
  return layout;
}

Layout PartitionBaseline(const std::vector<int64_t>& numels, int world_size) {
  Layout layout;
  layout.world_size = world_size;
  layout.owner.assign(numels.size(), 0);
  std::vector<int> order(numels.size());
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(),
                   [&numels](int a, int b) { return numels[a] < numels[b]; });
  for (size_t i = 0; i < order.size(); ++i) {
    const int phase = static_cast<int>(i % (2 * world_size));
    layout.owner[order[i]] = phase < world_size ? phase : 2 * world_size - 1 - phase;
  }
  return layout;
}

double Imbalance(const Layout& layout, const std::vector<double>& weights) {
  std::vector<double> load(layout.world_size, 0.0);
  for (size_t p = 0; p < weights.size(); ++p) load[layout.owner[p]] += weights[p];
  const double total = std::accumulate(load.begin(), load.end(), 0.0);
  if (total == 0.0) return 1.0;
  return *std::max_element(load.begin(), load.end()) / (total / layout.world_size);
}

}  // namespace optstep
