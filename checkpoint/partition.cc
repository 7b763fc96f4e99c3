#include "checkpoint/partition.h"

#include <algorithm>
#include <cmath>
#include <functional>
#include <limits>
#include <numeric>

#include "absl/strings/str_cat.h"

namespace optstep {

namespace {

constexpr int64_t kNoCap = std::numeric_limits<int64_t>::max();

// A layout with its ranks' loads: `load` of the weights it is balanced on, `bytes` of the owned
// bytes it is constrained by, and each rank's parameters in ascending id.
struct Placement {
  Layout layout;
  std::vector<double> load;
  std::vector<int64_t> bytes;
  std::vector<std::vector<int>> items;

  Placement(int world, size_t params) : load(world, 0.0), bytes(world, 0), items(world) {
    layout.world_size = world;
    layout.owner.assign(params, 0);
  }

  void Assign(int param, int rank, double weight, int64_t size) {
    layout.owner[param] = rank;
    load[rank] += weight;
    bytes[rank] += size;
    std::vector<int>& list = items[rank];
    list.insert(std::lower_bound(list.begin(), list.end(), param), param);
  }

  void Unassign(int param, double weight, int64_t size) {
    const int rank = layout.owner[param];
    load[rank] -= weight;
    bytes[rank] -= size;
    std::vector<int>& list = items[rank];
    list.erase(std::lower_bound(list.begin(), list.end(), param));
  }

