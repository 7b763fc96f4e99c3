#ifndef OPTSTEP_SERVER_ENGINE_COST_MODEL_H_
#define OPTSTEP_SERVER_ENGINE_COST_MODEL_H_

#include <vector>

#include "absl/status/statusor.h"
#include "server/optim/optimizer_config.h"
#include "server/optim/param_info.h"

namespace optstep {

// The estimated step cost of every parameter under `chain` (routing of spec §4, then each
// group's Optimizer::EstimateStepCost): what the layer-wise partitioner balances.
// INVALID_ARGUMENT as RouteParameters / CreateOptimizer for invalid chains.
absl::StatusOr<std::vector<double>> EstimateStepCosts(const ChainConfig& chain,
                                                      const std::vector<ParamInfo>& params);

}  // namespace optstep

#endif  // OPTSTEP_SERVER_ENGINE_COST_MODEL_H_
