#include "server/engine/layout.h"

#include <algorithm>
#include <numeric>

namespace optstep {

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
  return layout;
}

}  // namespace optstep