  double PeakLoad() const { return *std::max_element(load.begin(), load.end()); }
  int64_t PeakBytes() const { return *std::max_element(bytes.begin(), bytes.end()); }
};

// Parameter ids in descending `weights` (ties by id).
std::vector<int> Descending(const std::vector<double>& weights) {
  std::vector<int> order(weights.size());
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(),
                   [&weights](int a, int b) { return weights[a] > weights[b]; });
  return order;
}

// Places the parameters in `order`, each on the rank of least `weights` load (ties by rank) among
// those where its bytes stay within `cap`. False when one fits on no rank.
bool PlaceGreedily(const std::vector<int>& order, const std::vector<double>& weights,
                   const std::vector<int64_t>& bytes, int64_t cap, Placement& out) {
  const int world = out.layout.world_size;
  for (int param : order) {
    int best = -1;
    for (int r = 0; r < world; ++r) {
      if (out.bytes[r] > cap - bytes[param]) continue;
      if (best < 0 || out.load[r] < out.load[best]) best = r;
    }
    if (best < 0) return false;
    out.Assign(param, best, weights[param], bytes[param]);
  }
  return true;
}

// Moves or swaps parameters between the most loaded rank and the others while that lowers the
// larger of the two loads and keeps both ranks' bytes within `cap` (a bounded, deterministic
// refinement of a greedy placement); stops before a round once `work` (pairs looked at, counted
// down) is spent.
void Refine(const std::vector<double>& weights, const std::vector<int64_t>& bytes, int64_t cap,
            Placement& p, int64_t& work) {
  const int world = p.layout.world_size;
  std::vector<double>& load = p.load;
  auto fits = [&](int rank, int64_t in, int64_t out) { return p.bytes[rank] - out <= cap - in; };
  for (int round = 0; round < 64 * world; ++round) {
    if (work <= 0) return;
    const int hot = static_cast<int>(std::max_element(load.begin(), load.end()) - load.begin());
    double best_peak = load[hot];
    int best_item = -1, best_other = -1, best_rank = -1;
    for (int i : p.items[hot]) {
      for (int r = 0; r < world; ++r) {
        if (r == hot) continue;
        work -= 1 + static_cast<int64_t>(p.items[r].size());
        // Move i to r.
        double peak = std::max(load[hot] - weights[i], load[r] + weights[i]);
        if (peak < best_peak && fits(r, bytes[i], 0)) {
          best_peak = peak, best_item = i, best_other = -1, best_rank = r;
        }
        // Swap i with j on r.
        for (int j : p.items[r]) {
          if (weights[j] >= weights[i]) continue;
          peak = std::max(load[hot] - weights[i] + weights[j], load[r] + weights[i] - weights[j]);
          if (peak < best_peak && fits(r, bytes[i], bytes[j]) && fits(hot, bytes[j], bytes[i])) {
            best_peak = peak, best_item = i, best_other = j, best_rank = r;
          }
        }
      }
    }
    if (best_item < 0 || best_peak >= load[hot] * (1.0 - 1e-12)) return;
    p.Unassign(best_item, weights[best_item], bytes[best_item]);
    p.Assign(best_item, best_rank, weights[best_item], bytes[best_item]);
    if (best_other >= 0) {
      p.Unassign(best_other, weights[best_other], bytes[best_other]);
      p.Assign(best_other, hot, weights[best_other], bytes[best_other]);
    }
  }
}

// The most parameters two ranks may hold together for SplitPairExactly (2^n subsets).
constexpr size_t kMaxPairItems = 14;

// Re-splits the parameters of the most loaded rank and of another rank (the first, by rank,
// where this helps and they hold at most kMaxPairItems together) the best way over every subset
// that keeps both ranks' bytes within `cap`, when that lowers the larger of the two loads. True
// when it changed `p`. Counts the subsets it looks at off `work`.
bool SplitPairExactly(const std::vector<double>& weights, const std::vector<int64_t>& bytes,
                      int64_t cap, Placement& p, int64_t& work) {
  const int world = p.layout.world_size;
  const int hot = static_cast<int>(std::max_element(p.load.begin(), p.load.end()) - p.load.begin());
  for (int r = 0; r < world; ++r) {
    if (r == hot || p.items[hot].size() + p.items[r].size() > kMaxPairItems) continue;
    std::vector<int> both = p.items[hot];
    both.insert(both.end(), p.items[r].begin(), p.items[r].end());
    work -= int64_t{1} << both.size();
    const double total = p.load[hot] + p.load[r];
    const int64_t total_bytes = p.bytes[hot] + p.bytes[r];
    double best_peak = p.load[hot] * (1.0 - 1e-12);
    uint32_t best_mask = 0;
    bool improved = false;
    for (uint32_t mask = 0; mask < (1u << both.size()); ++mask) {  // bit set: on `hot`
      double load = 0.0;
      int64_t size = 0;
      for (size_t b = 0; b < both.size(); ++b) {
        if (mask >> b & 1) load += weights[both[b]], size += bytes[both[b]];
      }
      const double peak = std::max(load, total - load);
      if (peak < best_peak && size <= cap && total_bytes - size <= cap) {
        best_peak = peak, best_mask = mask, improved = true;
      }
    }
    if (!improved) continue;
    for (size_t b = 0; b < both.size(); ++b) {
      const int param = both[b];
      p.Unassign(param, weights[param], bytes[param]);
      p.Assign(param, (best_mask >> b & 1) ? hot : r, weights[param], bytes[param]);
    }
    return true;
  }
  return false;
}

// The pairs and subsets one Improve looks at, at most (about a second at -O2), and all the
// Improves of one partition together: what bounds the time every rank spends on the partition
// of a session of many thousands of parameters. Counted, not timed, so that every rank computes
// the same layout.
constexpr int64_t kImproveWork = int64_t{1} << 26;
constexpr int64_t kPartitionWork = int64_t{1} << 28;

// Refine, then SplitPairExactly, while the latter lowers the peak, within kImproveWork and what
// is left of `budget` (which it counts down).
void Improve(const std::vector<double>& weights, const std::vector<int64_t>& bytes, int64_t cap,
             Placement& p, int64_t& budget) {
  const int64_t granted = std::min(budget, kImproveWork);
  int64_t work = granted;
  while (work > 0) {
    Refine(weights, bytes, cap, p, work);
    if (work <= 0 || !SplitPairExactly(weights, bytes, cap, p, work)) break;
  }
  budget -= granted - std::max<int64_t>(work, 0);
}

// Greedy placement in `order` by `weights` under `cap`, then Improved within `budget`; false
// when the greedy step fails.
bool Balance(const std::vector<int>& order, const std::vector<double>& weights,
             const std::vector<int64_t>& bytes, int64_t cap, Placement& out, int64_t& budget) {
  if (!PlaceGreedily(order, weights, bytes, cap, out)) return false;
  Improve(weights, bytes, cap, out, budget);
  return true;
}

std::vector<double> AsWeights(const std::vector<int64_t>& bytes) {
  return std::vector<double>(bytes.begin(), bytes.end());
}

// `layout` re-balanced on `costs` under `cap` within `budget`. REQUIRES: `layout` fits `cap`.
Placement Rebalanced(const Layout& layout, const std::vector<double>& costs,
                     const std::vector<int64_t>& bytes, int64_t cap, int64_t& budget) {
  Placement p(layout.world_size, costs.size());
  for (size_t i = 0; i < costs.size(); ++i) {
    p.Assign(static_cast<int>(i), layout.owner[i], costs[i], bytes[i]);
  }
  Improve(costs, bytes, cap, p, budget);
  return p;
}

int64_t PeakBytesOf(const Layout& layout, const std::vector<int64_t>& bytes) {
  std::vector<int64_t> load(layout.world_size, 0);
  for (size_t i = 0; i < bytes.size(); ++i) load[layout.owner[i]] += bytes[i];
  return *std::max_element(load.begin(), load.end());
}

// The inputs of PartitionWithinMemory, what does not depend on the cap, and the refinements'
// work left (kPartitionWork at the start: once spent, the placements are greedy only).
struct Problem {
  const std::vector<double>& costs;
  const std::vector<int64_t>& bytes;
  int world;
  std::vector<int> by_cost;   // descending cost
  std::vector<int> by_bytes;  // descending bytes
  Layout cost_first;          // PartitionByCost
  Layout least_bytes;         // balanced on bytes alone
  int64_t budget;

