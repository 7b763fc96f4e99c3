#ifndef OPTSTEP_CHECKPOINT_PARTITION_H_
#define OPTSTEP_CHECKPOINT_PARTITION_H_

// Partitioners: the placement of whole parameters over ranks, used by the engine when it creates
// a session and by the offline split of a checkpoint. Pure functions, deterministic for the same
// inputs (every rank computes the same layout).
//
// Two loads per parameter: its estimated step cost, and its owned bytes (what the owner keeps of
// it alone: its fp32 master, optimizer state and gradient buffer). The peak of each over ranks
// bounds the step time and the model a group can hold (docs/design.md "Partition"). The
// refinements of one partition are bounded by a count of the candidates they look at (not by
// time, so that every rank derives the same layout): a session of many thousands of parameters
// is partitioned in well under a second.

#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "checkpoint/layout.h"

namespace optstep {

// Longest-processing-time-first partition of parameters with the given step costs over
// `world_size` ranks: parameters in descending cost (ties by id) each go to the least-loaded rank
// (ties by rank); then moves and swaps between the most loaded rank and the others while that
// lowers the peak. Memory is not considered.
// REQUIRES: world_size >= 1.
Layout PartitionByCost(const std::vector<double>& costs, int world_size);

// The least peak cost subject to every rank's owned bytes (the sum of `bytes` over the parameters
// it owns) being at most `max_rank_bytes`, by heuristics: the cost-first and the bytes-first
// greedy placements under the cap, the least-peak-memory placement, then constrained moves and
// swaps (as PartitionByCost's) that lower the peak cost; the layout of least peak cost (ties:
// least peak bytes) of those that fit. RESOURCE_EXHAUSTED when none fits, naming the rank, its
// bytes and the cap of the least-peak-memory layout, and the lower bound of any layout's peak.
// REQUIRES: world_size >= 1, costs.size() == bytes.size(), bytes[i] >= 0, and the sum of bytes
// at most 2^62 (sums are int64; EstimateOwnedBytes clamps).
absl::StatusOr<Layout> PartitionWithinMemory(const std::vector<double>& costs,
                                             const std::vector<int64_t>& bytes, int world_size,
                                             int64_t max_rank_bytes);

// The peak cost PartitionByCostAndMemory gives up (as a fraction of PartitionByCost's) to balance
// the owned bytes, and the step of its search over memory caps.
inline constexpr double kMemoryBalanceCostSlack = 0.05;
inline constexpr double kMemoryCapStep = 0.01;

// The engine's partition: PartitionByCost's layout when its peak owned bytes are within
// kMemoryBalanceCostSlack of PeakLowerBound(bytes); otherwise PartitionWithinMemory under the
// least cap of the grid PeakLowerBound(bytes) · (1 + kMemoryCapStep)^k (bisection over k) whose
// peak cost is within kMemoryBalanceCostSlack of PartitionByCost's.
// REQUIRES: as PartitionWithinMemory.
Layout PartitionByCostAndMemory(const std::vector<double>& costs, const std::vector<int64_t>& bytes,
                                int world_size);

// Megatron's layer-wise baseline (spec §6), for comparison only: parameters stable-sorted by
// element count ascending, owners in the ping-pong order 0, 1, …, D−1, D−1, …, 1, 0 (repeated).
// (The reference's separate counter for expert-parallel parameters is not modelled.)
Layout PartitionBaseline(const std::vector<int64_t>& numels, int world_size);

// The summed `weights` of each rank's parameters.
std::vector<double> RankLoads(const Layout& layout, const std::vector<double>& weights);

// max over ranks / mean over ranks of the summed `weights` (1 when all are zero).
double Imbalance(const Layout& layout, const std::vector<double>& weights);

// A lower bound of the peak load of any partition of `weights` over `world_size` ranks: the
// mean, the largest weight (the pigeonhole bound is the larger of these two), and for every m the
// m + 1 smallest of the m · world_size + 1 largest weights (some rank holds m + 1 of those).
// REQUIRES: world_size >= 1.
double PeakLowerBound(const std::vector<double>& weights, int world_size);

// OK when every rank's owned bytes are at most `max_rank_bytes`; otherwise RESOURCE_EXHAUSTED
// naming the first such rank: "rank R owns B bytes of parameter state (N parameters); the cap is
// C bytes per rank".
absl::Status CheckOwnedBytes(const Layout& layout, const std::vector<int64_t>& bytes,
                             int64_t max_rank_bytes);

}  // namespace optstep

#endif  // OPTSTEP_CHECKPOINT_PARTITION_H_
