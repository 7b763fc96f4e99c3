#ifndef OPTSTEP_SERVER_ENGINE_LAYOUT_H_
#define OPTSTEP_SERVER_ENGINE_LAYOUT_H_

#include <cstdint>
#include <vector>

namespace optstep {

// Which rank owns which parameter (layer-wise partition: whole parameters).
struct Layout {
  int world_size = 1;
  std::vector<int> owner;  // owner[param_id]
};

// Longest-processing-time-first partition of parameters with the given step costs over
// `world_size` ranks: parameters in descending cost (ties by id) each go to the least-loaded rank
// (ties by rank). Deterministic for the same inputs.
// REQUIRES: world_size >= 1.
Layout PartitionByCost(const std::vector<double>& costs, int world_size);

}  // namespace optstep

#endif  // OPTSTEP_SERVER_ENGINE_LAYOUT_H_