  Problem(const std::vector<double>& c, const std::vector<int64_t>& b, int world_size,
          Layout cost_only, int64_t work_left)
      : costs(c),
        bytes(b),
        world(world_size),
        by_cost(Descending(c)),
        by_bytes(Descending(AsWeights(b))),
        cost_first(std::move(cost_only)),
        budget(work_left) {
    Placement memory_only(world, c.size());
    Balance(by_bytes, AsWeights(b), b, kNoCap, memory_only, budget);
    least_bytes = std::move(memory_only.layout);
  }

  // The best placement under `cap`; false when none of the candidates fits.
  bool Solve(int64_t cap, Placement& best) {
    bool found = false;
    auto offer = [&](Placement&& p) {
      if (p.PeakBytes() > cap) return;
      const bool better = !found || p.PeakLoad() < best.PeakLoad() ||
                          (p.PeakLoad() == best.PeakLoad() && p.PeakBytes() < best.PeakBytes());
      if (better) best = std::move(p), found = true;
    };
    for (const std::vector<int>* order : {&by_cost, &by_bytes}) {
      Placement p(world, costs.size());
      if (Balance(*order, costs, bytes, cap, p, budget)) offer(std::move(p));
    }
    for (const Layout* start : {&cost_first, &least_bytes}) {
      if (PeakBytesOf(*start, bytes) <= cap) offer(Rebalanced(*start, costs, bytes, cap, budget));
    }
    return found;
  }
};

// One rank owns everything: no search (a session of 300,000 parameters on one rank would spend
// its creation deadline in the refinements).
Layout OneRank(size_t params) {
  Layout layout;
  layout.world_size = 1;
  layout.owner.assign(params, 0);
  return layout;
}

}  // namespace

namespace {

// PartitionByCost, its refinement counted off `budget`.
Layout PartitionByCost(const std::vector<double>& costs, int world_size, int64_t& budget) {
  if (world_size <= 1) return OneRank(costs.size());
  Placement p(world_size, costs.size());
  const std::vector<int64_t> no_bytes(costs.size(), 0);
  PlaceGreedily(Descending(costs), costs, no_bytes, kNoCap, p);
  int64_t work = std::min(budget, kImproveWork);
  const int64_t granted = work;
  Refine(costs, no_bytes, kNoCap, p, work);
  budget -= granted - std::max<int64_t>(work, 0);
  return std::move(p.layout);
}

}  // namespace

Layout PartitionByCost(const std::vector<double>& costs, int world_size) {
  int64_t budget = kPartitionWork;
  return PartitionByCost(costs, world_size, budget);
}

absl::StatusOr<Layout> PartitionWithinMemory(const std::vector<double>& costs,
                                             const std::vector<int64_t>& bytes, int world_size,
                                             int64_t max_rank_bytes) {
  int64_t budget = kPartitionWork;
  Layout cost_only = PartitionByCost(costs, world_size, budget);
  Problem problem(costs, bytes, world_size, std::move(cost_only), budget);
  Placement best(world_size, costs.size());
  if (problem.Solve(max_rank_bytes, best)) return std::move(best.layout);
  const absl::Status status = CheckOwnedBytes(problem.least_bytes, bytes, max_rank_bytes);
  return absl::ResourceExhaustedError(absl::StrCat(
      "no placement of ", costs.size(), " parameters over ", world_size, " ranks fits the cap of ",
      max_rank_bytes, " owned bytes per rank: the least peak found: ", status.message(),
      "; no placement's peak is below ",
      static_cast<int64_t>(std::ceil(PeakLowerBound(AsWeights(bytes), world_size)))));
}

