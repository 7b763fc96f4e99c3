#ifndef OPTSTEP_CHECKPOINT_PARTITION_H_
#define OPTSTEP_CHECKPOINT_PARTITION_H_

// Partitioners: the placement of whole parameters over ranks, used by the engine when it creates
// a session and by the offline split of a checkpoint. Pure functions.

#include <cstdint>
#include <vector>

#include "checkpoint/layout.h"

namespace optstep {

// Longest-processing-time-first partition of parameters with the given step costs over
// `world_size` ranks: parameters in descending cost (ties by id) each go to the least-loaded rank
// (ties by rank); then moves and swaps between the most loaded rank and the others while that
// lowers the peak. Deterministic for the same inputs.
// REQUIRES: world_size >= 1.
Layout PartitionByCost(const std::vector<double>& costs, int world_size);

// Megatron's layer-wise baseline (spec §6), for comparison only: parameters stable-sorted by
// element count ascending, owners in the ping-pong order 0, 1, …, D−1, D−1, …, 1, 0 (repeated).
// (The reference's separate counter for expert-parallel parameters is not modelled.)
Layout PartitionBaseline(const std::vector<int64_t>& numels, int world_size);

// max over ranks / mean over ranks of the summed `weights` (1 when all are zero).
double Imbalance(const Layout& layout, const std::vector<double>& weights);

}  // namespace optstep

#endif  // OPTSTEP_CHECKPOINT_PARTITION_H_