Layout PartitionByCostAndMemory(const std::vector<double>& costs, const std::vector<int64_t>& bytes,
                                int world_size) {
  if (world_size <= 1) return OneRank(costs.size());
  int64_t budget = kPartitionWork;
  Layout cost_only = PartitionByCost(costs, world_size, budget);
  const double floor = PeakLowerBound(AsWeights(bytes), world_size);
  const int64_t unconstrained = PeakBytesOf(cost_only, bytes);
  if (unconstrained <= floor * (1.0 + kMemoryBalanceCostSlack)) return cost_only;
  Problem problem(costs, bytes, world_size, std::move(cost_only), budget);
  const std::vector<double> cost_loads = RankLoads(problem.cost_first, costs);
  const double cost_target =
      *std::max_element(cost_loads.begin(), cost_loads.end()) * (1.0 + kMemoryBalanceCostSlack);
  auto cap_at = [&](int k) {
    return static_cast<int64_t>(std::ceil(floor * std::pow(1.0 + kMemoryCapStep, k)));
  };
  // Bisection for the least k whose placement is within the cost target. At the first k whose
  // cap holds PartitionByCost's layout, its re-balance is within the target.
  int lo = 0, hi = 0;
  while (cap_at(hi) < unconstrained) ++hi;
  Placement best(world_size, costs.size());
  int best_k = -1;
  while (lo < hi) {
    const int mid = lo + (hi - lo) / 2;
    Placement p(world_size, costs.size());
    if (problem.Solve(cap_at(mid), p) && p.PeakLoad() <= cost_target) {
      best = std::move(p), best_k = mid, hi = mid;
    } else {
      lo = mid + 1;
    }
  }
  if (best_k == lo) return std::move(best.layout);
  if (problem.Solve(cap_at(lo), best) && best.PeakLoad() <= cost_target) {
    return std::move(best.layout);
  }
  return problem.cost_first;
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

std::vector<double> RankLoads(const Layout& layout, const std::vector<double>& weights) {
  std::vector<double> load(layout.world_size, 0.0);
  for (size_t p = 0; p < weights.size(); ++p) load[layout.owner[p]] += weights[p];
  return load;
}

double Imbalance(const Layout& layout, const std::vector<double>& weights) {
  const std::vector<double> load = RankLoads(layout, weights);
  const double total = std::accumulate(load.begin(), load.end(), 0.0);
  if (total == 0.0) return 1.0;
  return *std::max_element(load.begin(), load.end()) / (total / layout.world_size);
}

double PeakLowerBound(const std::vector<double>& weights, int world_size) {
  std::vector<double> sorted = weights;
  std::sort(sorted.begin(), sorted.end(), std::greater<double>());
  double peak = std::accumulate(sorted.begin(), sorted.end(), 0.0) / world_size;
  if (!sorted.empty()) peak = std::max(peak, sorted[0]);
  const size_t world = static_cast<size_t>(world_size);
  for (size_t m = 1; m * world + 1 <= sorted.size(); ++m) {
    const size_t top = m * world + 1;
    double smallest = 0.0;
    for (size_t i = top - (m + 1); i < top; ++i) smallest += sorted[i];
    peak = std::max(peak, smallest);
  }
  return peak;
}

absl::Status CheckOwnedBytes(const Layout& layout, const std::vector<int64_t>& bytes,
                             int64_t max_rank_bytes) {
  std::vector<int64_t> load(layout.world_size, 0);
  std::vector<int> count(layout.world_size, 0);
  for (size_t p = 0; p < bytes.size(); ++p) {
    load[layout.owner[p]] += bytes[p];
    ++count[layout.owner[p]];
  }
  for (int r = 0; r < layout.world_size; ++r) {
    if (load[r] <= max_rank_bytes) continue;
    return absl::ResourceExhaustedError(
        absl::StrCat("rank ", r, " owns ", load[r], " bytes of parameter state (", count[r],
                     count[r] == 1 ? " parameter" : " parameters", "); the cap is ", max_rank_bytes,
                     " bytes per rank"));
  }
  return absl::OkStatus();
}

}  // namespace optstep
